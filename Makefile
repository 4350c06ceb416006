# `make demo` and `make test` work from a fresh clone with only Python 3 and pip:
# the first call creates .venv and installs the package with its pinned test stack.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist); tests that share a subprocess run in one (--dist loadgroup).
JOBS ?= 2
PYTEST := $(PY) -m pytest -n $(JOBS) --dist loadgroup

.PHONY: install demo test test-keras3 test-keras2 test-fast lint format bench clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,demo,lint]"
	touch $(STAMP)

## Train a CNN on scikit-learn's bundled digits with CustomModel and keras.Model, side by side.
demo: $(STAMP)
	$(PY) -m custom_fit.demo

## Run the whole suite twice (warnings are errors; see setup.cfg): on Keras 3, then on Keras 2.
test: test-keras3 test-keras2

## Keras 3: the tests, doctests, notebooks and the quick benchmark.
test-keras3: $(STAMP)
	$(PYTEST)

## Keras 2: tests/ again with TF_USE_LEGACY_KERAS=1 (tf.keras is tf_keras); tests marked keras3 are deselected.
test-keras2: $(STAMP)
	TF_USE_LEGACY_KERAS=1 $(PYTEST) tests

## The inner loop: Keras 3 tests and doctests not marked slow (no subprocesses, notebooks or benchmark).
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" tests custom_fit

## Lint, format check and type check of the whole tree (CI runs it before the tests).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

## Apply the formatter and the safe lint fixes.
format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## Measure throughput against keras.Model.fit and hand-written loops (benchmarks/results/), then on Keras 2.
bench: $(STAMP)
	$(PY) benchmarks/bench.py
	TF_USE_LEGACY_KERAS=1 $(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) build *.egg-info
