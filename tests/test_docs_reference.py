"""docs/reference.md against the code: every public name, every config option with its true
default, every environment variable the packages read. Options and variables had been added
with no word in the README or docs/ (35 of the 69 options, some named only in a docstring;
``TIERED_MEMORY_DEBUG``), and a default written in a doc could drift from the dataclass unnoticed."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from tiered_memory import config

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
PACKAGES = ("tiered_memory", "langchain_tiered_memory", "llamaindex_tiered_memory")
MODULES = [m for p in PACKAGES for m in (p, f"{p}.testing")]
CONFIGS = [config.MemoryConfig, config.BufferConfig, config.RetrievalConfig, config.BudgetConfig,
           config.LLMConfig, config.EpisodeConfig, config.FactConfig, config.WorkingConfig,
           config.ConsolidationConfig]
ROW = re.compile(r"^\| `(\w+)\.(\w+)` \| `([^`]*)` \|", re.MULTILINE)


def documented_defaults() -> dict[str, object]:
    """``Class.field`` -> the default the page's table gives, read as a Python literal."""
    return {f"{cls}.{name}": ast.literal_eval(value) for cls, name, value in ROW.findall(PAGE)}


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_is_on_the_page(module: str) -> None:
    names = importlib.import_module(module).__all__
    missing = [n for n in names if f"`{n}`" not in PAGE]
    assert not missing, f"{module}.__all__ names missing from docs/reference.md: {missing}"


def test_every_config_option_is_on_the_page_with_its_default() -> None:
    shown = documented_defaults()
    expected = {}
    for cls in CONFIGS:
        instance = cls()
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name)
            if not dataclasses.is_dataclass(value):  # the parts of MemoryConfig are tables of their own
                expected[f"{cls.__name__}.{f.name}"] = value
    assert sorted(set(expected) - set(shown)) == [], "options missing from docs/reference.md"
    assert sorted(set(shown) - set(expected)) == [], "options on the page that no config has"
    wrong = {k: (shown[k], v) for k, v in expected.items() if shown[k] != v or type(shown[k]) is not type(v)}
    assert wrong == {}, "defaults on the page (page, code) that are not the code's"


def test_every_environment_variable_the_packages_read_is_on_the_page() -> None:
    read = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            read |= set(re.findall(r"environ(?:\.get)?\(\s*\"([A-Z_]+)\"", text))
            read |= set(re.findall(r"environ\[\"([A-Z_]+)\"\]", text))
            read |= set(re.findall(r"^\w*ENV\w* = \"([A-Z_]+)\"", text, re.MULTILINE))  # EMBEDDER_ENV
    set_only = {"HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "ANONYMIZED_TELEMETRY"}  # setdefault, said below
    assert {"TIERED_MEMORY_HOME", "TIERED_MEMORY_EMBEDDER", "QDRANT_API_KEY"} <= read  # the scan finds them
    missing = sorted(v for v in read - set_only if f"`{v}`" not in PAGE)
    assert missing == [], f"environment variables read by the packages, missing from docs/reference.md: {missing}"
    assert all(v in PAGE for v in set_only)


def test_every_extra_is_on_the_page() -> None:
    # read without tomllib (Python 3.11+; the package supports 3.10): each `name = [` of the table
    table = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("[project.optional-dependencies]")[1]
    extras = re.findall(r"^([a-z][a-z0-9-]*) = \[", table.split("\n[")[0], re.MULTILINE)
    assert {"embedded", "minilm", "all", "test"} <= set(extras)  # the scan finds them
    assert sorted(e for e in extras if f"| `{e}` |" not in PAGE) == []


def test_the_readme_links_the_page() -> None:
    assert "(docs/reference.md)" in (ROOT / "README.md").read_text(encoding="utf-8")


def anchors(path: Path) -> set[str]:
    """The ``#anchors`` GitHub gives the headings of a Markdown file (pure but for the read)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        heading = None if in_code else re.match(r"^#+\s+(.*)$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_every_link_between_the_docs_resolves(doc: str) -> None:
    """docs/running_at_scale.md is the README's section word for word, so its links to
    ``bench/README.md`` pointed at docs/bench/README.md, which does not exist; a link from
    the repository's root (``/bench/README.md``) reads the same in both."""
    page = ROOT / doc if doc == "README.md" else ROOT / "docs" / doc
    broken = []
    for target, anchor in re.findall(r"\]\(([^)\s#]*)(?:#([^)\s]+))?\)", page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = ROOT / target.lstrip("/") if target.startswith("/") else (page.parent / target if target else page)
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}#{anchor} (no such heading)")
    assert broken == []
