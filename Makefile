# One-command set-up: every target installs into .venv in the checkout first if needed.
PY ?= python3.11
MODERN_PY ?= $(PY)
CORE_PY ?= python3.10
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo docs test test-modern test-core test-servers test-fast test-distributor bench bench-peers clean r-pins azurite gpu-wheels gpu-check

# .venv: everything, petastorm included (numpy < 2, pyarrow 14.0.x, as petastorm 0.13.1 needs), on PY.
# .venv-modern: every extra but petastorm, on a current numpy and pyarrow, on MODERN_PY (CI: the newest
# supported Python). .venv-py<X.Y>: the boards core alone on CORE_PY (CI: the oldest). CI tests all three.
MODERN := .venv-modern
MODERN_STAMP := $(MODERN)/.installed

define make_venv
	@command -v $(3) >/dev/null 2>&1 || { echo "need $(3) on PATH, or run: make PY=/path/to/python3.11 (MODERN_PY= for test-modern)"; exit 1; }
	test -x $(1)/bin/python || $(3) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(1)/bin/python -m pip install -q -e '.[$(2)]'
endef

# The full environment also has PyTorch's CPU build for the `torch` extra's reader and trainer (CI's
# machines hold torch 2.13.0 CPU in their wheel store; elsewhere give TORCH=, e.g. a CPU wheel's path).
# Without its setuptools >= 77 (only torch's C++ extension builder needs it): petastorm 0.13.1 requires
# setuptools < 70. pinstorm's own build needs setuptools >= 77 (pyproject's [build-system]): its wheel, fetched
# into .venv/build-wheels, lets tests/test_typing.py build pinstorm in isolation with no network.
TORCH ?= torch==2.13.0

$(STAMP): pyproject.toml
	$(call make_venv,$(VENV),all$(comma)test,$(PY))
	$(BIN)/python -m pip install -q --no-deps '$(TORCH)'
	$(BIN)/python -m pip install -q filelock fsspec jinja2 networkx sympy typing-extensions 'simplejpeg>=1.7'
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: -d $(VENV)/build-wheels 'setuptools>=77'
	touch $(STAMP)

$(MODERN_STAMP): pyproject.toml
	$(call make_venv,$(MODERN),modern$(comma)test,$(MODERN_PY))
	touch $(MODERN_STAMP)

comma := ,

install: $(STAMP)

demo: $(STAMP)  ## the main job: digits -> pins -> HTTP board -> Parquet -> AlexNet (MirroredStrategy, NCCL fallback)
	$(BIN)/pinstorm demo --output demo-output/$$(date +%Y%m%dT%H%M%S)

# TEST_WORKERS=N spreads test files over N processes (pytest-xdist, a whole file to one process: module
# fixtures such as a Spark session are made once); 0 runs one process. Default 2: most of the suite
# waits (servers, subprocesses, Spark), so two processes overlap the waits even on 2 cores. It paid
# only once the tests stopped letting PyTorch's OpenMP threads spin (tests/conftest.py): spinning
# threads had filled every idle core, so that 2 workers were no faster than 1.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# OWN_MODULES are byte-compiled before a run: this machine (and CI's) sets PYTHONDONTWRITEBYTECODE, so an
# editable install's modules would otherwise be compiled anew by each of CI's ~1,150 Python processes
# that import them (~0.1 CPU-s each: 0.99 against 0.89 CPU-s to import all four layers).
OWN_MODULES := pinstorm boards pipeline training
compile_own = $(1)/bin/python -m compileall -q $(OWN_MODULES)

test: $(STAMP) test-servers  ## the whole test suite in the full environment (what CI runs, with test-modern)
	$(call compile_own,$(VENV))
	$(BIN)/pytest -q -ra --durations=15 $(XDIST) tests

