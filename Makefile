# Every target creates the virtual environment on first use (Python 3.12 through .python-version).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-gpu bench lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m blocksparse demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests

lint: $(STAMP)
	$(BIN)/ruff check blocksparse tests benchmarks
	$(BIN)/ruff format --check blocksparse tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
