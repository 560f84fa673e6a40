"""What ``pip install`` gets: the wheel and the sdist, built by the project's own build backend
(setuptools, no network) from a copy of the source tree.

The wheel holds every module and every data file of the three packages (the static embedder's
table, its tokenizer, the demo's sample), each package's ``py.typed`` and the console script,
and nothing else; the sdist holds what builds that same wheel, and no half of the test suite.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tiered_memory", "langchain_tiered_memory", "llamaindex_tiered_memory")
LEFT_OUT = ("__pycache__", "*.pyc", ".venv*", ".git", ".llm", "build", "dist", "*.egg-info", ".pytest_cache",
            ".hypothesis", ".mypy_cache", "results", ".ipynb_checkpoints")


def _build(hook: str, source: Path, out: Path, *args: str) -> Path:
    """Run one PEP 517 hook of the project's backend in ``source``; the path of what it built."""
    code = (
        "import sys\n"
        "from setuptools import build_meta\n"
        f"print(build_meta.{hook}(*sys.argv[1:]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(out), *args], cwd=source, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """The file lists of the wheel built from the source, of the sdist, and of the wheel built
    from the unpacked sdist (what pip does with the sdist)."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFT_OUT), symlinks=True)
    wheel = _build("build_wheel", source, tmp / "wheel")
    sdist = _build("build_sdist", source, tmp / "sdist")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
        sdist_names = [m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()]
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel_of_sdist = _build("build_wheel", unpacked, tmp / "wheel-of-sdist")
    return {
        "wheel": sorted(zipfile.ZipFile(wheel).namelist()),
        "sdist": sorted(sdist_names),
        "wheel_of_sdist": sorted(zipfile.ZipFile(wheel_of_sdist).namelist()),
        "entry_points": [zipfile.ZipFile(wheel).read(n).decode() for n in zipfile.ZipFile(wheel).namelist()
                         if n.endswith(".dist-info/entry_points.txt")],
    }


def _package_files() -> list[str]:
    """Every file of the three packages in the source tree (modules, data, py.typed)."""
    return sorted(
        p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def test_the_wheel_holds_every_file_of_the_packages_and_nothing_else(built):
    files = [n for n in built["wheel"] if ".dist-info/" not in n]
    assert files == _package_files()
    for data in ("tiered_memory/embedding/data/static-minilm.npz", "tiered_memory/embedding/data/tokenizer.json",
                 "tiered_memory/data/sample_conversation.json"):
        assert data in files
    assert all(f"{pkg}/py.typed" in files for pkg in PACKAGES)


def test_the_wheel_declares_the_console_script_and_the_adapters(built):
    (entry_points,) = built["entry_points"]
    assert "tiered-memory = tiered_memory.cli:main" in entry_points
    assert "langchain_core = langchain_tiered_memory.llm:adapt" in entry_points
    assert "llama_index = llamaindex_tiered_memory.llm:adapt" in entry_points


def test_the_sdist_builds_the_same_wheel_and_ships_no_half_test_suite(built):
    assert built["wheel_of_sdist"] == built["wheel"]
    assert {"pyproject.toml", "README.md", "LICENSE"} <= set(built["sdist"])
    assert set(_package_files()) <= set(built["sdist"])
    # the suite needs its conftest, helpers, data, bench/ and the LLM server: in part it cannot run
    stray = [n for n in built["sdist"] if n.split("/")[0] in ("tests", "bench", "scripts", "notebooks", ".ci")]
    assert stray == []
