"""The examples in the packages' docstrings run: each ``>>>`` line not marked
``# doctest: +SKIP`` is executed and its shown output compared, so an example a change made
stale (or an edit garbled) fails here instead of misleading the reader of ``help()``."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest
from extras import import_extra

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tiered_memory", "langchain_tiered_memory", "llamaindex_tiered_memory")


def modules_with_examples() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_the_scan_finds_the_examples() -> None:
    assert {"tiered_memory.memory", "langchain_tiered_memory.embeddings", "llamaindex_tiered_memory.block"} \
        <= set(modules_with_examples())


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # an example that writes a file writes it here
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "home"))
    # the core imports everywhere; an adapter only where its extra is installed (extras.py)
    module = importlib.import_module(name) if name.startswith("tiered_memory") else import_extra(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (see the output above)"
