# Two commands on a fresh machine: `make test` and `make demo`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
# The runtime set alone (what `make demo` needs): the dev extra (test tools, the
# deploy files' run launchers, a browser driver) is for `make test`.
RUNTIME_STAMP := $(VENV)/.installed
DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export DAGSTER_HOME
# pytest-xdist's workers for `make test` and `make check` (one test file per worker at a
# time, so session and module fixtures are set up once; the files in the order of
# collection, the longest first: oaipmh_dagster_tests/conftest.py, RUN_FIRST);
# `make test JOBS=1`, or a venv without pytest-xdist, runs the tests in one process.
JOBS ?= 2
PARALLEL = $(shell [ "$(JOBS)" != 1 ] && $(BIN)/python -c "import xdist" 2>/dev/null \
	&& echo "-n $(JOBS) --dist loadfile --no-loadscope-reorder")
# The soak set is a few files of many long cases: its tests are spread one by one.
SOAK_PARALLEL = $(shell [ "$(JOBS)" != 1 ] && $(BIN)/python -c "import xdist" 2>/dev/null \
	&& echo "-n $(JOBS) --dist load")
# The tests' temporary files (every test's Dagster home and SQLite files) go to a RAM
# file system when one with 4 GB free is at hand: SQLite's fsyncs there cost nothing.
# `make test TEST_TMPDIR=` keeps the system's temporary folder.
TEST_TMPDIR ?= $(shell df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 && $$4 > 4194304 {print "/dev/shm"}')
PYTEST = $(if $(TEST_TMPDIR),TMPDIR=$(TEST_TMPDIR)) $(BIN)/python -m pytest
# `make demo PORT=3001 OAI_PORT=8767 HUB_PORT=8768`: the Dagster UI's, the demo
# endpoint's and the hub's ports (HUB_PORT=0: no hub).
PORT ?= 3000
OAI_PORT ?= 8765
HUB_PORT ?= 8766

.PHONY: test check soak demo bench lint install clean chromium

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(RUNTIME_STAMP)

# A venv set up by `make test` already holds the runtime set.
$(RUNTIME_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check oaipmh_dagster oaipmh_dagster_tests benchmarks
	$(BIN)/mypy

# The fast loop (about two minutes on 2 cores): lint, types and every test not marked
# `slow` or `browser` (README, Development). `make test` still runs everything.
check: $(STAMP)
	$(BIN)/ruff check oaipmh_dagster oaipmh_dagster_tests benchmarks
	$(BIN)/mypy
	$(PYTEST) $(PARALLEL) -q -m "not slow and not browser"

# Debian's Chromium for the browser tests (never a downloaded browser); without it,
# and without root to install it, the browser tests skip with a reason.
chromium:
	@bash scripts/install-chromium.sh || echo "note: Chromium not installed: browser tests will skip"

test: $(STAMP) chromium
	$(BIN)/ruff check oaipmh_dagster oaipmh_dagster_tests benchmarks
	$(BIN)/mypy
	mkdir -p $(DAGSTER_HOME)
	VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/dg check defs
	$(PYTEST) $(PARALLEL) -m "not soak"

# The endurance cases that `make test` leaves out (README, Development); CI runs them
# after `make test`.
soak: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(PYTEST) $(SOAK_PARALLEL) -m soak

demo: $(RUNTIME_STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/oaipmh-dagster demo --port $(PORT) --oai-port $(OAI_PORT) --hub-port $(HUB_PORT)

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info .mypy_cache
