# Developer entry points. CI runs `bash .ci/run` (every tier but smoke).
VENV ?= .venv
PYTHON := $(VENV)/bin/python

.PHONY: test smoke images demo

$(PYTHON):
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet -e ".[controller,test]"

test:
	bash .ci/run

# The chart end to end on kind: needs a running Docker engine; kind and helm are built from the
# Go module proxy if missing. Skips (with the reason) where Docker is not there.
smoke: $(PYTHON)
	$(PYTHON) -m pytest -m smoke tests/smoke -ra -p no:cacheprovider

images:
	docker build --file Dockerfile.worker --tag queueworker:dev .
	docker build --file Dockerfile.controller --tag queueworker-controller:dev .

demo: $(PYTHON)
	$(VENV)/bin/queueworker demo
