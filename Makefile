# shardsmith: `make demo` and `make test` work on a fresh machine (they create .venv when missing).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test bench lint install-dev clean data

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.core: $(VENV)/bin/python pyproject.toml
	$(PIP) install -e '.[images,root]'
	touch $@

$(VENV)/.dev: $(VENV)/bin/python pyproject.toml
	$(PIP) install -e '.[dev]'
	touch $@ $(VENV)/.core

install-dev: $(VENV)/.dev

demo: $(VENV)/.core
	$(PY) examples/demo.py --out demo-out

test: $(VENV)/.dev
	$(PY) -m pytest

# make data RECIPE=recipes/NAME.toml: run a data-preparation recipe on this machine
data: $(VENV)/.dev
	@test -n "$(RECIPE)" || { echo "usage: make data RECIPE=recipes/NAME.toml"; exit 2; }
	$(PY) -m shardsmith run $(RECIPE)

bench: $(VENV)/.dev
	$(PY) bench/bench_pack_tokens.py

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check shardsmith tests bench examples

clean:
	rm -rf demo-out .pytest_cache
