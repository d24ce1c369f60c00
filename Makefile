# The two commands of the README. Both set up .venv first (idempotent, offline apart from package registries).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
# torch's OpenMP threads spin 300,000 times at each barrier before sleeping; with another job on one of the cores the
# spinning starves the thread that has work and toy training drops from 5.3 to 0.4-0.6 steps/s. 10,000 keeps 96% of
# the speed alone and 4.5x the loaded speed, without changing any number (docs/benchmarks.md, "Threads under load").
# Every stage process sets it itself (vlbench.portable.THREAD_WAIT); the export covers the processes that are not
# stages: pytest's own (tests that train in-process) and the benchmarks.
export GOMP_SPINCOUNT ?= 10000

.PHONY: setup setup-dev wordnet test repro verify-demo clean-venv

# `make repro` needs the package alone; `make test` adds the dev extras (pytest, moto, dvc-s3, Ray: 42 packages, about
# an eighth of the install's CPU, none used by the demo; docs/benchmarks.md, "First run: where the time goes")
setup: $(STAMP) wordnet
setup-dev: $(DEV_STAMP) wordnet

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch from this machine's disk where available; plain pip elsewhere picks the right wheel
	$(PY) -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1" || $(PY) -m pip install --quiet torch torchvision
	$(PY) -m pip install --quiet -c constraints.txt -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(DEV_STAMP)

# WordNet for the demo world's class hierarchy: Debian's wordnet-base when we are root and it is missing (waiting for
# another package install's lock instead of failing: scripts/apt-install).
wordnet:
	@if [ ! -f /usr/share/wordnet/data.noun ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		scripts/apt-install wordnet-base; \
	fi

# Two pytest-xdist workers, a module each at a time (`--dist loadfile`: a module's fixtures are built once, in one
# worker); the miniature demo runs the pipeline modules copy are built once for both (tests/conftest.py, smoke_run,
# flows_demo); `--no-loadscope-reorder` keeps conftest's order, the longest modules first (LONGEST_FIRST).
# `make test TEST_WORKERS=0` runs in one process. docs/benchmarks.md, "The test suite".
TEST_WORKERS ?= 2
test: setup-dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

repro: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" dvc repro

# The demo's toy model arrives with the clone (data/models/toy/, kept in git): retrain it from scratch (about 7 minutes
# on 2 cores) and check that the committed checkpoint and log come out byte for byte (docs/architecture.md, "The toy
# checkpoint arrives with the clone"). Not in CI.
verify-demo: setup
	git ls-files --error-unmatch data/models/toy/checkpoint.pt data/models/toy/train_log.csv >/dev/null
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" dvc repro --force pretrain@toy
	git diff --exit-code --stat -- data/models/toy/checkpoint.pt data/models/toy/train_log.csv
	@echo "verify-demo: data/models/toy/checkpoint.pt and train_log.csv retrained byte for byte"

clean-venv:
	rm -rf $(VENV)
