# `make demo` and `make test` work from a fresh clone with only Python 3 and pip:
# the first call creates .venv and installs the package with its pinned test stack.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Test processes (pytest-xdist); tests that share a subprocess run in one (--dist loadgroup).
# tests/integrations/ needs the tools it tests: `make test-integrations` runs it in a venv of its own.
JOBS ?= 2
PYTEST := $(PY) -m pytest -n $(JOBS) --dist loadgroup --ignore=tests/integrations

.PHONY: gpu-payload gpu-payload-dry-run gpu-payload-verify keras2-peer install demo test test-keras3 test-keras2 test-crash test-fast test-compat test-compat-lean compat-venvs py313-venv test-py313 integrations-venv test-integrations lint format bench dist docs clean

install: $(STAMP)

$(STAMP): setup.cfg setup.py pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,keras2,demo,lint,docs]"
	touch $(STAMP)

## Train a CNN on scikit-learn's bundled digits with CustomModel and keras.Model, side by side.
demo: $(STAMP)
	$(PY) examples/demo.py

## Run the whole suite twice (warnings are errors; see setup.cfg): on Keras 3, then on Keras 2.
test: test-keras3 test-keras2

## Keras 3: the tests, doctests, notebooks and the quick benchmark.
test-keras3: $(STAMP)
	$(PYTEST)

## Keras 2: tests/ again with TF_USE_LEGACY_KERAS=1 (tf.keras is tf_keras); tests marked keras3 are deselected.
test-keras2: $(STAMP)
	TF_USE_LEGACY_KERAS=1 $(PYTEST) tests

## The kill harness on every scenario (make test runs three of the seven): SIGKILLs in steps,
## backup writes, restores and the final deletion; each run must equal an uninterrupted one.
test-crash: $(STAMP)
	$(PYTEST) tests/test_backup_and_restore.py -k sigkill --crash-all

## The inner loop: Keras 3 tests and doctests not marked slow (no subprocesses, notebooks or benchmark).
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" tests custom_fit

## Extra rows of the support matrix (compat/*.txt): one venv each, the compat subset of the tests.
COMPAT_ROWS ?= keras-3.8 keras-3.12 keras-3.16-nightly tensorflow-2.22-rc tf_keras-2.17
COMPAT_TESTS := tests/end_to_end/test_model_parity.py tests/test_compiled.py tests/test_optimizers.py tests/test_gan.py \
	tests/test_saving.py tests/test_functional.py tests/end_to_end/test_distribute.py tests/compat/test_internals.py \
	tests/test_gradient_contract.py tests/compat/test_keras2_idioms.py tests/compat/test_keras2.py tests/test_public_api.py \
	tests/test_deprecated.py tests/test_random.py
# Not in the rows: the two-process MultiWorkerMirrored runs and the 100-epoch GAN image quality
# check (both run on the pinned stack in `make test`; the rows check behaviour, not image quality).
COMPAT_DESELECT := not two_workers and not digits_gan_image_grid
STACK_PINS := ^(tensorflow|keras|tf_keras|numpy|h5py|protobuf|tensorboard)==
COMPAT_VENVS := $(foreach row,$(COMPAT_ROWS),.venv-compat/$(row)/.installed)
test-compat: $(addprefix test-compat-,$(COMPAT_ROWS))
## Only create the compat venvs (CI does it in the background while the main suite runs).
compat-venvs: $(COMPAT_VENVS)
.PRECIOUS: .venv-compat/%/.installed  # a stamp, not an intermediate file make may delete

# A row gets the keras2 extra (tf_keras) when it pins tf_keras: tf_keras pins its TensorFlow minor,
# so a row with a TensorFlow that has no tf_keras yet runs Keras 3 only.
# keras-nightly installs the `keras` module under another distribution name. A row that pins it
# first gets the keras release install_requires pulls, which is then removed and the nightly
# installed instead. A row whose TensorFlow pulls keras-nightly (a TensorFlow release candidate)
# names with `# keras module: keras` the distribution whose files must end up as the module.
.venv-compat/%/.installed: compat/%.txt constraints.txt setup.cfg setup.py pyproject.toml
	$(PYTHON) -m venv .venv-compat/$*
	grep -v -E '$(STACK_PINS)' constraints.txt > .venv-compat/$*/tools.txt
	.venv-compat/$*/bin/python -m pip install --quiet --upgrade pip
	extras=test; if grep -q -E '^tf_keras==' compat/$*.txt; then extras=test,keras2; fi; \
	.venv-compat/$*/bin/python -m pip install --quiet -c compat/$*.txt -c .venv-compat/$*/tools.txt -e ".[$$extras]"
	if grep -q -E '^# keras module: keras$$' compat/$*.txt; then \
		.venv-compat/$*/bin/python -m pip install --quiet --no-deps --force-reinstall -c compat/$*.txt keras; \
	elif grep -q -E '^keras-nightly==' compat/$*.txt; then \
		.venv-compat/$*/bin/python -m pip uninstall --quiet -y keras && \
		.venv-compat/$*/bin/python -m pip install --quiet -c compat/$*.txt -c .venv-compat/$*/tools.txt keras-nightly; \
	fi
	touch $@

