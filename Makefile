# Two entry points: `make demo` and `make test`; `make acceptance` deploys the whole grid and
# runs users', operators' and faults' actions through it (tests/acceptance/scenario.py; `make
# acceptance-ha` does it on the highly available database of tools/pg-ha). Both create .venv from scratch when needed;
# the demo installs only what it runs (the `server` extra), the tests add the `test` extra.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test lint acceptance acceptance-ha clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[server,test]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[server]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/gridpilot demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy tools/pg-ha

test: lint
	$(BIN)/pytest

acceptance: $(STAMP)
	$(BIN)/python -m tests.acceptance.scenario

acceptance-ha: $(STAMP)
	$(BIN)/python -m tests.acceptance.scenario --ha

clean:
	rm -rf $(VENV) work .pytest_cache .mypy_cache .ruff_cache