# test-modern and test-core leave out the tests marked `once` (pyproject's markers): the costliest end-to-end
# runs (a mirrored fit, its crash and resume, a TF run killed mid-epoch, a progressive schedule and its
# resume, a killed multi-worker run, Spark relaunches (TensorFlow, PyTorch) after a death mid-epoch, a
# standalone cluster converting or losing a worker, a Spark driver's exit, an executor without TensorFlow)
# and the races of 7-8 processes against the S3, GCS and Azure emulators, whose outcome the environment does
# not change; the reader, Spark, its barrier stages, the rest of training and the local-folder races run in all.
test-modern: $(MODERN_STAMP) test-servers  ## the suite on numpy 2 and a current pyarrow (petastorm tests skip)
	$(call compile_own,$(MODERN))
	$(MODERN)/bin/pytest -q -ra --durations=15 -m "not once" $(XDIST) tests

test-core: test-servers  ## the boards core alone (no pipeline/training extras) on CORE_PY, in .venv-py<X.Y>
	venv=$$(.ci/core-env $(CORE_PY)) && $(call compile_own,$$venv) && $$venv/bin/pytest -q -ra --durations=10 -m "not once" --ignore tests/test_interop_r.py tests

# What the tests drive besides Python packages, installed once and only when missing: R with R pins
# 0.4.5 / 1.1.0, and Azurite. Without them those tests skip (and fail under CI=true).
test-servers:
	@.ci/install-r || echo "make: R or R pins could not be installed; the R interoperability tests will be skipped"
	@.ci/install-azurite || echo "make: Azurite could not be installed; the Azure board tests will be skipped"

docs: $(STAMP)  ## the user guide and the API reference from the docstrings into site/ (mkdocs --strict; mkdocs.yml)
	$(BIN)/mkdocs build --strict --site-dir site

test-fast: $(STAMP)  ## skip the tests marked slow
	$(BIN)/pytest -q -m "not slow" tests

bench: $(STAMP)  ## every benchmark but the peers', quick settings; JSON + PNG in bench/results/
	for b in bench/bench_*.py; do [ $$b = bench/bench_peers.py ] || $(BIN)/python $$b --quick || exit 1; done

test-distributor:  ## spark_train on Spark's own TorchDistributor on PySpark 4 (CI runs it on 3.5), in .venv-peers
	bench/peers-env
	.venv-peers/bin/python -m pip install -q 'pyspark>=3.5' pytest pytest-timeout hypothesis 'moto[server]' \
	  gcp-storage-emulator
	.venv-peers/bin/pytest -q -p no:cacheprovider tests/test_training_spark_distributor.py

bench-peers: $(STAMP)  ## pinstorm's readers against WebDataset, Mosaic, HF datasets, TFRecord, petastorm (~8 GB env)
	bench/peers-env
	.venv-peers/bin/python bench/bench_peers.py

azurite:  ## Azurite, the Azure Storage emulator the Azure board tests start (.venv/azurite; only when missing)
	.ci/install-azurite

r-pins:  ## R and R pins 0.4.5 / 1.1.0 for the interoperability tests (.venv/r-lib; only what is missing)
	.ci/install-r

clean:
	rm -rf $(VENV) $(MODERN) .venv-py3.* .venv-peers .pytest_cache build *.egg-info demo-output

# The prepared GPU check (bench/gpu_check.py). The lent GPU machine has torch, torchvision, pyarrow, fsspec, numpy,
# pandas, Pillow... but not pinstorm's small pure dependencies below: `make gpu-wheels` fetches them here (for
# its Python 3.12, x86-64) into .whl/, which travels with the working tree; `make gpu-check` runs there.
GPU_WHEELS := simplejpeg platformdirs flatbuffers
gpu-wheels:  ## the wheels the GPU machine lacks, into .whl/ (carry .whl when running gpu-check there)
	mkdir -p .whl
	for w in $(GPU_WHEELS); do python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform any -d .whl $$w || exit 1; done

gpu-check:  ## on a GPU machine: ResNet-50 / AlexNet fed by make_torch_loader, CPU vs GPU decode (JSON in bench/results/gpu/)
	python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/pinstorm-site .whl/*.whl
	PYTHONPATH=/tmp/pinstorm-site python3 bench/gpu_check.py $(ARGS)
