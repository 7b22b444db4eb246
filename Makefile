# The two commands a newcomer needs:
#   make demo   run the example crawl against the bundled flaky site
#   make test   run the whole test suite (starts Redis/PostgreSQL if they are not running)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml setup.cfg
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,fast]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) example_project/run_demo.py

test: install
	bash scripts/ensure-services
	$(PY) -m ruff check scrapy_retryqueue tests example_project benchmarks
	$(PY) -m pytest $(PYTEST_ARGS)

# Benchmarks (not tests): writes docs/benchmarks.md; about ten minutes on 2 cores.
bench: install
	bash scripts/ensure-services
	$(PY) -m benchmarks

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) .tox .pytest_cache build *.egg-info
