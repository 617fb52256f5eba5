# Two entry points: `make demo` (the main job on a local control plane) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint-imports controlplane helm image clean

# The venv, with the package installed editable: pyproject's `package-dir` makes that one `.pth`
# file naming this checkout, so the harness, fakes, bench and tests import from it as well.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

controlplane:
	bash tools/build-controlplane.sh
	bash tools/build-kubevirt.sh

# helm for the chart tests (tests/e2e/test_helm.py), built and cached like the control plane
helm:
	bash tools/build-helm.sh

# The controller image (tools/build-image.sh): buildah, with the base made from Debian's packages
# (cached) unless BASE_IMAGE names one to pull, e.g. `make image BASE_IMAGE=python:3.11-slim`.
# tests/e2e/test_image.py runs it.
image:
	BASE_IMAGE="$(BASE_IMAGE)" bash tools/build-image.sh

demo: $(STAMP) controlplane
	$(VENV)/bin/gpu-binder demo

# The import contract first (pyproject's [tool.importlinter]: layers one way, production never
# imports the harness, fakes, bench or cli, no cycles), then the tests.
lint-imports: $(STAMP)
	$(VENV)/bin/lint-imports

# The steps before the tests run at once (make -j): on a cold machine helm's Go build (CPU)
# overlaps the image's apt-get, mmdebstrap and pip downloads (network); warm each is a quick check.
# Then tools/run-tests.sh: the in-memory suites beside the end-to-end ones (PYTEST_ARGS: one run).
test: $(STAMP)
	$(MAKE) --no-print-directory -j4 lint-imports controlplane helm image
	PY=$(PY) bash tools/run-tests.sh $(PYTEST_ARGS)

test-fast: $(STAMP) lint-imports
	$(PY) -m pytest -m "not e2e" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