## The same rows one at a time, each venv removed once its tests pass: for a machine short of disk
## (each venv takes about 2.6 GB, TensorFlow 1.8 GB of it).
test-compat-lean:
	for row in $(COMPAT_ROWS); do $(MAKE) test-compat-$$row && rm -rf .venv-compat/$$row || exit 1; done

test-compat-%: .venv-compat/%/.installed
	$(if $(findstring tf_keras,$*),TF_USE_LEGACY_KERAS=1) .venv-compat/$*/bin/python -m pytest -n $(JOBS) \
		--dist loadgroup $(COMPAT_TESTS) -k "$(COMPAT_DESELECT)"

## The Python 3.13 row: Debian 13's python3.13 in a root made with debootstrap, entered with unshare and
## chroot (compat/py313.sh; needs root). The pinned stack of constraints.txt; about 2.8 GB in .venv-py313.
PY313 := .venv-py313
PY313_RUN := bash compat/py313.sh run
PY313_PYTEST := $(PY313_RUN) python -m pytest -n $(JOBS) --dist loadgroup
# The compat subset less MirroredStrategy on Keras 3 and on Keras 2, plus on Keras 3 the doctests,
# the notebooks, the README and one MirroredStrategy run (the GAN's): about 8-9 minutes on 2 idle
# cores (estimated from its CPU time), where the full Keras 3 suite takes 15 and test_distribute.py
# adds about 4 per Keras.
PY313_COMPAT_TESTS := $(filter-out tests/end_to_end/test_distribute.py,$(COMPAT_TESTS))
PY313_KERAS3_TESTS := $(PY313_COMPAT_TESTS) tests/end_to_end/test_distribute.py::test_gan_mirrored_matches_single_device \
	custom_fit notebooks tests/end_to_end/test_readme.py
PY313_KERAS2_TESTS := $(PY313_COMPAT_TESTS)
## Only create the 3.13 root and venv (CI does it in the background while the main suite runs).
py313-venv: $(PY313)/venv.installed
.PRECIOUS: $(PY313)/root.installed $(PY313)/venv.installed

$(PY313)/root.installed:
	bash compat/py313.sh root
	touch $@

$(PY313)/venv.installed: $(PY313)/root.installed constraints.txt setup.cfg setup.py pyproject.toml
	bash compat/py313.sh venv
	touch $@

test-py313: $(PY313)/venv.installed
	$(PY313_PYTEST) $(PY313_KERAS3_TESTS) -k "$(COMPAT_DESELECT)"
	TF_USE_LEGACY_KERAS=1 $(PY313_PYTEST) $(PY313_KERAS2_TESTS) -k "$(COMPAT_DESELECT)"

## The tools around Keras with their real packages (MLflow, Comet, W&B, DVCLive, Optuna, KerasTuner, ClearML, tfmot:
## setup.cfg's `integrations` extra), offline, on Keras 3 and then on Keras 2: tests/integrations/, in a venv of its
## own (about 3.2 GB; DVCLive brings DVC). CI installs it in the background during `make test`.
INTEGRATIONS := .venv-integrations
integrations-venv: $(INTEGRATIONS)/.installed
.PRECIOUS: $(INTEGRATIONS)/.installed

$(INTEGRATIONS)/.installed: setup.cfg setup.py pyproject.toml constraints.txt
	$(PYTHON) -m venv $(INTEGRATIONS)
	$(INTEGRATIONS)/bin/python -m pip install --quiet --upgrade pip
	$(INTEGRATIONS)/bin/python -m pip install --quiet -c constraints.txt -e ".[test,keras2,integrations]"
	touch $@

test-integrations: $(INTEGRATIONS)/.installed
	$(INTEGRATIONS)/bin/python -m pytest -n $(JOBS) --dist loadgroup tests/integrations
	TF_USE_LEGACY_KERAS=1 $(INTEGRATIONS)/bin/python -m pytest -n $(JOBS) --dist loadgroup tests/integrations

## tf_keras' own engine, saving and callback tests, as they are and with CustomModel swapped in (compat/keras2_peer.py).
## Needs a checkout of keras-team/tf-keras: make keras2-peer TF_KERAS_REPO=DIR (numbers: docs/testing.md).
keras2-peer: $(STAMP)
	$(if $(TF_KERAS_REPO),,$(error set TF_KERAS_REPO to a checkout of keras-team/tf-keras))
	$(PY) compat/keras2_peer.py --repo $(TF_KERAS_REPO) --out keras2-peer

