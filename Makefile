# Two commands: `make demo` (the main job) and `make test` (the type check, then the tests). Both set up what they
# need. `make test-unit` is the quick loop: the tests that start no real stack, and no LLM build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.argus-installed

.PHONY: demo test test-unit typecheck setup system-deps lint clean llm dashboards

# `make demo DEMO_ARGS=--keep` leaves the stack (and the web page) up until Ctrl-C.
demo: setup
	$(VENV)/bin/argus demo $(DEMO_ARGS)

# The LLM tests run against the real local model: `llm` is cached, so after the first build it costs nothing,
# and ARGUS_REQUIRE_LLM=1 turns a missing model into a failure instead of a skip (ARGUS_REQUIRE_BROWSER=1 does the
# same for the web page's browser test, whose chromium comes with the system packages).
# The markers of every test that starts a real process (Ray, Prometheus, sshd, PostgreSQL, the LLM, chromium).
REAL_STACK := ray or llm or browser or prometheus or sshd or postgres

# scripts/run-tests.sh runs the real-stack tests and, beside them, the others (two pytest processes): the same tests
# as one `pytest`, minutes sooner on a 2-core machine.
test: setup llm typecheck
	ARGUS_REQUIRE_LLM=1 ARGUS_REQUIRE_BROWSER=1 PY=$(PY) REAL_STACK="$(REAL_STACK)" bash scripts/run-tests.sh $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -m "not ($(REAL_STACK))" $(PYTEST_ARGS)

# mypy over the packages named in pyproject.toml ([tool.mypy] files): strict on core, a baseline elsewhere.
typecheck: setup
	$(VENV)/bin/mypy

setup: $(STAMP) system-deps

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when a pyproject.toml changes, so a second `make test` starts at once. The stage (stage/: local
# stack, DCGM simulator, demo) is its own distribution beside Argus; its only dependency is Argus, installed above.
$(STAMP): pyproject.toml stage/pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps -e ./stage
	touch $(STAMP)

system-deps:
	@bash scripts/ensure-system-deps.sh

# The local LLM for RCA tests and the demo: llama-server + a pinned model, cached in ~/.cache/argus/llm.
llm: setup
	bash scripts/llm-setup.sh

# Grafana dashboards: build dashboards/*.dashboard.py to the JSON beside them and check their PromQL.
dashboards: setup
	$(VENV)/bin/argus dashboards build

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf .stack test-artifacts .pytest_cache
