# `make demo` and `make test` work from a fresh clone with only Python 3 and pip:
# the first call creates .venv and installs the package with its pinned test stack.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-keras3 test-keras2 bench clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,demo]"
	touch $(STAMP)

## Train a CNN on scikit-learn's bundled digits with CustomModel and keras.Model, side by side.
demo: $(STAMP)
	$(PY) -m custom_fit.demo

## Run the whole suite twice (warnings are errors; see setup.cfg): on Keras 3, then on Keras 2.
test: test-keras3 test-keras2

## Keras 3: the tests, doctests, notebooks and the quick benchmark.
test-keras3: $(STAMP)
	$(PY) -m pytest

## Keras 2: tests/ again with TF_USE_LEGACY_KERAS=1 (tf.keras is tf_keras); tests marked keras3 are deselected.
test-keras2: $(STAMP)
	TF_USE_LEGACY_KERAS=1 $(PY) -m pytest tests

## Measure throughput against keras.Model.fit and hand-written loops (benchmarks/results/), then on Keras 2.
bench: $(STAMP)
	$(PY) benchmarks/bench.py
	TF_USE_LEGACY_KERAS=1 $(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) build *.egg-info
