"""``--config FILE``: the CLI opens the memory with the application's MemoryConfig (TOML, or
JSON), so search, context and working show what the application sees; a bad file is one
line naming the file and the key, exit 2. ``tiered-memory config`` writes a config out."""

from __future__ import annotations

import json
import time

import pytest
from cli_support import run

from tiered_memory import TieredMemory
from tiered_memory.cli_config import config_from_mapping, config_toml, load_config
from tiered_memory.config import BudgetConfig, MemoryConfig, RetrievalConfig, WorkingConfig
from tiered_memory.errors import ConfigurationError


@pytest.fixture(scope="module")
def mem(tmp_path_factory):
    """A memory made as an application makes it (the default embedder, which the CLI opens too)."""
    folder = tmp_path_factory.mktemp("cfg") / "mem"
    with TieredMemory(folder) as memory:
        memory.add_many([
            {"role": "user", "content": "I am training for a triathlon in September.", "timestamp": 1_700_000_000},
            {"role": "assistant", "content": "Great goal! How is your swimming?", "timestamp": 1_700_000_001},
            {"role": "user", "content": "Swimming is my weakest leg; I can do 800 metres.",
             "timestamp": 1_700_000_002},
        ], session_id="s1", user_id="ana")
        memory.working_memory("s2", user_id="ana").remember("book the pool lane", importance=0.8,
                                                            now=time.time() - 10 * 3600)
    return str(folder)


def test_a_budget_in_the_file_is_the_budget_context_fills(mem, tmp_path):
    """Before --config, ``context`` always had the default 3,000 tokens: an application with a
    smaller budget saw items dropped that the CLI showed as fitting."""
    cfg = tmp_path / "app.toml"
    cfg.write_text("[budget]\nmax_tokens = 40\n", encoding="utf-8")
    args = ("--path", mem, "context", "swimming", "--user", "ana", "--session", "s2", "--json")
    code, out, err = run(*args)
    assert code == 0 and json.loads(out)["max_tokens"] == 3000, err
    code, out, err = run(*args, "--config", str(cfg))
    ctx = json.loads(out)
    assert code == 0 and ctx["max_tokens"] == 40 and ctx["tokens"] <= 40 and ctx["dropped"], err


def test_retrieval_and_working_settings_in_the_file_change_what_search_and_working_show(mem, tmp_path):
    base = [json.loads(line)["score"] for line in
            run("--path", mem, "search", "training", "--user", "ana", "--json")[1].splitlines()]
    cfg = tmp_path / "app.toml"
    cfg.write_text('[retrieval]\nturn_fusion = "hand"\n\n[working]\ndecay_per_hour = 0.5\n', encoding="utf-8")
    code, out, err = run("--config", str(cfg), "--path", mem, "search", "training", "--user", "ana", "--json")
    hand = [json.loads(line)["score"] for line in out.splitlines()]
    assert code == 0 and len(hand) == len(base) == 3 and hand != base, err
    with TieredMemory(mem, config=MemoryConfig(retrieval=RetrievalConfig(turn_fusion="hand"))) as memory:
        assert hand == pytest.approx([h.score for h in memory.search("training", user_id="ana", k=5)])

    working = ("--path", mem, "working", "--user", "ana", "--session", "s2", "--json")
    default = json.loads(run(*working)[1])["items"][0]["score"]
    code, out, err = run(*working, "--config", str(cfg))
    faster = json.loads(out)["items"][0]["score"]
    assert code == 0 and faster < default - 0.1, err  # ten hours at 0.5 an hour, not 0.05


@pytest.mark.parametrize("text, named", [
    ("[retrieval]\ncandidatez = 10\n", ["'retrieval.candidatez'", "did you mean 'candidates'"]),
    ("[retreival]\nrrf_k = 10\n", ["'retreival'", "did you mean 'retrieval'"]),
    ("[budget]\nmax_tokens = 1.5\n", ["budget.max_tokens must be an int, got 1.5"]),
    ("[working]\ndecay_per_hour = 2\n", ["working.decay_per_hour must be at most 1"]),
    ("budget = 3\n", ["budget must be a table"]),
    ("[retrieval]\nturn_fusion = 3\n", ["retrieval.turn_fusion must be a string"]),
    ('[retrieval]\nturn_fusion = "best"\n', ["turn_fusion must be 'learned' or 'hand'"]),
    ("[budget\n", ["is not valid TOML"]),
])
def test_a_bad_file_is_one_line_naming_the_file_and_the_key_exit_2(mem, tmp_path, text, named):
    cfg = tmp_path / "app.toml"
    cfg.write_text(text, encoding="utf-8")
    code, out, err = run("--path", mem, "--config", str(cfg), "search", "swimming", "--user", "ana")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("tiered-memory search: error: ") and str(cfg) in err
    assert all(n in err for n in named), err
    with pytest.raises(ConfigurationError):
        load_config(cfg)


def test_a_missing_or_empty_config_path_is_a_usage_error(mem, tmp_path):
    code, _, err = run("--path", mem, "--config", str(tmp_path / "none.toml"), "stats")
    assert code == 2 and "cannot read config file" in err and "none.toml" in err
    code, _, err = run("--path", mem, "--config", "", "stats")
    assert code == 2 and "--config is empty" in err


def test_every_problem_at_once_and_json_files_too(tmp_path):
    with pytest.raises(ConfigurationError) as e:
        config_from_mapping({"budget": {"max_tokens": 0, "nope": 1}, "write_chunk": True}, "x.json")
    assert "x.json" in str(e.value) and "'budget.nope'" in str(e.value)
    assert "budget.max_tokens must be finite and at least 1" in str(e.value) and "write_chunk" in str(e.value)
    cfg = tmp_path / "app.json"
    cfg.write_text(json.dumps({"budget": {"max_tokens": 500, "shares": {"turns": 2}},
                               "episodes": {"compress_after_turns": None}, "dedup_threshold": 1}), encoding="utf-8")
    loaded = load_config(cfg)
    assert loaded.budget == BudgetConfig(max_tokens=500, shares={"turns": 2.0})
    assert loaded.dedup_threshold == 1.0 and isinstance(loaded.dedup_threshold, float)
    assert loaded.working == WorkingConfig()  # what the file leaves out keeps its default


def test_config_writes_the_defaults_as_a_file_that_reads_back_equal(tmp_path):
    code, out, err = run("config", "--defaults")
    assert code == 0 and "[retrieval]" in out and "max_tokens = 3000" in out, err
    written = tmp_path / "defaults.toml"
    written.write_text(out, encoding="utf-8")
    assert load_config(written) == MemoryConfig()
    cfg = tmp_path / "app.toml"
    cfg.write_text("[budget]\nmax_tokens = 40\n", encoding="utf-8")
    code, out, _ = run("--config", str(cfg), "config", "--json")
    assert code == 0 and json.loads(out)["budget"]["max_tokens"] == 40
    changed = MemoryConfig(budget=BudgetConfig(max_tokens=40, shares={"turns": 1.0, "items": 0.5}))
    written.write_text(config_toml(changed), encoding="utf-8")
    assert load_config(written) == changed
