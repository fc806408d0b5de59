# Two commands matter: `make demo` and `make test`. Both bring up .venv first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lock-installed
# Spark (the counting stage's second engine, pyspark in the lock) needs a Java runtime:
# Debian's OpenJDK 17, installed by the venv target when no `java` is on the PATH.
JDK_PACKAGE := openjdk-17-jre-headless
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv demo test test-pr quality style lock

venv: $(STAMP)

# Idempotent: redone only when the lock or pyproject.toml changes. --no-deps keeps pip from
# resolving anything itself (a CUDA torch, torchvision, triton...): the lock is the whole set.
$(STAMP): requirements/lock.txt pyproject.toml
	command -v java >/dev/null 2>&1 || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(JDK_PACKAGE); }
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check pip==26.3
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -r requirements/lock.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: venv
	$(VENV)/bin/dsparklab demo

# Two workers (this machine's cores), one test file each at a time: a file's module
# fixtures (a vLLM engine, a served model, a report) are built once, on one worker. The
# files go out in tests/conftest.py's order (longest directories first), not xdist's.
test: venv
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder

# The fast gate: store, analysis, plots, importers, the lab helpers, packaging and the tap
# arithmetic; no wheel download, no Spark session, under 2 minutes.
test-pr: venv
	$(PY) -m pytest tests/unit tests/packaging tests/vllm/test_tap_core.py \
		-m "not slow and not network and not spark"

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
