# Two commands do all set-up on a fresh machine:
#   make run    install simfed and simulate the paper's 512-GPU scenario
#   make test   install everything (torch CPU build included), lint (ruff) and run the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: run test install install-dev figures bench lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-dev: $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[real,dev,distributed]"

run: install
	$(BIN)/simfed run scenarios/512gpu.yaml

test: install-dev
	$(BIN)/ruff check simfed realrun tests
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

figures: install
	$(BIN)/simfed figures

bench: install
	$(BIN)/simfed bench

lint: install-dev
	$(BIN)/ruff check simfed realrun tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
