# Two commands matter: `make demo` and `make test`. Both bring up .venv first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lock-installed

.PHONY: venv demo test test-pr quality style lock

venv: $(STAMP)

# Idempotent: redone only when the lock or pyproject.toml changes. --no-deps keeps pip from
# resolving anything itself (a CUDA torch, torchvision, triton...): the lock is the whole set.
$(STAMP): requirements/lock.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check pip==26.3
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -r requirements/lock.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: venv
	$(VENV)/bin/dsparklab demo

test: venv
	$(PY) -m pytest

# The fast gate: store, analysis, plots, importers, the lab helpers, packaging and the tap
# arithmetic; no wheel download, under 2 minutes.
test-pr: venv
	$(PY) -m pytest tests/unit tests/packaging tests/vllm/test_tap_core.py -m "not slow and not network"

quality: venv
	$(VENV)/bin/ruff check dsparklab tests benchmarks
	$(VENV)/bin/ruff format --check dsparklab tests benchmarks
	$(VENV)/bin/mypy

style: venv
	$(VENV)/bin/ruff check --fix dsparklab tests benchmarks
	$(VENV)/bin/ruff format dsparklab tests benchmarks

# Refresh the lock: see README.md, "Environment".
lock:
	bash requirements/make_lock.sh
