"""Build the notebooks from their sources in ``notebooks/src/*.py`` (cells split on ``# %%``).

Sources are plain Python, so diffs stay readable. The committed ``.ipynb`` files carry
their outputs (plots included), so a reader on GitHub sees what each cell does:

    python notebooks/build.py --execute         # rebuild every notebook and run it (one command)
    python notebooks/build.py --execute 04      # only the notebooks whose name starts with 04
    python notebooks/build.py                   # rebuild without outputs (fast)
    python notebooks/build.py --check           # fail if a notebook's cells differ from its source

Each notebook runs from a clean kernel (the venv's ``python3``) in ``notebooks/``, with this
checkout first on ``PYTHONPATH`` and matplotlib's inline backend. ``--check`` compares cells
(type, id, source) and ignores outputs, so CI checks sources while the outputs stay.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import nbformat

HERE = Path(__file__).parent
REPO = HERE.parent


def cells(source: str) -> list[nbformat.NotebookNode]:
    out = []
    for chunk in source.split("# %%")[1:]:
        header, _, body = chunk.partition("\n")
        body = body.strip("\n")
        if header.strip() == "[markdown]":
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
            out.append(nbformat.v4.new_markdown_cell(text))
        else:
            out.append(nbformat.v4.new_code_cell(body))
    return out


def notebook(src: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = cells(src.read_text(encoding="utf-8"))
    for i, c in enumerate(nb.cells):
        c["id"] = f"{src.stem.replace('_', '-')}-{i}"
    return nb


def build(src: Path) -> str:
    """The notebook of ``src`` without outputs, as text."""
    return nbformat.writes(notebook(src)) + "\n"


def shape(nb: Any) -> list[tuple[str, str, str]]:
    """What ``--check`` compares: each cell's type, id and source (pure)."""
    return [(c["cell_type"], c.get("id", ""), c["source"]) for c in nb["cells"]]


def kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("ANONYMIZED_TELEMETRY", "False")
    env.pop("MPLBACKEND", None)  # the kernel's inline backend, so plots become outputs
    return env


def execute(nb: nbformat.NotebookNode, timeout: int = 1800) -> None:
    """Run ``nb`` in place from a clean kernel; raises ``CellExecutionError`` on a failing cell."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(HERE)}})
    client.execute(env=kernel_env())


def main(argv: list[str]) -> int:
    flags = [a for a in argv if a.startswith("--")]
    only = [a for a in argv if not a.startswith("--")]
    stale = []
    for src in sorted((HERE / "src").glob("*.py")):
        if only and not any(src.stem.startswith(o) for o in only):
            continue
        target = HERE / f"{src.stem}.ipynb"
        if "--check" in flags:
            if not target.exists() or shape(nbformat.read(target, as_version=4)) != shape(notebook(src)):
                stale.append(target.name)
        elif "--execute" in flags:
            nb = notebook(src)
            print(f"running {target.name} ...", flush=True)
            execute(nb)
            target.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
        else:
            target.write_text(build(src), encoding="utf-8")
    if stale:
        print("stale notebooks (run python notebooks/build.py --execute):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
