"""pytest plugin: the local llama.cpp server for ``@pytest.mark.llm`` tests.

Fixtures:
    local_llm_url: ``http://127.0.0.1:PORT`` of a server started once per session
        (from ``.llm/``, made by ``make llm``) and stopped at the end.
    chat_model: a ``ChatOpenAI`` pointed at it.

A missing ``.llm/`` is a failure, not a skip: the end-to-end tests are part of the
suite. Set ``TM_SKIP_LLM=1`` to skip them on purpose.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "local_llm.py"
READY_TIMEOUT_S = 120.0
# 5-15 s per call on 2 idle cores; generous because throughput collapses on a busy
# machine (a 315-token prompt took 200 s with the load average at 12 on 2 cores)
CALL_TIMEOUT_S = float(os.environ.get("TM_LLM_TIMEOUT", "300"))


def _local_llm() -> ModuleType:
    """``scripts/local_llm.py`` as a module (scripts/ is not a package)."""
    name = "tiered_memory_local_llm"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _SCRIPT)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _skip_requested() -> bool:
    return os.environ.get("TM_SKIP_LLM", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def local_llm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start the local OpenAI-compatible server for the session; yield its base URL."""
    if _skip_requested():
        pytest.skip("TM_SKIP_LLM=1: end-to-end LLM tests skipped on request")
    llm = _local_llm()
    if not llm.is_set_up():
        pytest.fail(f"the local LLM is not set up in {llm.LLM_DIR}: run `make llm` "
                    "(python3 scripts/local_llm.py setup), or set TM_SKIP_LLM=1 to skip these tests",
                    pytrace=False)
    port = llm.free_port()
    log = tmp_path_factory.mktemp("llm") / "server.log"
    started = time.monotonic()
    proc = llm.start_server(port, log_path=log)
    url = f"http://127.0.0.1:{port}"
    try:
        llm.wait_ready(url, READY_TIMEOUT_S, proc=proc)
        sys.stderr.write(f"\n[llm] server ready at {url} in {time.monotonic() - started:.1f} s "
                         f"({proc.n_threads} threads)\n")
        yield url
    finally:
        llm.stop_server(proc)


@pytest.fixture(scope="session")
def chat_model(local_llm_url: str) -> Any:
    """``ChatOpenAI`` against the local server (temperature 0, 512 tokens at most)."""
    from langchain_openai import ChatOpenAI

    # llama-cpp-python's server ignores the max-tokens name langchain-openai sends; extra_body
    # puts "max_tokens" at the top level of the request, where every OpenAI-like server reads it.
    return ChatOpenAI(base_url=local_llm_url + "/v1", api_key="not-needed", model="qwen",
                      temperature=0, extra_body={"max_tokens": 512}, timeout=CALL_TIMEOUT_S, max_retries=0)
