"""Shared fixtures. The embedding model is loaded once per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# On pytest-xdist's workers, each worker's share of the cores for torch's and the BLAS's thread
# pools (read once, as they start). Without it two workers ran two threads each on two cores, and
# threads waiting for each other at every step of a model's forward pass made two processes'
# open, add, search and close (two embeddings, most of it) about 1.9x slower side by side.
WORKER_THREADS = str(max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))
if "PYTEST_XDIST_WORKER" in os.environ:
    for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, WORKER_THREADS)

from extras import NOTORCH  # noqa: E402
from tiered_memory import Embedder, SentenceTransformerEmbedder, StaticEmbedder, TieredMemory  # noqa: E402

pytest_plugins = ["servers", "llm_server"]  # PostgreSQL + Chroma servers (`servers`); local LLM (`llm`)


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real bundled all-MiniLM-L6-v2, loaded once for the whole session; the static
    default instead in ``make test-notorch``'s virtualenv (``TM_NOTORCH=1``), which leaves the
    ``[minilm]`` extra out. Anywhere else a missing extra fails here, not falls back silently."""
    if not NOTORCH and "PYTEST_XDIST_WORKER" in os.environ:
        import torch

        torch.set_num_threads(int(WORKER_THREADS))  # in case torch was imported before the above
    e: Embedder = StaticEmbedder() if NOTORCH else SentenceTransformerEmbedder()
    e.embed_query("warm up")
    return e


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests of a module marked ``record_stores`` run once per record store it names."""
    if "record_backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("record_stores")
    names = marker.args if marker else ("sqlite",)
    metafunc.parametrize("record_backend", [
        pytest.param(n, marks=[pytest.mark.servers] if n == "postgres" else []) for n in names
    ], indirect=True)


@pytest.fixture
def record_backend(request: pytest.FixtureRequest) -> Callable[[str], dict[str, object]]:
    """``name -> TieredMemory kwargs`` for the record store under test (same name = same data)."""
    if request.param == "sqlite":
        return lambda name: {}
    urls: dict[str, str] = {}
    make_url = request.getfixturevalue("make_postgres_url")

    def postgres(name: str) -> dict[str, object]:
        if name not in urls:
            urls[name] = make_url()
        return {"record_store": urls[name]}

    return postgres


@pytest.fixture
def make_memory(tmp_path: Path, embedder: Embedder,
                record_backend: Callable[[str], dict[str, object]]) -> Iterator[Callable[..., TieredMemory]]:
    """Open TieredMemory objects on tmp folders (same name = same folder); closed at teardown.

    The record store is SQLite in the folder, or, in modules marked
    ``pytest.mark.record_stores("sqlite", "postgres")``, each of those in turn."""
    opened: list[TieredMemory] = []

    def make(name: str = "mem", **kwargs: object) -> TieredMemory:
        kwargs.setdefault("embedder", embedder)
        for key, value in record_backend(name).items():
            kwargs.setdefault(key, value)
        m = TieredMemory(tmp_path / name, **kwargs)  # type: ignore[arg-type]
        opened.append(m)
        return m

    yield make
    for m in opened:
        m.close()


@pytest.fixture
def memory(make_memory: Callable[..., TieredMemory]) -> TieredMemory:
    return make_memory()


@pytest.fixture(scope="module")
def module_memory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TieredMemory]:
    """One SQLite memory on the static embedder for a whole test module, for modules whose tests
    are about what a few turns of user ``"u"`` become (the model is not their point); use it
    through ``reused_memory``."""
    folder = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    with TieredMemory(folder / "m", embedder=StaticEmbedder()) as m:
        yield m


@pytest.fixture
def reused_memory(module_memory: TieredMemory) -> Iterator[TieredMemory]:
    """The module's one memory (opening one per test costs more than such tests), user ``"u"``
    forgotten after each test so that the next starts empty."""
    yield module_memory
    module_memory.forget_user("u")
