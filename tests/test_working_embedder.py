"""Working-memory items and the embedder that made their vectors: an open with another embedder
re-embeds them with the turns, facts and episodes, so a query ranks them by the new model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiered_memory import StaticEmbedder, TieredMemory

T = 1_800_000_000.0  # one fixed time: the scores compared below decay alike
QUERY = "why does the payment webhook fail?"
NOTES = ("User is debugging the Stripe payment webhook", "User prefers short answers")


class Mirrored:
    """The static embedder's vectors negated: another model of the same dimension, as a 384-dim
    model swapped for another is (an application's own embedder, with its own name)."""

    name = "mirrored-static"

    def __init__(self) -> None:
        self.inner = StaticEmbedder()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[-x for x in v] for v in self.inner.embed_documents(texts)]

    def embed_query(self, text: str) -> list[float]:
        return [-x for x in self.inner.embed_query(text)]


def _remember(memory: TieredMemory) -> None:
    wm = memory.working_memory("s", user_id="u")
    for text in NOTES:
        wm.remember(text, importance=0.5, now=T)


def _ranked(memory: TieredMemory) -> list[tuple[str, float]]:
    return [(i.text, i.score or 0.0) for i in memory.working_memory("s", user_id="u").items(QUERY, now=T)]


def test_an_embedder_of_the_same_dimension_re_embeds_the_working_items_at_open(tmp_path: Path) -> None:
    """Items kept the vectors of the embedder that remembered them: opened with another of the
    same dimension, a query's vector was compared with the old model's (the webhook note, the
    relevant one, scored 0 relevance and ranked last) until the items faded. The open that
    re-embeds the turns, facts and episodes re-embeds them too: they rank as a session the new
    embedder remembered does."""
    with TieredMemory(tmp_path / "old", embedder=StaticEmbedder()) as memory:
        _remember(memory)
    with TieredMemory(tmp_path / "old", embedder=Mirrored()) as memory:
        switched = _ranked(memory)
    with TieredMemory(tmp_path / "new", embedder=Mirrored()) as memory:
        _remember(memory)
        expected = _ranked(memory)
    assert switched[0][0] == NOTES[0]
    assert [t for t, _ in switched] == [t for t, _ in expected]
    assert [s for _, s in switched] == pytest.approx([s for _, s in expected])


def test_rebuild_index_re_embeds_the_working_items_too(tmp_path: Path) -> None:
    """rebuild_index derives every vector again from the records, working items' too (how a
    shared store's embedder change is re-embedded, from one process), and reports how many."""
    with TieredMemory(tmp_path / "m", embedder=Mirrored()) as memory:
        _remember(memory)
        before = _ranked(memory)
        assert memory.rebuild_index()["working_items"] == 2
        assert _ranked(memory) == before
