# verl-gdro developer entry points. Each target creates (once) and reuses a local virtual
# environment with CPU torch 2.13.0, verl 0.9.1 core (no GPU extras) and this package (editable).
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-v1
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv demo demo-quick test test-fast lint bench test-e2e clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	# Pin the CPU build first: verl's extras would pull a CUDA torch of several GB.
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q "verl[verl-core]==0.9.1" "torch==2.13.0"
	$(VPY) -m pip install -q -e ".[test]" "torch==2.13.0"
	touch $(STAMP)

demo: venv
	$(VENV)/bin/verl-gdro demo $(DEMO_ARGS)

demo-quick: venv
	$(VENV)/bin/verl-gdro demo --quick $(DEMO_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

# The whole suite (slow tests included), as CI runs it.
test: venv lint
	$(VPY) -m pytest tests -m "not e2e" $(PYTEST_ARGS)

# The fast suite for the edit-test loop.
test-fast: venv
	$(VPY) -m pytest tests -m "not slow and not e2e" -q $(PYTEST_ARGS)

bench: venv
	$(VPY) benchmarks/controllers.py

# verl's real main_ppo on CPU, in its own pinned environment (see docs/e2e.md).
test-e2e:
	bash tests/e2e/run.sh

clean:
	rm -rf $(VENV) .venv-e2e .pytest_cache .ruff_cache
