"""Every notebook runs top to bottom on the current virtualenv's kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def test_notebooks_are_built_from_their_sources() -> None:
    result = subprocess.run([sys.executable, str(NOTEBOOKS / "build.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_runs(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    if name.startswith("05"):
        import bench.locomo

        data = Path(os.environ.get("LOCOMO_FILE", bench.locomo.DEFAULT_DATA))
        if not data.exists():  # the data set is CC BY-NC and not shipped in the repo
            pytest.skip(f"LoCoMo data not found at {data}; set LOCOMO_FILE")
    monkeypatch.setenv("TIERED_MEMORY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute(env=dict(os.environ))  # raises CellExecutionError on any failing cell
    executed = [c for c in nb.cells if c.cell_type == "code"]
    assert executed and all(c.get("execution_count") for c in executed)
