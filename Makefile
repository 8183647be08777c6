# Two entry points for a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test lint mutants clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/convergent reproduce all --quick

# The suite in two passes: the single-process tests on $(TEST_WORKERS) pytest-xdist workers, then
# the tests that launch process groups (gloo ranks, torchrun --standalone, each on a free port),
# also on $(TEST_WORKERS) workers: their ranks are mostly busy, so two tests side by side gain
# little (121 s and 160 s in two runs against 166 s one at a time on 2 cores) but never lose.
# --dist loadgroup: tests of one xdist_group (two that share one torchrun run) share a worker.
# pytest's exit code 5 (no test collected) is no failure.
# --dist loadfile: a test file's tests run on one worker, so a module fixture that runs a study
# (the sparsity and descent smoke runs, the canary) is computed once, not once per worker:
# 8 min 53 s against 10 min 15 s for this pass on a fresh clone, the same 1777 tests.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow and not distributed"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no single-process tests"; rc=0; fi; \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "distributed and not slow"; rc2=$$?; \
	if [ $$rc2 -eq 5 ]; then echo "pytest collected no distributed tests"; rc2=0; fi; \
	if [ $$rc -ne 0 ]; then exit $$rc; fi; exit $$rc2

# Mutation testing of the numerical core ([tool.mutmut] in pyproject.toml); not part of
# `make test`: it takes about an hour on 2 cores. Survivors and their reasons: docs/testing.md.
mutants: install
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,mutation]'
	$(VENV)/bin/mutmut run --max-children 2
	$(VENV)/bin/mutmut results

lint: install
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(VENV)/bin/ruff format --check src tests benchmarks tools
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build *.egg-info mutants
