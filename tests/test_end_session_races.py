"""A deletion that finishes while ``end_session`` (or ``consolidate``) works between reading the
turns and writing what it drew from them: nothing drawn from the deleted turns is written after.

``end_session`` reads the session's turns, asks the model (or the rules), then stores facts and an
episode. It holds no lock of the user's meanwhile (a model call may take minutes), so a
``forget_user`` or a ``forget`` may finish in between: what it then wrote quoted turns already
gone ("my bank PIN is 4921" outlived the user's deletion). The call is held at that point by the
scripted model (or, with no model, by the embedder) while the deletion runs in this thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, NamedTuple

import pytest

from tiered_memory import ConsolidationConfig, Embedder, MemoryConfig, StaticEmbedder, TieredMemory
from tiered_memory.errors import NotFoundError
from tiered_memory.testing import HeldEmbedder, ScriptedLLM

from test_pgvector import database, open_pg  # noqa: F401 (fixtures)

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

PIN = "My bank PIN is 4921."
HOME = "I live in Lisbon."


class HeldModel:
    """A scripted model whose episode answer waits (once) until released; its answers say what
    the transcript it reads says, as a model's would."""

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.llm = ScriptedLLM(by_task={}, default=self._answer)

    def _answer(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        lines = messages[-1]["content"].splitlines()
        said = {n: t for n, line in enumerate(lines, 1) for t in (HOME, PIN) if t in line}  # [n] as numbered
        if messages[0]["content"].startswith("Task: facts"):
            texts = {PIN: "User's bank PIN is 4921", HOME: "User lives in Lisbon"}
            return {"facts": [{"type": "fact", "text": texts[t], "confidence": 0.9, "sources": [n]}
                              for n, t in said.items()]}
        if not self.entered.is_set():  # held once, between the read and the writes
            self.entered.set()
            assert self.released.wait(60), "the test never released the model"
        return {"summary": "The user said: " + " ".join(said.values()), "entities": [], "decisions": [],
                "open_questions": [], "key_facts": list(said.values())}


def _start(memory: TieredMemory, turns: list[str]) -> list[str]:
    return memory.add_many([{"role": "user", "content": t} for t in turns], session_id="s", user_id="u")


def _everything(memory: TieredMemory, user: str = "u") -> str:
    """Every text the user's facts and episodes hold."""
    return " ".join([f.text for f in memory.facts(user)] + [
        " ".join([e.summary, *e.key_facts, *e.entities]) for e in memory.episodes(user)])


class Held(NamedTuple):
    memory: TieredMemory
    hold: Callable[[], None]  # from now on, the next end_session stops before it writes
    entered: threading.Event  # set once it stopped there
    release: Callable[[], None]  # lets it go on


@pytest.fixture(params=["model", "rules"])
def held(request: pytest.FixtureRequest, make_memory: Callable[..., TieredMemory], embedder: Embedder) -> Held:
    """A memory whose end_session can be stopped between reading the turns and writing: with a
    model, in its episode call; with none, at its first embedding after the read."""
    if request.param == "model":
        model = HeldModel()
        return Held(make_memory("model", llm=model.llm), lambda: None, model.entered, model.released.set)
    held_embedder = HeldEmbedder(embedder)
    return Held(make_memory("rules", embedder=held_embedder), held_embedder.hold, held_embedder.entered,
                held_embedder.release)


@pytest.mark.parametrize("deletion", ["forget_user", "clear_session"])
def test_a_deletion_during_end_session_leaves_nothing_drawn_from_the_turns(held: Held, deletion: str) -> None:
    memory, hold, entered, release = held
    _start(memory, [HOME, PIN])
    hold()
    with ThreadPoolExecutor(1) as pool:
        ending = pool.submit(memory.end_session, "s", user_id="u")
        assert entered.wait(60), "end_session never reached the hold"
        assert (memory.forget_user("u") if deletion == "forget_user" else memory.clear_session("s", user_id="u")) == 2
        release()
        with pytest.raises(NotFoundError, match="has no messages"):  # as for a session never written
            ending.result(60)
    assert (memory.facts("u"), memory.episodes("u"), memory.index.ids("u")) == ([], [], set())


def test_forget_during_end_session_leaves_the_turn_out_of_what_it_writes(
        held: Held) -> None:
    memory, hold, entered, release = held
    home, pin = _start(memory, [HOME, PIN])
    hold()
    with ThreadPoolExecutor(1) as pool:
        ending = pool.submit(memory.end_session, "s", user_id="u")
        assert entered.wait(60), "end_session never reached the hold"
        memory.forget(pin, user_id="u")
        release()
        episode = ending.result(60)
    assert episode.source_ids == [home] and [e.id for e in memory.episodes("u")] == [episode.id]
    assert "Lisbon" in _everything(memory) and "4921" not in _everything(memory)
    assert [f.text for f in memory.facts("u")] == ["User lives in Lisbon"]


def test_forget_user_during_consolidate_promotes_nothing_of_theirs(
        make_memory: Callable[..., TieredMemory], embedder: Embedder) -> None:
    """Promotion reads the episode, then stores facts drawn from it: a forget_user that finished
    in between left them stored. Held at promotion's first embedding (after its reads); where the
    fix makes that embedding wait under the user's lock, forget_user waits for it instead: the
    release comes once forget_user returned, or after a bounded wait (no assertion on time)."""
    held_embedder = HeldEmbedder(embedder)
    memory = make_memory(embedder=held_embedder,
                         config=MemoryConfig(consolidation=ConsolidationConfig(promote_access_count=0)))
    _start(memory, [HOME, PIN])
    memory.end_session("s", user_id="u")
    for fact in memory.facts("u"):  # what promotion would find known: the episode is its only source
        memory.delete_fact(fact.id, user_id="u")
    held_embedder.hold()
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(memory.consolidate, "u")
        assert held_embedder.entered.wait(60), "consolidate never embedded"
        forgetting = pool.submit(memory.forget_user, "u")
        wait([forgetting], timeout=1.0)
        held_embedder.release()
        forgetting.result(60)
        running.result(60)
    assert (memory.facts("u"), memory.episodes("u"), memory.index.ids("u")) == ([], [], set())


@pytest.mark.servers
@pytest.mark.parametrize("kind", ["model", "rules"])
def test_forget_user_during_end_session_leaves_nothing_with_pgvector(
        open_pg: Callable[..., TieredMemory], kind: str) -> None:
    """The same with rows and vectors in one engine (forget_user one transaction under the lock)."""
    model, held_embedder = HeldModel(), HeldEmbedder(StaticEmbedder())
    if kind == "model":
        memory, entered, release = open_pg(llm=model.llm), model.entered, model.released.set
    else:
        memory, entered, release = open_pg(embedder=held_embedder), held_embedder.entered, held_embedder.release
    _start(memory, [HOME, PIN])
    if kind == "rules":
        held_embedder.hold()
    with ThreadPoolExecutor(1) as pool:
        ending = pool.submit(memory.end_session, "s", user_id="u")
        assert entered.wait(60), "end_session never reached the hold"
        assert memory.forget_user("u") == 2
        release()
        with pytest.raises(NotFoundError, match="has no messages"):
            ending.result(60)
    assert (memory.facts("u"), memory.episodes("u"), memory.index.ids("u")) == ([], [], set())
