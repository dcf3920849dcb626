# tinyscale: the only entry points. `make serve` shows the course, `make test` checks it.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        ?= .venv
PY          := $(VENV)/bin/python
BIN         := $(VENV)/bin
# This install path pins torch; the package itself asks only for a range, so a
# cluster user who runs `pip install -e .` keeps the torch build they have.
TORCH_VERSION ?= 2.14.1
# Extra pip arguments for torch, e.g. the CPU wheel index in GitHub Actions.
TORCH_PIP_ARGS ?=
STAMP       := $(VENV)/.tinyscale-installed
MERMAID     := docs/assets/vendor/mermaid.min.js

# Commands on the pages say `python` and `torchrun`: they must find the venv's.
export PATH := $(abspath $(VENV))/bin:$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))
export TINYSCALE_CACHE ?= $(CURDIR)/.cache/tinyscale
export NO_MKDOCS_2_WARNING := 1
export PYTHONDONTWRITEBYTECODE := 1
export TOKENIZERS_PARALLELISM := false
# DeepSpeed installs as pure Python (no C++ op compiled by pip); an op it needs later is
# JIT-built once into this cache, which every later run reuses. The tinyscale scripts
# need none on a CPU (see docs/workshop/deepspeed.md).
export DS_BUILD_OPS := 0
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
# torchtitan reads our corpus through Hugging Face datasets: its cache stays in the repo.
export HF_HOME ?= $(CURDIR)/.cache/huggingface
# The pages' outputs are compared digit for digit with a run. On x86, torch, MKL and oneDNN
# pick their kernels by the CPU (AVX2, AVX-512, AMX), and each rounds differently in the
# last digits: pin all three to their AVX2 kernels so a run on any x86 machine gives the
# recorded numbers (tests/docs/test_pinned_kernels.py checks it). Other CPUs are left alone.
ifeq ($(shell uname -m),x86_64)
export ATEN_CPU_CAPABILITY ?= avx2
export MKL_CBWR ?= AVX2
export ONEDNN_MAX_CPU_ISA ?= AVX2
endif

.PHONY: help setup system-deps serve build test rerun lint format bench gpu-check figures clean cluster-up cluster-down

help:
	@echo "make serve    set up, build and serve the course at http://127.0.0.1:8000"
	@echo "make test     set up and run every check (lint, strict build, tests, page code blocks, browser)"
	@echo "make rerun    after make test: the pages that write, run again in place (CI does)"
	@echo "make setup    create $(VENV) and install everything (idempotent)"
	@echo "make lint     ruff check + ruff format --check"
	@echo "make bench    run the benchmarks (ratios measured side by side)"
	@echo "make gpu-check  on a CUDA machine: run the pages' GPU blocks that fit it, record each run"
	@echo "make figures  regenerate every plot and recorded output the site shows"
	@echo "make clean    remove build outputs (keeps $(VENV))"
	@echo "make cluster-up    start a 2-node SLURM cluster on this machine (root, Debian: slurm-wlm, munge)"
	@echo "make cluster-down  stop it, and remove its files"

setup: system-deps $(STAMP) $(MERMAID)

system-deps:
	@bash tools/install_system_packages.sh

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install "torch==$(TORCH_VERSION)" $(TORCH_PIP_ARGS)
	$(BIN)/pip install -e ".[docs,test,cluster,workflows]"
	touch $(STAMP)

$(MERMAID):
	@bash tools/fetch_web_assets.sh

build: setup
	$(BIN)/mkdocs build --strict

serve: setup
	$(BIN)/mkdocs serve --strict -a 127.0.0.1:8000

lint: setup
	$(BIN)/ruff check conftest.py code tests tools benchmarks
	$(BIN)/ruff format --check conftest.py code tests tools benchmarks

format: setup
	$(BIN)/ruff check --fix conftest.py code tests tools benchmarks
	$(BIN)/ruff format conftest.py code tests tools benchmarks

# Three pytest workers on two cores: with two, the cores idled about a quarter of the time
# (SLURM jobs, timeouts, the browser); a third worker fills it (pytest 21.9 -> 18.8 min).
# conftest.py groups what must run on one worker, in order.
TEST_WORKERS ?= 3

# The workers, each starting processes of its own, keep more threads busy than there are
# cores. OpenMP threads that spin while they wait then steal each other's cores: two
# 2-thread trainings side by side took 84 s each instead of 4 s. Passive waiting costs a
# run alone a little and saves the suite most of its time (OMP_WAIT_POLICY only changes
# how threads wait, not how work is split, so every number stays the same).
test rerun: export OMP_WAIT_POLICY := PASSIVE
# One OpenMP thread per process, as torchrun gives each of several ranks. A reduction
# split over T threads sums in an order that depends on T, so a run's last digits depend
# on the core count; with one thread they are the same on every machine, and the recorded
# outputs (`make figures`) match a test's fresh run. It also spends less CPU on tiny
# tensors: the Lab 1, large-batch and Session A pages with their tests took 287 s of CPU
# instead of 324 s.
test rerun figures: export OMP_NUM_THREADS := 1
# Every Python process of the run starts faster: it collects cyclic garbage less often,
# and imports torch._dynamo only once something compiles (tests/startup/sitecustomize.py
# says why, and what each saves; no result changes).
test rerun: export PYTHONPATH := $(CURDIR)/tests/startup$(if $(PYTHONPATH),:$(PYTHONPATH))
# The browser test opens the site `build` has just made instead of building it again.
test: export TINYSCALE_SITE := $(CURDIR)/site
test: setup lint build
	$(BIN)/pytest --codeblocks -n $(TEST_WORKERS) --dist loadgroup --durations=15 tests docs

# A second run of the pages whose blocks write under runs/, in the checkout the first run
# left (CI runs it after `make test`): conftest.py removes each page's folders before its
# first block, so the second run prints what the first did.
RERUN_PAGES ?= docs/workflows/data-at-scale.md docs/workshop/checkpoints.md docs/week-4/train-any-shape.md
rerun: setup
	$(BIN)/pytest --codeblocks -n $(TEST_WORKERS) --dist loadgroup $(RERUN_PAGES)

bench: setup
	$(PY) benchmarks/run_all.py

# The pages' GPU blocks (tools/gpu_check.py), on a machine with CUDA: the plan first (which
# blocks fit its GPUs), then those blocks and the tests that need CUDA, each with a time
# limit, about 10 minutes in all; one record per page in docs/generated/gpu/, which the
# site shows under each block. `python tools/gpu_check.py --list` prints only the plan.
gpu-check: setup
	$(PY) tools/gpu_check.py

figures: setup
	$(PY) tools/make_figures.py
	for script in tools/figures_*.py; do $(PY) $$script || exit 1; done

clean:
	@if [ -d build/slurm ]; then bash tools/slurm/cluster.sh down; fi  # stop a running cluster first
	rm -rf site .cache/mkdocs build runs logs .pytest_cache .ruff_cache

# A real SLURM cluster on this machine (munged, slurmctld, one slurmd per simulated node);
# state in build/slurm. Then: export SLURM_CONF=$(CURDIR)/build/slurm/etc/slurm.conf
cluster-up:
	@bash tools/slurm/cluster.sh up

cluster-down:
	@bash tools/slurm/cluster.sh down
