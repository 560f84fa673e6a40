"""Every ```python block of README.md runs, in a fresh interpreter, offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def test_readme_has_python_blocks() -> None:
    assert len(blocks()) >= 5


@pytest.mark.parametrize("index", range(len(blocks())))
def test_readme_block_runs(index: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    code = blocks()[index]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TIERED_MEMORY_HOME=str(tmp_path / "home"),
               PYTHONPATH=str(README.parent))
    if "TIERED_MEMORY_RECORD_STORE" in code:  # the "Running at scale" block needs the servers
        servers = request.getfixturevalue("scale_env")
        env.update(servers)
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"README block {index} failed:\n{code}\n{result.stderr[-3000:]}"


def section(text: str, heading: str) -> str:
    """The README's ``## heading`` section, up to the next ``## `` heading (or the end)."""
    start = text.index(f"\n{heading}\n") + 1
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end == -1 else text[start:end + 1]


@pytest.mark.parametrize(("heading", "doc"), [("## Running at scale", "running_at_scale.md"),
                                              ("## Guarantees", "guarantees.md")])
def test_readme_section_is_its_docs_page(heading: str, doc: str) -> None:
    """docs/running_at_scale.md and docs/guarantees.md are the README's sections, so a link to
    either says what the README says (the two copies had drifted apart, each missing promises
    the other made)."""
    page = (README.parent / "docs" / doc).read_text(encoding="utf-8")
    assert section(README.read_text(encoding="utf-8"), heading).strip() == page.strip()
