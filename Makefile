# Two commands for a new user: `make demo` and `make test`. Both create .venv if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing pathways into $(VENV) (pip, about 20 s, once) ..."
	$(BIN)/python -m pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/moe_routing.py

# 2 pytest-xdist workers: most tests wait on the processes they start. loadgroup keeps the
# tests marked xdist_group (Slurm's real jobs) on one worker, one after the other.
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup

bench: $(STAMP)
	$(BIN)/python -m bench.plaque_bench

clean:
	rm -rf $(VENV) build *.egg-info
