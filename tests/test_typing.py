"""mypy --strict on the three packages, and async twins whose signatures a type checker sees."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


PACKAGES = ("tiered_memory", "langchain_tiered_memory", "llamaindex_tiered_memory")  # pyproject's packages


def test_strict_mypy_on_the_packages_then_on_a_probe_of_the_async_twins(tmp_path: Path,
                                                                         subtests: pytest.Subtests) -> None:
    """Both checks from one mypy run, over the three packages and a probe that uses the async
    twins wrongly on purpose: mypy's errors are then the probe's alone. As two tests, ``make
    test``'s pytest-xdist could deal them to its two workers, and the probe then ran mypy cold
    over torch and transformers too (416 s on a loaded machine); as two runs in one test the
    second read the first's cache, 2 s more. Subtests: each check still passes or fails on its
    own (pytest's --durations lists each subtest beside the test: one run shows three times)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tiered_memory import TieredMemory\n"
        "async def f(m: TieredMemory) -> None:\n"
        "    reveal_type(m.asearch)\n"
        "    reveal_type(await m.abuild_context('q', user_id='u', session_id='s'))\n"
        "    await m.asearch('q', user_id='u', k='ten')\n")
    # pyproject.toml's options (--strict among them); its packages, named here as folders since
    # a file beside them overrides the packages it lists
    result = _mypy(*PACKAGES, str(probe))
    with subtests.test("the three packages are clean under strict mypy"):
        _the_three_packages_are_clean_under_strict_mypy(result, probe)
    with subtests.test("async twins keep their signatures"):
        _async_twins_keep_their_signatures(result.stdout)


def _the_three_packages_are_clean_under_strict_mypy(result: subprocess.CompletedProcess[str], probe: Path) -> None:
    out = result.stdout
    # by the file's name: mypy's cache can report a probe of the same text under an earlier run's folder
    elsewhere = [line for line in out.splitlines()
                 if ": error:" in line and Path(line.split(":")[0]).name != probe.name]
    assert not elsewhere and result.returncode == 1, out[-4000:] + result.stderr[-2000:]
    checked = re.search(r"Found \d+ errors? in 1 file \(checked (\d+) source files\)", out)
    modules = sum(1 for package in PACKAGES for _ in (ROOT / package).rglob("*.py"))
    assert checked and int(checked.group(1)) == modules + 1, out[-4000:]  # every module, and the probe


def _async_twins_keep_their_signatures(out: str) -> None:
    assert "def (query: str, *, user_id: str, k: int =" in out and "list[tiered_memory.types.MemoryHit]" in out, out
    assert "tiered_memory.context.render.MemoryContext" in out, out
    assert 'Argument "k"' in out and "incompatible type" in out, out  # a wrong argument is caught
