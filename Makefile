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

test: install
	$(PY) -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

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
