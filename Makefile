# ncclcheck: set-up, tests and cluster onboarding. `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build keeps CI and laptops small; on a GPU cluster pass your own, e.g.
# TORCH_SPEC='torch==2.13.0' TORCH_PIP_ARGS='--index-url <your CUDA wheel index>'.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?= $(if $(wildcard /opt/wheels),--find-links /opt/wheels)
STAMP := $(VENV)/.ncclcheck-installed
NPROC ?= 2
SCRIPT ?= playbooks/rank-conditional-collective/repro.py
PYTEST_ARGS ?=
# pytest-xdist workers for the whole suite: a rank test spends much of its time waiting
# on its ranks (a stall spell, a rendezvous, a stack capture), so on two cores four
# workers keep the CPUs busy (5% idle): 17-19 min for the suite on a fresh clone at the
# product's own timeouts (README).
# worksteal: an idle worker takes queued tests from a busy one, so the suite does not
# end on one worker still running the long tests it was handed at the start.
TEST_WORKERS ?= 4
# The package's bytecode, written once: an editable install is not compiled by pip, and
# where PYTHONDONTWRITEBYTECODE is set (this CI's image) every CLI call and every rank
# compiled ncclcheck again (0.3 s of a 0.6 s `ncclcheck --help`). compileall is
# incremental: only what changed since is compiled.
COMPILE := $(BIN)/python -m compileall -q -j 0 ncclcheck

.DEFAULT_GOAL := help
.PHONY: help install upgrade-pins browser test test-fast demo lint preflight probe doctor bench gpu-check clean

help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# pip compiles what it installs one file at a time (35 of the 55 s an install took on
# 2 cores); compileall on every core after it: 41 s. A file that does not compile (a
# package's Python 2 example) is skipped, as pip skips it.
SITE_PACKAGES = $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")

$(STAMP): pyproject.toml constraints.txt hatch_build.py ncclcheck/record/_fastcall.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first, pinned, so the package's torch>=2.4 is already satisfied.
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet --no-compile $(TORCH_PIP_ARGS) '$(TORCH_SPEC)'
	@# every other package at the version the suite last passed with (constraints.txt)
	$(BIN)/pip install --quiet --no-compile -c constraints.txt -e '.[test]'
	@$(BIN)/python -m compileall -q -j 0 $(SITE_PACKAGES) > /dev/null 2>&1 || true
	@touch $@

install: $(STAMP) ## Create .venv with the CPU torch wheel and ncclcheck[test] at the pinned versions (quick when done)

upgrade-pins: ## Resolve the newest test dependencies in a scratch venv, run the suite there, rewrite constraints.txt if it passes
	tools/upgrade-pins.sh $(PYTHON) '$(TORCH_SPEC)' $(TORCH_PIP_ARGS)

browser: ## Debian's chromium, for the HTML report's browser test (skipped without it)
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& timeout 300 apt-get install -y -qq chromium >/dev/null 2>&1 && echo "installed chromium"; } \
		|| echo "no chromium: the HTML report's browser test will be skipped"

test: $(STAMP) browser ## Install if needed, then run the whole test suite (real ranks included)
	@$(COMPILE)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

test-fast: $(STAMP) ## The unit tests (tests/unit): analysis, rules, lint, parsing; no ranks, under a minute
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

demo: $(STAMP) ## Preflight the rank-conditional-collective reproducer
	@$(COMPILE)
	$(BIN)/ncclcheck playbooks rank-conditional-collective
	@echo
	@echo "\$$ ncclcheck preflight --nproc-per-node 2 $(SCRIPT)"
	-$(BIN)/ncclcheck preflight --nproc-per-node 2 $(SCRIPT)

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check ncclcheck tests benchmarks playbooks
	$(BIN)/ruff format --check ncclcheck tests benchmarks playbooks
	$(BIN)/mypy

preflight: $(STAMP) ## Dry-run SCRIPT=path on NPROC ranks of this node (WORLD_SIZE=256: a virtual world of that size)
	$(BIN)/ncclcheck preflight $(if $(WORLD_SIZE),--world-size $(WORLD_SIZE)) --nproc-per-node $(NPROC) $(SCRIPT)

probe: $(STAMP) ## Check rendezvous and collectives on NPROC ranks of this node
	$(BIN)/ncclcheck probe --nproc-per-node $(NPROC)

doctor: $(STAMP) ## Diagnose the stuck job with PID=...
	@test -n "$(PID)" || { echo "usage: make doctor PID=<pid of a rank, torchrun or launcher>"; exit 2; }
	$(BIN)/ncclcheck doctor --pid $(PID)

bench: $(STAMP) ## Benchmarks: ranks waiting outside collectives, recorder overhead, time to a verdict (before/now), eval fast-forward, doctor at 4-64 ranks, doctor on healthy jobs, watch's cost, lint speed, probe, guard, scale, doctor --from at 256-4096 ranks
	$(BIN)/python benchmarks/bench_preflight.py
	$(BIN)/python benchmarks/bench_doctor.py
	$(BIN)/python benchmarks/bench_healthy.py
	$(BIN)/python benchmarks/bench_watch.py
	$(BIN)/python benchmarks/bench_lint.py
	$(BIN)/python benchmarks/bench_probe.py
	$(BIN)/python benchmarks/bench_guard.py
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_aftermath.py
	$(BIN)/python benchmarks/bench_verdict.py
	$(BIN)/python benchmarks/bench_eval_sets.py
	$(BIN)/python benchmarks/bench_outside_waits.py

gpu-check: $(STAMP) ## On a GPU node: preflight, probe, Flight Recorder and recorder cost on NCCL (pass a CUDA torch, see TORCH_SPEC)
	$(BIN)/python benchmarks/gpu_check.py

clean: ## Remove the venv and caches
	rm -rf $(VENV) .venv-upgrade .pytest_cache .ruff_cache .mypy_cache build dist
