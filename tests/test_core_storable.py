"""Text every store can hold, made so rather than refused (``tiered_memory.storable``): the one
function both adapters store a recorded message's text with, and the cleaning of model JSON."""

from __future__ import annotations

import pytest

from tiered_memory.storable import CUT_MARKER, clean_strings, storable_text

FAMILY = "\U0001F468\u200d\U0001F469\u200d\U0001F467"  # one character to a reader, five code points


@pytest.mark.parametrize(
    ("text", "limit", "stored", "changes"),
    [
        ("plain text", None, "plain text", []),
        ("x" * 99, 99, "x" * 99, []),  # at the limit: unchanged
        ("a\x00b", None, "ab", ["removed NUL characters"]),
        ("a\udcffb", None, "a?b", ["replaced lone surrogates"]),
        ("a\ud800b", 100, "a?b", ["replaced lone surrogates"]),
        ("\x00\udcff", None, "?", ["removed NUL characters", "replaced lone surrogates"]),
        ("\x00\x00", None, "", ["removed NUL characters"]),  # blank: the caller decides
        ("x" * 100, 99, "x" * (99 - len(CUT_MARKER)) + CUT_MARKER, ["cut from 100 to 99 characters"]),
        ("x" * 20, 10, "x" * 10, ["cut from 20 to 10 characters"]),  # no room for the marker
        # a cut never splits what a reader sees as one character (a family emoji is five code
        # points): the cluster it falls in goes whole
        ("x" * (97 - len(CUT_MARKER)) + FAMILY + "y" * 200, 99, "x" * (97 - len(CUT_MARKER)) + CUT_MARKER,
         [f"cut from {302 - len(CUT_MARKER)} to 99 characters"]),
        ("x" * 8 + FAMILY + "y" * 5, 10, "x" * 8, ["cut from 18 to 10 characters"]),  # no room for the marker
        # nor a letter and its accent
        ("e\u0301" * 40 + "abc", 70, "e\u0301" * ((70 - len(CUT_MARKER)) // 2) + CUT_MARKER,
         ["cut from 83 to 70 characters"]),
        # cleaned first, then cut: the limit is the cleaned text's
        ("\x00" * 5 + "x" * 10, 10, "x" * 10, ["removed NUL characters"]),
    ],
)
def test_storable_text_rules(text: str, limit: int | None, stored: str, changes: list[str]) -> None:
    out, why = storable_text(text, limit)
    assert (out, why) == (stored, changes)
    assert limit is None or len(out) <= limit
    assert storable_text(out, limit) == (out, [])  # what comes back, the core takes as it is


def test_clean_strings_cleans_keys_and_values_at_every_level() -> None:
    assert clean_strings({"a\x00": ["x\x00y", "\ud800z", 3]}) == {"a": ["xy", "?z", 3]}
    value = {"k": ["v", {"n": 1.5}]}
    assert clean_strings(value) == value


def test_the_renderer_cuts_with_the_same_marker() -> None:
    from tiered_memory.context import render

    assert render.CUT_MARKER is CUT_MARKER
