# The commands people type. Every target creates/uses .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
# CPU build of torch by default; a GPU user runs e.g. `make TORCH_SPEC="torch==2.13.0" test`
# with their own index configured, or installs torch into .venv first (a satisfied pin installs nothing).
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.distil-installed
THREADS ?= 2
# `make demo DISTILL_SCALE=3`: the distillation runs (and their equal-cost controls) 3x longer
DISTILL_SCALE ?= 1

.PHONY: venv demo demo-quick test test-fast test-slow test-gpu lint format bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/distil demo --out runs/demo --threads $(THREADS) --distill-scale $(DISTILL_SCALE)

demo-quick: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/distil demo --quick --out runs/demo-quick --threads $(THREADS) --distill-scale $(DISTILL_SCALE)

test: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/python -m pytest -m "not gpu" -q

test-fast: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/python -m pytest -m "not gpu and not slow" -q

test-slow: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/python -m pytest -m "slow" -q

test-gpu: venv
	$(BIN)/python -m pytest -m "gpu" -q

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: venv
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

bench: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/python bench/step_breakdown.py --preset demo
	OMP_NUM_THREADS=1 $(BIN)/python bench/align.py --part all

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
