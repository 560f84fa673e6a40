"""Stored text as it reaches a model: quoted, one line, inert (pure).

Every place that hands stored text to a model (the rendered memory, the layers' own LLM
prompts, the LangChain replay and string forms) quotes it with :func:`quote` and shows a
stored role or label with :func:`label_text`. Invariant: a quoted text is one line that no
line splitting can break, and it can neither close our tags nor spell a chat template's
special tokens; a label holds no character that could start a line or close a quote. Both hold
of the text as a normalizing tokenizer reads it too (compatibility look-alikes folded, controls,
format characters and combining marks dropped).
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from typing import Any, Callable, Sequence

# Characters that json.dumps(ensure_ascii=False) leaves raw but that str.splitlines(), many
# tokenizers and editors treat as line breaks (NEL, C1 controls, LINE/PARAGRAPH SEPARATOR).
LINE_BREAK_ESCAPES = {c: f"\\u{c:04x}" for c in [*range(0x7F, 0xA0), 0x2028, 0x2029]}

# ``<`` and ``>``, and the characters Unicode compatibility normalization folds into them (their
# fullwidth and small forms, and ``≮`` ``≯``: ``<`` ``>`` and a combining stroke under NFKD); and
# the ones it folds into ``"`` or ``\\`` (fullwidth, small). A Hugging Face tokenizer whose normalizer
# applies NFKC or NFKD hands the model the folded text, where a raw ``＂`` would end a quote, ``＼``
# escape its real end and ``﹤/memory﹥`` close our block (tests/test_injection.py finds every one).
_ANGLES = {c: f"\\u{c:04x}" for c in (0x3C, 0x3E, 0x226E, 0x226F, 0xFE64, 0xFE65, 0xFF1C, 0xFF1E)}
_QUOTE_ESCAPES = {**LINE_BREAK_ESCAPES, **{c: f"\\u{c:04x}" for c in (0xFE68, 0xFF02, 0xFF3C)}}


def json_line(text: str) -> str:
    """``text`` as one JSON string literal that no line splitting can break, and that no look-alike
    of ``"`` or ``\\`` ends early once a tokenizer folds it: a stored text quoted so can never start
    a line of its own (a prompt's or a rendered memory's)."""
    return json.dumps(text, ensure_ascii=False).translate(_QUOTE_ESCAPES)


# Mistral's chat templates mark turns with bracketed tokens ([INST], [/INST], [SYSTEM_PROMPT],
# [TOOL_CALLS]...), parsed out of the text as <|im_start|> is: the bracket that opens one
_BRACKET_TOKEN = re.compile(r"\[(?=/?[A-Z][A-Z_]+\])")


def escape_special(text: str) -> str:
    """``text`` with ``<``, ``>``, the ``[`` of a bracketed upper-case token and the first
    character of every other turn marker :func:`defuse_tokens` knows (``[|system|]``, ``]~b]``)
    written as JSON escapes: no chat template's special token (``<|im_start|>``, ``[INST]``) and
    none of our tags can be spelt in it, nor in its NFKC or NFKD fold (what a normalizing
    tokenizer reads): the compatibility look-alikes of ``<`` and ``>`` are escaped too, and a
    bracketed token spelt with look-alikes (``［PREFIX］``) loses its bracket as ``[PREFIX]`` does."""
    text = text.translate(_ANGLES)
    return _escaped_at(text, sorted(_starts(_SPECIAL, text)))


def quote(text: str) -> str:
    """Stored text as it reaches a model, in the rendered memory and in the layers' LLM
    prompts alike: one :func:`json_line` with :func:`escape_special` applied, so it can
    neither close our tags nor spell a chat template's special tokens (``<|im_start|>``,
    ``[INST]``), which a local model's server parses in the text it tokenizes. It stays a
    JSON literal of the text stored, and folded by a normalizing tokenizer (NFKC, NFKD), one of
    the folded text."""
    return escape_special(json_line(text))


# What a replayed turn may not spell: the opening character of a chat template's turn marker.
# ``<|...|>`` (ChatML, Llama 3, Harmony, Phi, Granite, GLM, Kimi, Gemma 4's openers) and
# DeepSeek's ``<｜...｜>``; Gemma 4's closers (``<turn|>``, ``<tool_response|>``); Llama 2's
# ``<s>``, ``</s>`` and ``<<SYS>>``; Gemma's turn, sequence and FunctionGemma's call tokens;
# Command R's ``<BOS_TOKEN>``; Qwen's added tool and thinking tokens; Seed-OSS's ``<seed:...>``
# and MiniMax's ``<minimax:tool_call>``; Nemotron Nano 2's ``<SPECIAL_11>``, ``<TOOLCALL>``;
# Baichuan's ``<reserved_102>``, Nemotron-Mini's ``<extra_id_1>``, MiniCPM's ``<用户>`` and
# ``<AI>``, Ling's ``<role>HUMAN</role>``, SmolVLM's ``<end_of_utterance>``;
# MiniMax-Text-01's and M1's ``<beginning_of_sentence>``, ``<end_of_sentence>`` and
# ``<begin_of_document>``; TeleChat 2's ``<_system>``, ``<_user>``, ``<_bot>``, ``<_end>``;
# Mistral's bracketed control tokens; EXAONE's ``[|system|]``; PanGu's ``[unused9]``;
# InternLM2's ``[UNUSED_TOKEN_146]`` (its ``<|im_start|>``); MiniMax M2's ``]~b]``, ``[e~[``.
# Other tags and brackets (``<b>``, ``<T>``, ``<role>a writer</role>``, ``[1]``, ``[TODO]``,
# ``[| 1; 2 |]``) are left as written: a replay shows the conversation as it was.
_TURN_MARKER = re.compile(
    r"<(?=[|\uff5c]|\w+\|>|/?s>|<?/?SYS>>|(?:start|end)_(?:of_turn|function_[a-z]+)>"
    r"|(?:bos|eos|pad|unk|BOS_TOKEN|EOS_TOKEN|SPECIAL_\d+)>|/?(?:tool_call|tool_response|tools|think)>"
    r"|/?(?:TOOLCALL|TOOL_RESPONSE)>|/?(?:seed|minimax):|(?:reserved|extra_id)_\d+>|用户>|AI>"
    r"|role>[A-Z]+</role>|end_of_utterance>|(?:begin|beginning|end)_of_(?:sentence|document)>"
    r"|_(?:system|user|bot|end)>)"
    r"|\[(?=/?(?:INST|SYSTEM_PROMPT|MODEL_SETTINGS|TOOL_[A-Z]+|AVAILABLE_TOOLS|THINK|ARGS|CALL_ID"
    r"|IMG(?:_[A-Z]+)?)\]|\|[a-z]+\|\]|e~\[|unused\d+\]|UNUSED_TOKEN_\d+\])"
    r"|\](?=~!?b[\[\]])")


_SPECIAL = re.compile(f"{_TURN_MARKER.pattern}|{_BRACKET_TOKEN.pattern}")  # what escape_special escapes
# What a marker starts with (``<``, ``[``, ``]``) and every character whose compatibility form
# holds one: a text with none of them spells no marker however a tokenizer folds it.
_ANCHORS = re.compile("[<\\[\\]\u226e\ufe47\ufe48\ufe64\uff1c\uff3b\uff3d]")
# Characters a tokenizer's normalizer may drop before it matches its added tokens: BERT's cleaning
# drops controls, format characters (zero-width joiners, bidi overrides, soft hyphens, tags, a BOM)
# and private use; accent stripping drops combining marks.
_DROPPED = frozenset({"Cc", "Cf", "Co", "Mn", "Mc", "Me"})


@functools.lru_cache(maxsize=1 << 16)
def _fold(c: str) -> str:
    """``c`` as a normalizing tokenizer may read it: its NFKD (which decomposes every compatibility
    look-alike NFKC folds, and ``≮`` into ``<`` and a mark) without the characters of
    :data:`_DROPPED` (tab and line breaks stay)."""
    if " " <= c <= "~" or c in "\t\n\r":
        return c
    return "".join(d for d in unicodedata.normalize("NFKD", c) if unicodedata.category(d) not in _DROPPED
                   and d != "\ufffd")


def _starts(pattern: re.Pattern[str], text: str) -> set[int]:
    """Where in ``text`` a match of ``pattern`` starts, in ``text`` or in its fold (each character
    as :func:`_fold` reads it: the character the fold's match starts from)."""
    starts = {m.start() for m in pattern.finditer(text)}
    if _ANCHORS.search(text):
        table = {ord(c): f for c in set(text) if (f := _fold(c)) != c}  # the few characters that fold
        found = [m.start() for m in pattern.finditer(text.translate(table))] if table else []
        if found:  # where each character of the fold comes from, only for a text that spells one
            origin = [i for i, c in enumerate(text) for _ in table.get(ord(c), c)]
            starts.update(origin[at] for at in found)
    return starts


def defuse_tokens(text: str) -> str:
    """``text`` with the first character of each chat-template turn marker in it written as
    a JSON escape, as :func:`quote` writes it (``<|im_start|>`` -> ``\\u003c|im_start|>``,
    ``[INST]`` -> ``\\u005bINST]``), and otherwise as it is (pure, idempotent).

    For stored turns replayed as turns of their own role, unquoted: a local model's server
    renders them through its chat template and tokenizes the prompt with special tokens
    parsed, so a marker spelt in a stored turn would open a real (system) turn there. A
    marker spelt with compatibility look-alikes (``＜|im_start|＞``, ``［INST］``) counts too:
    a Hugging Face tokenizer matches its ``normalized`` added tokens in the text after its
    normalizer, and NFKC folds those into the marker. So does one with characters a normalizer
    drops inside (``<\\u200d|im_start|>``: BERT's cleaning drops controls and zero-width, bidi and
    other format characters, accent stripping drops combining marks): see :func:`_fold`."""
    return defuse_pieces([text])[0]


def defuse_pieces(pieces: Sequence[str]) -> list[str]:
    """``pieces`` (the text parts of one message, in order) with each turn marker that their
    concatenation spells defused as :func:`defuse_tokens` defuses it, in the piece where the
    marker starts (pure). A chat template renders a message's text blocks one after the other
    with nothing between them, so ``["<", "|im_start|>"]`` is a marker there though neither
    piece alone is one."""
    text = "".join(pieces)
    places = sorted(_starts(_TURN_MARKER, text))
    out: list[str] = []
    offset = n = 0
    for piece in pieces:  # one pass over the places, which are in order (many pieces, many markers)
        end = n
        while end < len(places) and places[end] < offset + len(piece):
            end += 1
        out.append(_escaped_at(piece, [i - offset for i in places[n:end]]))
        offset, n = offset + len(piece), end
    return out


def _escaped_at(text: str, places: Sequence[int]) -> str:
    """``text`` with the character at each of ``places`` (ascending) written as a JSON escape."""
    parts: list[str] = []
    end = 0
    for i in places:
        parts += [text[end:i], f"\\u{ord(text[i]):04x}"]
        end = i + 1
    return "".join(parts) + text[end:]


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` (decoded JSON) with ``fn`` applied to every string in it, keys included (pure)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in value.items()}
    return value


_UNSAFE_LABEL = re.compile(r"[^\w .:/+-]")


def label_text(value: str | None) -> str:
    """A role or label as it may appear unquoted beside stored text (a rendered item's head,
    a prompt's ``[n] role:``): word characters, spaces and ``.:/+-`` only, at most 40
    characters. Labels are stored data too (a row written by other code may hold any role),
    so nothing in them may start a line, close a quote or a section."""
    if not value:
        return ""
    return " ".join(_UNSAFE_LABEL.sub("", str(value)).split())[:40]
