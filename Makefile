# `make demo` and `make test` do all the set-up on a fresh Debian machine (run as root, or
# install Slurm and munge first: scripts/system-deps.sh says how). The `training` extra is
# torch==2.13.0, the CPU build (a bare `torch` would pull a multi-GB CUDA build).
VENV ?= .venv
# The distribution's optimised CPython where it can make a venv (scripts/python.sh says why).
PYTHON ?= $(shell scripts/python.sh)
BIN := $(VENV)/bin
# Bytecode is cached: a shell that sets PYTHONDONTWRITEBYTECODE would have every process the
# demo and the tests start (dozens of sandbox daemons, each xdist worker's collection)
# compile the project from source again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test scenarios lint unit workflow integration system-deps install clean

$(BIN)/autoclusters: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,sandbox,training]'
	@touch $@

install: $(BIN)/autoclusters

system-deps:
	@scripts/system-deps.sh

demo: system-deps install
	$(BIN)/autoclusters demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The lanes (docs/testing.md) are decided by what a test uses (tests/conftest.py): `unit`
# starts no Temporal server, no sandbox and no Slurm; `workflow` runs workflows on the
# time-skipping test server; `integration` runs on real sandboxes. Tests that share a
# server run in one xdist worker (their group); most tests wait on sockets and
# subprocesses, not the CPU, so more workers than cores.
XDIST := --dist loadgroup --no-loadscope-reorder

# Everything but the `scenario` lane: lint beside one parallel run of all three lanes (the
# unit and workflow tests fill the time the integration tests spend waiting on boots and
# timers; the longest and the timed start first). One collection first writes pytest's
# rewritten test modules to the bytecode cache, which the workers would each pay for at
# once otherwise. Why seven workers, and when to set fewer (TEST_WORKERS=5): docs/testing.md.
# The 30 longest tests are listed at the end: where the next cut of the suite's time is.
TEST_WORKERS ?= 7
test: system-deps install
	@$(MAKE) --no-print-directory lint & lint=$$!; \
	$(BIN)/pytest --collect-only -q -p no:cacheprovider > /dev/null; \
	$(BIN)/pytest -n $(TEST_WORKERS) $(XDIST) -m "not scenario" --durations=30; tests=$$?; \
	wait $$lint; linted=$$?; \
	if [ $$linted -ne 0 ]; then echo "make test: lint failed"; fi; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

# The long demo scenarios beyond the default demo (share, borrow, CMK) and the controller
# crash runs and cases (each module's docstring says why it is here), side by side, one
# worker each. CI runs it after `make test`.
scenarios: system-deps install
	$(BIN)/pytest -n 3 $(XDIST) -m scenario

# No server to share in this lane: any test anywhere (a module fixture is built once per
# worker instead of serialising the module, as a group would); an idle worker takes tests
# from a busy one's queue (worksteal: the lane's tests range from milliseconds to seconds).
unit: install
	HYPOTHESIS_PROFILE=quick $(BIN)/pytest -m "not integration and not workflow" -n 5 --dist worksteal

workflow: install
	$(BIN)/pytest -m "workflow and not integration" -n 4 $(XDIST)

integration: system-deps install
	$(BIN)/pytest -m "integration and not scenario" -n 4 $(XDIST)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
