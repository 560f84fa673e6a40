"""The floor plan, checked: every import of the three packages (function-local and
``TYPE_CHECKING`` ones too) read with ``ast``; the module graph has no cycle; each part
imports only the parts below it; the core never imports an adapter or a framework."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tiered_memory", "langchain_tiered_memory", "llamaindex_tiered_memory")

FOUNDATION = {"errors", "config", "types", "records", "tokens", "validation", "quoting", "aio", "folder_lock", "guard", "ids", "textcache",
              "redaction", "graphemes", "json_values", "slots", "storable", "tool_calls"}
# part -> the parts it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "foundation": set(),
    "embedding": {"foundation"},
    "vector": {"foundation"},
    "store": {"foundation"},
    "llm": {"foundation"},
    "testing": {"foundation"},
    "parts": {"foundation", "embedding", "vector", "store"},
    "recall": {"foundation", "embedding", "vector", "store", "parts"},
    "layers": {"foundation", "embedding", "vector", "store", "llm", "parts", "recall"},
    "context": {"foundation", "embedding", "vector", "store", "parts", "recall", "layers"},
    "backends": {"foundation", "embedding", "vector", "store"},
    # portable restores facts and episodes through their layers (which own their vector ids), as
    # context reads through them; it exports from the record store's and layer repositories'
    # protocols, which is all an export reads (a read-only reader has no index, hence no parts)
    "portable": {"foundation", "parts", "recall", "layers", "store"},
    "facade": {"foundation", "embedding", "vector", "store", "llm", "parts", "recall", "layers", "context",
               "backends", "portable"},
    "entry": {"foundation", "embedding", "vector", "store", "llm", "parts", "recall", "layers", "context",
              "backends", "portable", "facade", "testing"},
    "adapters": {"foundation", "embedding", "vector", "store", "llm", "parts", "recall", "layers", "context",
                 "backends", "portable", "facade", "entry", "testing", "adapters"},
}


def part_of(module: str) -> str:
    top, _, rest = module.partition(".")
    if top != "tiered_memory":
        return "adapters"
    head = rest.split(".", 1)[0]
    if head in ("portable_layers", "portable_parse", "portable_restore", "portable_values", "portable_import"):
        # layer lines, reading a line back, restore, export values, the import
        return "portable"
    if head in ("arguments", "memory_folder", "startup"):  # what a memory is given, its folder, the check at open
        return "backends"
    if head in FOUNDATION:
        return "foundation"
    if head in ("embedding", "vector", "store", "llm", "recall", "layers", "context", "parts", "backends",
                "portable", "testing"):
        return head
    if head in ("memory", "memory_engines", "memory_writes", "memory_reads", "memory_layers", "writes", "user_locks"):
        # the facade (its call groups over the engines it holds), the write procedures it runs under its lock
        # and the users' locks beside it
        return "facade"
    return "entry"  # the package __init__, __main__, cli, demo


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every internal module ``module`` imports, wherever the import statement sits."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            # the longest known module the name points into (a package counts as its __init__)
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    found = modules()
    return {m: imports_of(m, p, set(found)) for m, p in found.items()}


def test_the_graph_sees_deferred_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n"
                      "def f():\n    from .b import y\n    import pkg.c\n")
    assert imports_of("pkg.probe", source, {"pkg", "pkg.a", "pkg.b", "pkg.c"}) == {"pkg.a", "pkg.b", "pkg.c"}


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_each_part_imports_only_what_lies_below_it(graph: dict[str, set[str]]) -> None:
    wrong = sorted(f"{m} ({part_of(m)}) imports {n} ({part_of(n)})"
                   for m, targets in graph.items() for n in targets
                   if part_of(n) != part_of(m) and part_of(n) not in ALLOWED[part_of(m)])
    assert not wrong, "\n".join(wrong)


def test_the_core_imports_no_framework() -> None:
    found = modules()
    bad = []
    for m, path in found.items():
        if not m.startswith("tiered_memory"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{m}: {n}" for n in names
                    if n.split(".")[0] in ("langchain", "langchain_core", "langgraph", "langchain_classic",
                                           "llama_index", "langchain_tiered_memory", "llamaindex_tiered_memory")]
    assert not bad, bad


def test_every_module_has_a_part(graph: dict[str, set[str]]) -> None:
    assert {part_of(m) for m in graph} <= set(ALLOWED)
    # the parts a reader should see in the folder list
    assert {"embedding", "vector", "store", "llm", "recall", "layers", "context"} <= {
        p.name for p in (ROOT / "tiered_memory").iterdir() if p.is_dir()}


# ---- SQL lives only in store/ --------------------------------------------------------
SQL_TEXT = re.compile(r"\b(SELECT\b.*\bFROM|INSERT INTO|UPDATE \w+ SET|DELETE FROM|CREATE (TABLE|INDEX|VIRTUAL|TRIGGER)"
                      r"|ON CONFLICT)\b")
DB_CALLS = {"execute", "executemany", "executescript", "fetchone", "fetchall", "transaction"}  # not "cursor": a session cursor is a domain word


def sql_in(path: Path) -> list[str]:
    """SQL text (string constants, f-string parts included) and database-cursor calls in a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_TEXT.search(node.value):
            found.append(f"{path.name}:{node.lineno}: {node.value.strip()[:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DB_CALLS:
            found.append(f"{path.name}:{node.lineno}: .{node.func.attr}(...)")
    return found


def test_the_sql_probe_sees_sql_text_and_cursor_calls(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text('T = "facts"\nQ = f"SELECT id FROM {T}"\ndef f(c):\n    c.execute("x")\n'
                      'def g(rows):\n    return rows.facts_of("u")  # a domain call: fine\n')
    assert [s.split(": ", 1)[1] for s in sql_in(source)] == ["'SELECT id FROM'", ".execute(...)"]


def test_sql_lives_only_in_the_stores() -> None:
    found = [s for m, path in modules().items() if part_of(m) in ("layers", "recall", "context") for s in sql_in(path)]
    assert not found, "\n".join(found)


def test_the_floor_plan_in_docs_names_every_module() -> None:
    """docs/architecture.md's folder list is the floor plan a reader goes by: each module of the
    core is named in it (by its name, with or without ``.py``, or a pattern such as
    ``sqlite*.py``), so a new module cannot be left off it."""
    import fnmatch

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    plan = text[text.index("```text\n"):text.index("```\n", text.index("```text\n") + 8)]
    names = {w.strip("(),").removesuffix(".py") for w in plan.split()}
    missing = sorted(
        str(path.relative_to(ROOT)) for path in (ROOT / "tiered_memory").rglob("*.py")
        if path.name != "__init__.py" and not any(fnmatch.fnmatch(path.stem, n) for n in names if n))
    assert not missing, f"not in the floor plan of docs/architecture.md: {missing}"
