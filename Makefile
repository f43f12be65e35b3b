# `make demo` and `make test` do all the set-up on a fresh Debian machine (run as root, or
# install Slurm and munge first: scripts/system-deps.sh says how). The `training` extra is
# torch==2.13.0, the CPU build (a bare `torch` would pull a multi-GB CUDA build).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test lint unit system-deps install clean

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

test: system-deps install lint
	$(BIN)/pytest

# The fast lane: no sandbox, no Slurm, no Temporal server of any kind (the `integration`
# and `workflow` markers, pyproject.toml); `make test` runs everything.
# Most of these wait on sockets and subprocesses, not the CPU: four at a time.
unit: install
	HYPOTHESIS_PROFILE=quick $(BIN)/pytest -m "not integration and not workflow" -n 4

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
