# rlinf-embodied: `make demo` runs the main job, `make test` the test suite.
# Each target runs `setup` first; setup is idempotent and quiet when nothing is missing.
PY := .venv/bin/python
VPY := .venv-vllm/bin/python
CLI := $(PY) -m rlinf_embodied.cli
export MUJOCO_GL ?= egl
# Cached bytecode: without it every process (each Ray worker too) recompiles torch, ray, ... from
# source, which on a loaded 2-core machine outlasts Ray's fixed raylet start-up wait.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test test-all doctor bench gpu-check lint docs clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(CLI) doctor
	$(CLI) train configs/maniskill_pushcube_ppo_mlp.yaml

test: setup
	$(PY) -m pytest -q -m "not slow"
	@# vLLM tests run in the second venv (.venv-vllm, setup.sh section 4); exit 5 = none collected
	@[ ! -x $(VPY) ] || { $(VPY) -m pytest -q -m "vllm and not slow" tests/reasoning/test_vllm*.py; \
	  rc=$$?; [ $$rc = 0 ] || [ $$rc = 5 ]; }

test-all: setup
	$(PY) -m pytest -q
	@[ ! -x $(VPY) ] || { $(VPY) -m pytest -q -m vllm tests/reasoning/test_vllm*.py; \
	  rc=$$?; [ $$rc = 0 ] || [ $$rc = 5 ]; }

doctor: setup
	$(CLI) doctor

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b --quick | tail -n 1; done

# Every accelerator path on one GPU (< 10 min there); on CPU each check says "skipped: no CUDA".
gpu-check: setup
	$(PY) scripts/gpu_check.py

# ruff, then the import-layer contracts of pyproject.toml ([tool.importlinter]) and the cycle check
lint: setup
	$(PY) -m ruff check .
	$(PY) scripts/lint_imports.py
	.venv/bin/lint-imports --no-cache

# the docs site (mkdocs.yml, docs/) into site/; --strict turns warnings (broken links) into errors
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

clean:
	rm -rf runs .pytest_cache site
