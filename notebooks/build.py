"""Build the notebooks from their sources in ``notebooks/src/*.py`` (cells split on ``# %%``).

Sources are plain Python, so diffs stay readable; the .ipynb files are generated
without outputs. ``python notebooks/build.py --check`` fails if they are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).parent


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


def build(src: Path) -> str:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = cells(src.read_text(encoding="utf-8"))
    for i, c in enumerate(nb.cells):
        c["id"] = f"{src.stem.replace('_', '-')}-{i}"
    return nbformat.writes(nb) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for src in sorted((HERE / "src").glob("*.py")):
        target = HERE / f"{src.stem}.ipynb"
        text = build(src)
        if "--check" in argv:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
    if stale:
        print("stale notebooks (run python notebooks/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
