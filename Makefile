# `make demo` and `make test` each build .venv from pyproject.toml when it is missing or stale.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# One stamp per extras set, rebuilt when pyproject.toml changes.
$(VENV)/.stamp-%: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e ".[$(subst +,$(comma),$*)]"
	touch $@

comma := ,

demo: $(VENV)/.stamp-dev
	$(VENV)/bin/steadyfeed demo

test: $(VENV)/.stamp-dev
	$(PY) -m pytest -q

bench: $(VENV)/.stamp-dev+bench
	$(PY) benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .hypothesis
