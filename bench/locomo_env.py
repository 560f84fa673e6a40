"""What ``python -m bench.locomo`` measures around the recall: the machine it ran on, the time
from ``import`` to the first search in a fresh process, and the size of an install."""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def machine_facts() -> dict[str, Any]:
    import platform

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "load_average_at_start": load}


FIRST_SEARCH = """
import sys, time
start = time.perf_counter()
from tiered_memory import TieredMemory
from bench.locomo import make_embedder
with TieredMemory({path!r}, embedder=make_embedder({spec!r})) as memory:
    hits = memory.search({query!r}, user_id={user!r}, k=10)
print(time.perf_counter() - start, len(hits))
"""


def first_search_seconds(spec: str, path: Path, user: str, query: str) -> tuple[float, float]:
    """(import -> first search result inside a fresh process, the whole process's wall time)
    on a store that already holds a conversation."""
    import subprocess

    code = FIRST_SEARCH.format(path=str(path), spec=spec, query=query, user=user)
    # this checkout's packages, as in the parent (python -c puts the working folder first)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the first-search process failed (exit status {done.returncode}):\n"
                         f"{done.stderr[-2000:]}{done.stdout[-500:]}")
    inside, hits = done.stdout.split()
    if int(hits) == 0:
        raise SystemExit(f"first search on {path} found nothing: {done.stderr}")
    return float(inside), wall


def install_size(venv: Path) -> dict[str, Any]:
    """Megabytes and distributions in a virtualenv's site-packages (pip/setuptools excluded)."""
    sites = list(venv.glob("lib/python*/site-packages"))
    if not sites:
        raise SystemExit(f"{venv}: no lib/python*/site-packages")
    tools = ("pip", "setuptools", "_distutils_hack", "pkg_resources")
    total = 0
    for f in sites[0].rglob("*"):
        if f.is_file() and not f.relative_to(sites[0]).parts[0].split("-")[0] in tools:
            total += f.stat().st_size
    dists = [d.name for d in sites[0].glob("*.dist-info") if d.name.split("-")[0] not in tools]
    torch = any(d.lower().startswith(("torch-", "sentence_transformers-")) for d in dists)
    return {"venv": str(venv), "megabytes": total / 1e6, "distributions": len(dists), "torch": torch}
