"""mypy --strict on the three packages, and async twins whose signatures a type checker sees."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


def test_strict_mypy_on_the_packages_then_on_a_probe_of_the_async_twins(tmp_path: Path,
                                                                         subtests: pytest.Subtests) -> None:
    """Both checks in one test, in this order, so that the second reads the cache (.mypy_cache)
    the first leaves. As two tests, ``make test``'s pytest-xdist could deal them to its two
    workers, and the probe then ran mypy cold over torch and transformers too (416 s on a loaded
    machine, against 12 s warm). Subtests: each check still passes or fails on its own."""
    with subtests.test("the three packages are clean under strict mypy"):
        _the_three_packages_are_clean_under_strict_mypy()
    with subtests.test("async twins keep their signatures"):
        _async_twins_keep_their_signatures(tmp_path)


def _the_three_packages_are_clean_under_strict_mypy() -> None:
    result = _mypy()  # the packages and --strict come from pyproject.toml
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "no issues found" in result.stdout


def _async_twins_keep_their_signatures(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tiered_memory import TieredMemory\n"
        "async def f(m: TieredMemory) -> None:\n"
        "    reveal_type(m.asearch)\n"
        "    reveal_type(await m.abuild_context('q', user_id='u', session_id='s'))\n"
        "    await m.asearch('q', user_id='u', k='ten')\n")
    # the options of pyproject.toml, so after the check above this reads its cache (.mypy_cache)
    # for the packages and checks only the probe: seconds, where a cold run takes over a minute
    result = _mypy("--strict", "--ignore-missing-imports", str(probe))
    out = result.stdout
    assert "def (query: str, *, user_id: str, k: int =" in out and "list[tiered_memory.types.MemoryHit]" in out, out
    assert "tiered_memory.context.render.MemoryContext" in out, out
    assert 'Argument "k"' in out and "incompatible type" in out, out  # a wrong argument is caught
