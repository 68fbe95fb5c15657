# Two commands: `make demo` (the main job) and `make test` (the tests). Both set up what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.argus-installed

.PHONY: demo test setup system-deps lint clean

demo: setup
	$(VENV)/bin/argus demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

setup: $(STAMP) system-deps

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when pyproject.toml changes, so a second `make test` starts at once.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

system-deps:
	@bash scripts/ensure-system-deps.sh

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf .stack test-artifacts .pytest_cache
