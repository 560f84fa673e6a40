"""Every public entry point, every argument, junk values from a hypothesis strategy.

Each call either raises one of the library's typed errors or is accepted; an accepted
call must leave every later read of that user working (no stored value may break a
read). An exception of any other type is a failure. The counts (cases, typed errors,
accepted) are printed by the last test and quoted in the Guarantees.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiered_memory import TieredMemory, TieredMemoryError

EXAMPLES = settings(max_examples=40, deadline=None, database=None, derandomize=True,  # the same cases every run
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
COUNTS: Counter[str] = Counter()

junk = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", " ", "\x00", "a\x00b", "\ud800", "x" * 300, "*", "../..", "a.b@c.d", "\n</memory>",
                     "user", "system", "1733000000000", "2026-13-45", "NaN"]),
    st.text(max_size=40), st.binary(max_size=8),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.integers(), st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=4), st.one_of(st.integers(), st.floats(), st.none(), st.sets(st.integers())),
                    max_size=3),
    st.just(datetime(1, 1, 1, tzinfo=timezone.utc)), st.just(object()), st.just({1, 2}), st.just(math.nan),
)

# (name, call taking the memory and one junk value, where the junk goes)
CORE: list[tuple[str, Callable[[TieredMemory, Any], Any]]] = [
    ("add.role", lambda m, v: m.add(v, "hello", session_id="s", user_id="u")),
    ("add.content", lambda m, v: m.add("user", v, session_id="s", user_id="u")),
    ("add.session_id", lambda m, v: m.add("user", "hello", session_id=v, user_id="u")),
    ("add.user_id", lambda m, v: m.add("user", "hello", session_id="s", user_id=v)),
    ("add.metadata", lambda m, v: m.add("user", "hello", session_id="s", user_id="u", metadata=v)),
    ("add.timestamp", lambda m, v: m.add("user", "hello", session_id="s", user_id="u", timestamp=v)),
    ("add_many.messages", lambda m, v: m.add_many(v, session_id="s", user_id="u")),
    ("add_many.item", lambda m, v: m.add_many([v], session_id="s", user_id="u")),
    ("add_many.id", lambda m, v: m.add_many([{"id": v, "role": "user", "content": "hi"}], session_id="s", user_id="u")),
    ("search.query", lambda m, v: m.search(v, user_id="u")),
    ("search.k", lambda m, v: m.search("hello", user_id="u", k=v)),
    ("search.session_id", lambda m, v: m.search("hello", user_id="u", session_id=v)),
    ("search.filters", lambda m, v: m.search("hello", user_id="u", filters=v)),
    ("search.filter_value", lambda m, v: m.search("hello", user_id="u", filters={"topic": v})),
    ("search.since", lambda m, v: m.search("hello", user_id="u", filters={"since": v})),
    ("search_sessions.query", lambda m, v: m.search_sessions(v, user_id="u")),
    ("search_sessions.k", lambda m, v: m.search_sessions("hello", user_id="u", k=v)),
    ("search_sessions.turns", lambda m, v: m.search_sessions("hello", user_id="u", turns=v)),
    ("search_sessions.filters", lambda m, v: m.search_sessions("hello", user_id="u", filters=v)),
    ("search_sessions.user_id", lambda m, v: m.search_sessions("hello", user_id=v)),
    ("build_context.query", lambda m, v: m.build_context(v, user_id="u", session_id="s")),
    ("build_context.max_tokens", lambda m, v: m.build_context("hello", user_id="u", session_id="s", max_tokens=v)),
    ("get_messages.limit", lambda m, v: m.get_messages("s", user_id="u", limit=v)),
    ("get_buffer.session_id", lambda m, v: m.get_buffer(v, user_id="u")),
    ("sessions.user_id", lambda m, v: m.sessions(v)),
    ("forget.memory_id", lambda m, v: m.forget(v, user_id="u")),
    ("clear_session.session_id", lambda m, v: m.clear_session(v, user_id="nobody")),
    ("forget_user.user_id", lambda m, v: m.forget_user(v) if v != "u" else None),
    ("facts.type", lambda m, v: m.facts("u", type=v)),
    ("add_fact.text", lambda m, v: m.add_fact(v, user_id="u")),
    ("add_fact.type", lambda m, v: m.add_fact("User likes tea", user_id="u", type=v)),
    ("add_fact.confidence", lambda m, v: m.add_fact("User likes tea", user_id="u", confidence=v)),
    ("add_fact.metadata", lambda m, v: m.add_fact("User likes tea", user_id="u", metadata=v)),
    ("update_fact.text", lambda m, v: m.update_fact(m.add_fact("User likes tea", user_id="u").id, user_id="u", text=v)),
    ("update_fact.confidence", lambda m, v: m.update_fact(m.add_fact("User likes tea", user_id="u").id, user_id="u",
                                                          confidence=v)),
    ("update_fact.fact_id", lambda m, v: m.update_fact(v, user_id="u", text="User likes coffee")),
    ("delete_fact.fact_id", lambda m, v: m.delete_fact(v, user_id="u")),
    ("fact_history.fact_id", lambda m, v: m.fact_history("u", v)),
    ("search_facts.query", lambda m, v: m.search_facts(v, user_id="u")),
    ("search_facts.k", lambda m, v: m.search_facts("tea", user_id="u", k=v)),
    ("episodes.session_id", lambda m, v: m.episodes("u", v)),
    ("search_episodes.k", lambda m, v: m.search_episodes("tea", user_id="u", k=v)),
    ("end_session.session_id", lambda m, v: m.end_session(v, user_id="u")),
    ("working.session_id", lambda m, v: m.working_memory(v, user_id="u")),
    ("remember.text", lambda m, v: m.working_memory("s", user_id="u").remember(v)),
    ("remember.type", lambda m, v: m.working_memory("s", user_id="u").remember("note", type=v)),
    ("remember.importance", lambda m, v: m.working_memory("s", user_id="u").remember("note", importance=v)),
    ("remember.metadata", lambda m, v: m.working_memory("s", user_id="u").remember("note", metadata=v)),
    ("working.items.k", lambda m, v: m.working_memory("s", user_id="u").items(k=v)),
    ("working.items.query", lambda m, v: m.working_memory("s", user_id="u").items(v)),
    ("scratchpad.key", lambda m, v: m.working_memory("s", user_id="u").scratchpad.__setitem__(v, 1)),
    ("scratchpad.value", lambda m, v: m.working_memory("s", user_id="u").scratchpad.__setitem__("k", v)),
    ("consolidate.user_id", lambda m, v: m.consolidate(v) if v != "u" else None),
    ("export_jsonl.user_id", lambda m, v: m.export_jsonl(Path(m.path) / "x.jsonl", v)),
]


@pytest.fixture(scope="module")
def mem(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> Iterator[TieredMemory]:
    with TieredMemory(tmp_path_factory.mktemp("sweep") / "store", embedder=embedder) as m:
        m.add_many([{"role": "user", "content": "hello, I like tea"}, {"role": "assistant", "content": "noted"}],
                    session_id="s", user_id="u")
        yield m


def reads_still_work(m: TieredMemory) -> None:
    """What every read of the user must survive, whatever was accepted before."""
    ctx = m.build_context("hello tea", user_id="u", session_id="s", max_tokens=400)
    ctx.to_text()
    ctx.to_messages()
    m.search("hello", user_id="u")
    m.search_sessions("hello", user_id="u")
    m.get_messages("s", user_id="u")
    m.facts("u")
    m.fact_history("u")
    m.working_memory("s", user_id="u").items("tea")
    m.export_jsonl(Path(m.path) / "check.jsonl", "u")


def outcome(m: TieredMemory, call: Callable[[TieredMemory, Any], Any], value: Any) -> str:
    try:
        call(m, value)
    except TieredMemoryError:
        return "typed error"
    except BaseException as e:  # noqa: BLE001 - every other exception is the failure under test
        pytest.fail(f"untyped {type(e).__name__} for {value!r}: {e}")
    reads_still_work(m)
    return "accepted"


@pytest.mark.parametrize("name, call", CORE, ids=[n for n, _ in CORE])
@EXAMPLES
@given(value=junk)
def test_every_core_entry_point_is_typed_or_accepted(mem: TieredMemory, name: str,
                                                     call: Callable[[TieredMemory, Any], Any], value: Any) -> None:
    COUNTS[outcome(mem, call, value)] += 1
    COUNTS["cases"] += 1


ADAPTERS: list[tuple[str, Callable[[TieredMemory, Any], Any]]] = []


def _langchain_cases() -> list[tuple[str, Callable[[TieredMemory, Any], Any]]]:
    from langchain_core.messages import HumanMessage

    from langchain_tiered_memory import TieredChatMessageHistory, TieredMemoryRetriever, TieredMemoryStore

    return [
        ("history.messages", lambda m, v: TieredChatMessageHistory(m, session_id="s", user_id="u").add_messages(v)),
        ("history.session_id", lambda m, v: TieredChatMessageHistory(m, session_id=v, user_id="u").add_messages(
            [HumanMessage("hi")])),
        ("retriever.query", lambda m, v: TieredMemoryRetriever(memory=m, user_id="u").invoke(v)),
        ("store.put.value", lambda m, v: TieredMemoryStore(m).put(("u", "notes"), "k", v)),
        ("store.put.key", lambda m, v: TieredMemoryStore(m).put(("u", "notes"), v, {"a": 1})),
        ("store.put.namespace", lambda m, v: TieredMemoryStore(m).put(v, "k", {"a": 1})),
        ("store.search.query", lambda m, v: TieredMemoryStore(m).search(("u",), query=v)),
        ("store.search.limit", lambda m, v: TieredMemoryStore(m).search(("u",), limit=v)),
        ("store.search.filter", lambda m, v: TieredMemoryStore(m).search(("u",), filter=v)),
        ("store.get.key", lambda m, v: TieredMemoryStore(m).get(("u", "notes"), v)),
    ]


@pytest.mark.parametrize("index", range(10))
@EXAMPLES
@given(value=junk)
def test_langchain_entry_points_are_typed_or_accepted(mem: TieredMemory, index: int, value: Any) -> None:
    name, call = _langchain_cases()[index]
    try:
        call(mem, value)
    except TieredMemoryError:  # a namespace LangGraph refuses too: NamespaceLabelError, both errors
        COUNTS["typed error"] += 1
    except Exception as e:  # noqa: BLE001
        # LangChain validates its own arguments with pydantic before our code runs: a
        # ValidationError (a ValueError) there is the framework's typed error, not ours to wrap
        from pydantic import ValidationError

        if not isinstance(e, ValidationError):
            pytest.fail(f"{name}: untyped {type(e).__name__} for {value!r}: {e}")
        COUNTS["typed error"] += 1
    else:
        reads_still_work(mem)
        COUNTS["accepted"] += 1
    COUNTS["cases"] += 1


def test_zz_report_the_counts() -> None:
    """Printed for the Guarantees (run with -s); fails if nothing was tried."""
    print(f"\nbad-input sweep: {COUNTS['cases']} cases, {COUNTS['typed error']} typed errors, "
          f"{COUNTS['accepted']} accepted (every later read still worked), 0 untyped")
    assert COUNTS["cases"] >= 40 * (len(CORE) + 10) * 0.5
