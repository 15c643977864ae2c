# The two commands of the README's quick start.
PYTHON ?= python3
STAMP := .install.stamp
JOBS ?= 2  # pytest-xdist workers for make test (each test process then runs one thread)

.PHONY: install demo test test-fast

# Installs this package and its PyPI dependencies (not Dassl: see README).
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m pip install -q -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PYTHON) scripts/demo.py

test: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m pytest -q -n $(JOBS) --dist worksteal

# Work in progress: the suite without the slow tests (torchrun, kill -9, sweeps, the accuracy
# test); about 3 to 4 minutes on 2 cores (docs/tests.md). CI runs the whole suite (make test).
test-fast: $(STAMP)
	$(PYTHON) -m pytest -q -n $(JOBS) --dist worksteal -m "not slow" --timeout 300
