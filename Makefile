# Developer entry points. CI runs `bash .ci/run` (every tier, smoke included).
VENV ?= .venv
PYTHON := $(VENV)/bin/python

.PHONY: test smoke images demo

$(PYTHON):
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet -e ".[controller,test]"

test:
	bash .ci/run

# The chart end to end: on the local real node as root (tests/cluster; images built on the local
# Debian base), else on kind (a running Docker engine; kind and helm are built from the Go module
# proxy if missing). QUEUEWORKER_SMOKE_PROVIDER=kind|node chooses. Skips, with the reason, where
# the provider cannot run.
smoke: $(PYTHON)
	$(PYTHON) -m pytest -m smoke tests/smoke -ra -p no:cacheprovider

# Both images on PYTHON_IMAGE; when that can be neither found nor pulled (no registry), on a
# Debian base made here instead (python -m tests.containers base: debootstrap, root, apt).
PYTHON_IMAGE ?= python:3.11-slim-bookworm
images: $(PYTHON)
	@base='$(PYTHON_IMAGE)'; \
	if ! docker image inspect "$$base" >/dev/null 2>&1 && ! docker pull --quiet "$$base" >/dev/null; then \
	  echo "cannot pull $$base: building on a local Debian base" >&2; \
	  base=$$($(PYTHON) -m tests.containers base) || exit 1; \
	fi; \
	set -x; \
	docker build --file Dockerfile.worker --build-arg PYTHON_IMAGE="$$base" --tag queueworker:dev . && \
	docker build --file Dockerfile.controller --build-arg PYTHON_IMAGE="$$base" --tag queueworker-controller:dev .

demo: $(PYTHON)
	$(VENV)/bin/queueworker demo
