# Two commands do all the set-up on a fresh machine:
#   make demo   - virtualenv, install, run the demo on the embedded default
#   make test   - virtualenv, install with test dependencies, local LLM server, whole suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export ANONYMIZED_TELEMETRY := False

.PHONY: demo test install install-test llm servers bench bench-backends clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build of torch first; an unpinned torch would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	touch $@

$(VENV)/.installed: $(VENV)/.base pyproject.toml
	$(PIP) install -q -e ".[all]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -q -e ".[all,test]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(VENV)/.installed
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

test: install-test llm servers
	$(PY) -m pytest

bench: install
	$(PY) -m bench.locomo

bench-backends: install servers
	$(PY) -m bench.backends

clean:
	rm -rf $(VENV) .llm .pytest_cache build *.egg-info
