# One-command set-up: every target installs into .venv in the checkout first if needed.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) (Python 3.11) on PATH, or run: make PY=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)  ## the main job: digits -> pins -> HTTP board -> Parquet -> AlexNet (MirroredStrategy, NCCL fallback)
	$(BIN)/pinstorm demo --workdir demo-output/$$(date +%Y%m%dT%H%M%S)

test: $(STAMP)  ## the whole test suite (what CI runs)
	$(BIN)/python -m pytest -q -ra --durations=15 tests

test-fast: $(STAMP)  ## skip the tests marked slow
	$(BIN)/python -m pytest -q -m "not slow" tests

bench: $(STAMP)  ## every benchmark, quick settings; JSON + PNG in bench/results/
	for b in bench/bench_*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info demo-output
