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

.PHONY: venv demo demo-quick test test-fast test-slow test-gpu lint format bench clean \
	gpu-wheels gpu-check gpu-check-dry

venv: $(STAMP)

# pip compiles every installed file to bytecode on one core; --no-compile, then compileall on
# every core: 121 s instead of 147 s on 2 cores (pip's cache warm, 2026-11-28). The bytecode is
# written once here: with PYTHONDONTWRITEBYTECODE set, no import would write it. A file that
# does not compile (some packages ship such files) is skipped, as pip skips it.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile --upgrade pip
	$(BIN)/python -m pip install -q --no-compile "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --no-compile -e ".[dev]"
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $(STAMP)

demo: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/distil demo --out runs/demo --threads $(THREADS) --distill-scale $(DISTILL_SCALE)

demo-quick: venv
	OMP_NUM_THREADS=$(THREADS) $(BIN)/distil demo --quick --out runs/demo-quick --threads $(THREADS) --distill-scale $(DISTILL_SCALE)

# The tests run in $(TEST_WORKERS) pytest-xdist workers of one thread each (TEST_WORKERS=0: one
# process); tests/suite_parallel.py says how they are shared out, and a test over its time
# budget fails the run (tests/suite_budget.py).
TEST_WORKERS ?= $(THREADS)
PYTEST := OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
	--no-loadscope-reorder --durations=15

# distil's and the tests' bytecode, written before the run (a no-op for unchanged files): with
# PYTHONDONTWRITEBYTECODE set no import writes it, and each Python process the tests start would
# compile distil again (about 1.5 s of CPU each here)
BYTECODE := $(BIN)/python -m compileall -q -j 0 src tests > /dev/null || true

test: venv
	$(BYTECODE)
	$(PYTEST) -m "not gpu"

test-fast: venv
	$(BYTECODE)
	$(PYTEST) -m "not gpu and not slow"

test-slow: venv
	$(BYTECODE)
	$(PYTEST) -m "slow"

# The GPU tier only (a collection error elsewhere cannot stop it), with the liger extra; a test
# skipped because an extra is not installed (vllm, flash-attn, ...) is listed at the end and
# makes the run fail (DISTIL_GPU_STRICT, tests/gpu/conftest.py). docs/gpu.md
test-gpu: venv
	$(BIN)/python -m pip install -q -e ".[dev,liger]"
	DISTIL_GPU_STRICT=1 $(BIN)/python -m pytest -m gpu tests/gpu -q

# ---- the one-command GPU check (docs/gpu.md) --------------------------------------------------
# `make gpu-wheels` (where pip reaches an index) fetches, for CPython 3.12 on x86-64 Linux, what
# the GPU machine's image lacks (pins: bench/gpu/wheels.txt) into $(WHEELS); `make gpu-check`
# there installs them (--no-index --no-deps --target: the image's torch stays) and runs the
# steps of one lease in goal order, 540 s in all; `make gpu-check-dry` rehearses it here (and
# fails when the step budgets exceed the 540 s). Exit 0 all passed, 1 a failure, 2 incomplete.
WHEELS ?= .whl
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
GPU_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 \
	manylinux2014_x86_64 manylinux1_x86_64

gpu-wheels:
	rm -rf $(WHEELS) && mkdir -p $(WHEELS)
	$(GPU_PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(addprefix --platform ,$(GPU_PLATFORMS)) -d $(WHEELS) \
		-r bench/gpu/wheels.txt
	@echo "gpu-wheels: $$(ls $(WHEELS)/*.whl | wc -l) wheels, $$(du -cb $(WHEELS)/*.whl | tail -1 \
		| awk '{printf "%.1f", $$1 / 1048576}') MiB in $(WHEELS) (a device call carries 64 MiB)"
	$(GPU_PYTHON) bench/gpu/deps.py --wheels $(WHEELS)

GPU_CHECK_ARGS ?=

gpu-check:
	$(GPU_PYTHON) bench/gpu/check.py --wheels $(WHEELS) $(GPU_CHECK_ARGS)

gpu-check-dry:
	$(GPU_PYTHON) bench/gpu/check.py --dry --wheels $(WHEELS)

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
