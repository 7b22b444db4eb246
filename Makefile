# The two commands a newcomer needs:
#   make demo   run the example crawl against the bundled flaky site
#   make test   run the whole test suite (starts Redis/PostgreSQL if they are not running)
# and, to run one tier of it: make test-unit | test-integration | test-e2e
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-unit test-integration test-e2e lint bench clean

# The import contracts of pyproject.toml ([tool.importlinter], docs/architecture.md).
LINT_IMPORTS := $(VENV)/bin/lint-imports --no-logo --no-cache
# Two pytest workers (pytest-xdist): the suite mostly waits (on crawls, servers,
# backoffs), so two halve its time on a 2-core machine; its tests keep their keys,
# databases and servers apart (tests/conftest.py). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal

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
	$(PY) -m ruff format --check .
	$(LINT_IMPORTS)
	$(PYTEST) $(PYTEST_ARGS)

# One tier each (tests/conftest.py marks every test unit, integration or e2e).
# The unit tier needs no server: it runs with the servers' URLs on a closed
# port, so a unit test that talks to Redis or PostgreSQL fails here.
CLOSED_SERVERS := RETRYQUEUE_TEST_REDIS_URL=redis://127.0.0.1:1/0 \
	RETRYQUEUE_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:1/none

test-unit: install
	$(CLOSED_SERVERS) $(PYTEST) -m unit $(PYTEST_ARGS)

test-integration: install
	bash scripts/ensure-services
	$(PYTEST) -m integration $(PYTEST_ARGS)

test-e2e: install
	bash scripts/ensure-services
	$(PYTEST) -m e2e $(PYTEST_ARGS)

# Benchmarks (not tests): writes docs/benchmarks.md; about half an hour on 2 cores.
# Their static site is Debian's nginx (nginx-light), started and stopped by the run.
bench: install
	bash scripts/ensure-services
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light; }
	$(PY) -m benchmarks

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(LINT_IMPORTS)

clean:
	rm -rf $(VENV) .tox .pytest_cache build *.egg-info