## Lint, format check and type check of the whole tree (CI runs it before the tests).
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

## Build the sdist and the wheel into dist/ and check them: metadata and README (twine), wheel contents.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m twine check --strict dist/*
	$(PY) -c "import glob, zipfile; names = zipfile.ZipFile(*glob.glob('dist/*.whl')).namelist(); \
		assert {'custom_fit/py.typed', 'custom_fit/_compat/internals.json'} <= set(names), 'wheel lacks package data'; \
		assert all(n.startswith('custom_fit') for n in names), 'wheel holds more than custom_fit: %s' % names"

## Build the documentation site (mkdocs.yml, docs/) into site/, offline; any warning fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

## Apply the formatter and the safe lint fixes.
format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## Measure throughput against keras.Model.fit and hand-written loops (benchmarks/results/), then on Keras 2.
bench: $(STAMP)
	$(PY) benchmarks/bench.py
	TF_USE_LEGACY_KERAS=1 $(PY) benchmarks/bench.py

## The GPU table's payload (issue 44, benchmarks/gpu/): TensorFlow 2.21 with its CUDA 12 libraries, keras
## and custom_fit for CPython $(GPU_PY), made small and cut into pieces of at most 60 MiB with a manifest,
## in $(GPU_DIR)/py$(GPU_PY)/payload (ignored). Downloads about 3.3 GB once; builds on CPU. Never run by CI.
## GPU_CUDNN=carry|image (cuDNN as an optional part, or left to the image), GPU_STAND_INS (empty: the real
## libraries), GPU_COMPRESS=zstd|xz|none at GPU_LEVEL. PAYLOAD_PYTHON needs pip; it installs nothing into itself.
GPU_PY ?= 312
GPU_DIR ?= .gpu-payload
GPU_CUDNN ?= carry
GPU_STAND_INS ?= cufft cusolver cusparse curand
GPU_COMPRESS ?= zstd
GPU_LEVEL ?= 12
GPU_THREADS ?= 2
PAYLOAD_PYTHON ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_WHEELS := $(GPU_DIR)/py$(GPU_PY)/wheels
GPU_PAYLOAD := $(GPU_DIR)/py$(GPU_PY)/payload
PAYLOAD_TOOL := nice -n 19 $(PAYLOAD_PYTHON) benchmarks/gpu/payload.py

gpu-payload: $(GPU_PAYLOAD)/manifest.json

$(GPU_WHEELS)/.downloaded:
	$(PAYLOAD_TOOL) download --python-tag $(GPU_PY) --wheels $(GPU_WHEELS)
	touch $@

$(GPU_PAYLOAD)/manifest.json: $(GPU_WHEELS)/.downloaded benchmarks/gpu/payload.py setup.cfg $(wildcard custom_fit/*.py)
	$(PAYLOAD_PYTHON) -m pip wheel --quiet --no-deps --no-build-isolation -w $(GPU_WHEELS) .
	$(PAYLOAD_TOOL) build --python-tag $(GPU_PY) --wheels $(GPU_WHEELS) --stage $(GPU_DIR)/py$(GPU_PY)/stage \
		--out $(GPU_PAYLOAD) --cudnn $(GPU_CUDNN) --stand-ins $(GPU_STAND_INS) --compress $(GPU_COMPRESS) \
		--level $(GPU_LEVEL) --threads $(GPU_THREADS)

## Check every piece of the payload against its manifest (sizes, SHA-256).
gpu-payload-verify:
	$(PAYLOAD_PYTHON) benchmarks/gpu/payload.py verify $(GPU_PAYLOAD)

## The payload for this machine's Python (fast compression), reassembled and unpacked by
## benchmarks/gpu/run.sh --dry-run, which imports TensorFlow from it and trains one tiny epoch on the CPU.
## DRY_RUN_PYTHON (no TensorFlow of its own: the tree must be enough) runs run.sh.
LOCAL_PY := $(shell $(PYTHON) -c 'import sys; print("%d%d" % sys.version_info[:2])')
DRY_RUN_PYTHON ?= $(PYTHON)
gpu-payload-dry-run:
	$(MAKE) gpu-payload GPU_PY=$(LOCAL_PY) GPU_LEVEL=$(or $(DRY_RUN_LEVEL),3)
	OUT=$(GPU_DIR)/dry-run-out bash benchmarks/gpu/run.sh --dry-run --payload $(GPU_DIR)/py$(LOCAL_PY)/payload \
		--site $(GPU_DIR)/site-py$(LOCAL_PY) --python $(DRY_RUN_PYTHON)

clean:
	rm -rf $(VENV) .venv-compat $(PY313) $(INTEGRATIONS) build dist site *.egg-info
