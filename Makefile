# Two commands a new user needs: `make demo` and `make test`. Both build .venv from scratch when
# it is missing. torch==2.13.0 is installed first so that nothing else pulls a multi-GB CUDA build
# (on these machines that version is a CPU wheel on local disk).
#
# Test tiers (tests/tiers.py): `make test-fast` runs the tests that start no process (no Ray, no
# subprocess) in a few minutes; `make test` (what CI runs) runs every test that guards behaviour,
# the fast tier first; `make test-long` runs what needs more time, outside CI (learning tests
# over several seeds, long smoke runs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-fast test-long docs lint bench races clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/rllib_gorila_cartpole.py --checkpoint-at-end

test: $(STAMP)
	$(PY) -m pytest -m "not long" $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m fast $(PYTEST_ARGS)

test-long: $(STAMP)
	$(PY) -m pytest -m "long or learning" $(PYTEST_ARGS)

# The documentation site (MkDocs Material) in site/: the configuration reference is written
# from the code first; --strict fails on a broken link, reference or docstring.
docs: $(STAMP)
	$(PY) docs/gen_configuration.py
	$(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/replay_bench.py
	$(PY) benchmarks/distributed_replay_bench.py

# Every race of the evidence (docs/benchmarks.md), resumable: many hours on 2 cores; run
# `$(PY) benchmarks/run_races.py --plan` to see where each race stands.
races: $(STAMP)
	$(PY) benchmarks/run_races.py

clean:
	rm -rf $(VENV) runs site .pytest_cache
