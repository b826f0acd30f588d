# Two commands do all set-up on a fresh machine:
#   make run    install simfed and simulate the paper's 512-GPU scenario
#   make test   install everything (torch CPU build included), lint (ruff) and run the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: run test install install-dev figures bench lint clean gpu-check

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

# on a GPU machine, no network needed, under 8 minutes on one GPU: docs/gpu-check.md. Runs with
# the project's venv if there is one, else the machine's python3 (its torch, from the checkout)
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PY) -m realrun.gpu_check

lint: install-dev
	$(BIN)/ruff check simfed realrun tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
