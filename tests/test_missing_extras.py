"""Each optional backend of the core, asked for without its extra, raises
``MissingDependencyError`` naming the ``pip install`` that fixes it, never a bare
``ModuleNotFoundError`` from deep inside (the adapters' own are in their test files).

Each case runs in a fresh interpreter where the extra's package cannot be imported."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("blocked, settings, package, extra", [
    ("chromadb", {}, "chromadb", "embedded"),  # the default folder store
    ("chromadb", {"vector_store": "http://127.0.0.1:9"}, "chromadb", "embedded"),  # a Chroma server
    ("qdrant_client", {"vector_store": "qdrant"}, "qdrant-client", "qdrant"),
    ("qdrant_client", {"vector_store": "qdrant+http://127.0.0.1:9"}, "qdrant-client", "qdrant"),
    ("psycopg", {"record_store": "postgresql://u:p@127.0.0.1:9/db"}, "psycopg", "postgres"),
    # psycopg installed on its own (an app's older dependency), its pool not: the message said
    # "'psycopg' is not installed" of the package the user has
    ("psycopg_pool", {"record_store": "postgresql://u:p@127.0.0.1:9/db"}, "psycopg-pool", "postgres"),
    ("tokenizers", {}, "tokenizers", "embedded"),  # the static embedder's tokenizer (chromadb imports without it)
], ids=["chroma-folder", "chroma-server", "qdrant-folder", "qdrant-server", "postgres", "postgres-pool",
        "static-embedder"])
def test_a_backend_without_its_extra_names_the_extra(tmp_path, blocked, settings, package, extra):
    code = textwrap.dedent(f"""
        import sys
        sys.modules[{blocked!r}] = None
        from tiered_memory import MissingDependencyError, TieredMemory
        try:
            with TieredMemory({str(tmp_path / "m")!r}, **{settings!r}) as memory:
                memory.add_many([{{"role": "user", "content": "hello"}}], user_id="u", session_id="s")
                memory.search("hello", user_id="u")
        except MissingDependencyError as e:
            print(type(e).__name__, e.package, e.extra)
    """)
    if package == "psycopg-pool" and importlib.util.find_spec("psycopg") is None:
        package = "psycopg"  # (an environment without the extra at all, as the torch-free one): the first missing
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["MissingDependencyError", package, extra]
