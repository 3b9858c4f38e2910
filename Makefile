# Two entry points for a fresh machine:  make test   (set up, run the tests)
# The virtual environment is made once and refreshed when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: setup test

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[test]'
	touch $@

setup: $(VENV)/.installed

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
