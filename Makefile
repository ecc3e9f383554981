# Developer entry points. `make test` is `bash .ci/run`, what CI runs: every tier, each of which
# skips with the reason where this machine cannot run it, and fails instead in CI (CI=true or
# QUEUEWORKER_REQUIRE_CLUSTER=1). Where each tier runs: .ci/run's header and docs/testing.md.
VENV ?= .venv
PYTHON := $(VENV)/bin/python

.PHONY: test smoke images demo

$(PYTHON):
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet -e ".[controller,test]"

test:
	bash .ci/run

# The chart end to end: as root on Linux on the local real node (tests/cluster; images built on the
# local Debian base), elsewhere on kind, which needs a running Docker engine and kind's node image,
# present or pullable (kind and helm are built from the Go module proxy if missing).
# QUEUEWORKER_SMOKE_PROVIDER=kind|node chooses. Skips with the reason where the provider cannot run;
# fails instead in CI (CI=true or QUEUEWORKER_REQUIRE_CLUSTER=1).
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
