"""Every docs/snippets/langchain_*.py runs offline, and its model saw the recalled memory."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any, Iterator

import pytest
from langchain_core.tracers.context import collect_runs
from langchain_core.tracers.schemas import Run

from tiered_memory import SentenceTransformerEmbedder, TieredMemory

SNIPPETS = Path(__file__).resolve().parent.parent / "docs" / "snippets"

# (snippet, user, the text its last model call must have seen, the answer it prints)
CASES = [
    ("langchain_classic_memory.py", "ana", "I live in Lisbon", "In Lisbon."),
    ("langchain_history.py", "bo", "Hello, I'm Bo.", "Your name is Bo."),
    ("langchain_agent.py", "cy", "I'm vegetarian.", "You're vegetarian."),
    ("langchain_runnable.py", "dee", "I'm allergic to peanuts.", "Try apple slices; no peanuts."),
]


def _model_runs(runs: list[Run]) -> Iterator[Run]:
    for run in runs:
        if run.run_type in ("llm", "chat_model"):
            yield run
        yield from _model_runs(run.child_runs)


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a run's inputs (prompts, message contents)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif hasattr(value, "content"):
        yield from _strings(value.content)


def test_every_snippet_is_covered() -> None:
    assert sorted(p.name for p in SNIPPETS.glob("langchain_*.py")) == sorted(c[0] for c in CASES)


@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
@pytest.mark.parametrize(("name", "user", "recalled", "answer"), CASES)
def test_snippet_runs(name: str, user: str, recalled: str, answer: str, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch, embedder: SentenceTransformerEmbedder) -> None:
    monkeypatch.chdir(tmp_path)
    with collect_runs() as cb:
        scope: dict[str, Any] = runpy.run_path(str(SNIPPETS / name), run_name="__main__")
    assert scope["answer"] == answer
    calls = sorted(_model_runs(cb.traced_runs), key=lambda r: r.start_time)
    assert len(calls) >= 2
    assert recalled in "\n".join(_strings(calls[-1].inputs))  # the last model call saw the earlier turn
    with TieredMemory(tmp_path / "memory", embedder=embedder) as memory:
        assert memory.stats().messages == 4
        assert any(recalled in m.content for m in memory.store.iter_messages(user))
