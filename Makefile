# Two commands on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export DAGSTER_HOME

.PHONY: test demo bench lint install clean chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check oaipmh_dagster oaipmh_dagster_tests benchmarks
	$(BIN)/mypy

# Debian's Chromium for the browser tests (never a downloaded browser); without it,
# and without root to install it, the browser tests skip with a reason.
chromium:
	@bash scripts/install-chromium.sh || echo "note: Chromium not installed: browser tests will skip"

test: $(STAMP) chromium
	$(BIN)/ruff check oaipmh_dagster oaipmh_dagster_tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest

demo: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/oaipmh-dagster demo

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info .mypy_cache
