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

.PHONY: setup setup-dev wordnet test repro clean-venv

# `make repro` needs the package alone; `make test` adds the dev extras (pytest, moto, dvc-s3, Ray: 42 packages, about
# an eighth of the install's CPU, none used by the demo; docs/benchmarks.md, "First run: where the time goes")
setup: $(STAMP) wordnet
setup-dev: $(DEV_STAMP) wordnet

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch from this machine's disk where available; plain pip elsewhere picks the right wheel
	$(PY) -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1" || $(PY) -m pip install --quiet torch torchvision
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(DEV_STAMP)

# WordNet for the demo world's class hierarchy: Debian's wordnet-base when we are root and it is missing.
wordnet:
	@if [ ! -f /usr/share/wordnet/data.noun ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base) >/dev/null; \
	fi

test: setup-dev
	$(PY) -m pytest -q

repro: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" dvc repro

clean-venv:
	rm -rf $(VENV)
