# distsched: `make run` starts a local scheduler, `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test test-postgres lint docs bench clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

install: $(VENV)/.installed

## Migrate the SQLite database, then run the web server and one worker that also ticks.
## Local development only: Django's debug mode (docs/deployment.md covers production).
run: export DJANGO_DEBUG = 1
run: install
	@# The editable install does not byte-compile the checkout (a wheel's install does): every
	@# process would compile ~100 modules again, about 0.1 s of each worker's start-up.
	$(PY) -m compileall -q distsched_app scheduler_project examples > /dev/null
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_demo_schedules
	$(PY) manage.py ensure_demo_admin
	@echo ""
	@echo "  admin:    http://$(HOST):$(PORT)/admin/"
	@echo "  API docs: http://$(HOST):$(PORT)/api/docs"
	@echo "  metrics:  http://$(HOST):$(PORT)/metrics"
	@echo "  Ctrl-C stops the server and the worker."
	@echo ""
	@trap 'kill -TERM $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT; \
	$(PY) manage.py runworker --with-tick --queues '*' & worker=$$!; \
	$(PY) manage.py runserver --noreload $(HOST):$(PORT)

## The whole suite (the database comes from DATABASE_URL; SQLite by default).
test: install
	$(PY) manage.py makemigrations --check --dry-run
	DJANGO_SETTINGS_MODULE=tests.settings $(PY) manage.py makemigrations --check --dry-run
	$(PY) -m pytest

test-postgres: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/distsched} $(MAKE) test

## Static checks, as CI runs them: ruff (lint and format) and mypy on distsched_app/.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## The documentation site (Sphinx + MyST, sources and conf.py under docs/) into docs/_build/html.
## Strict, as CI builds it: any warning fails (a broken link or reference, a page in no table of contents).
docs: install
	$(VENV)/bin/sphinx-build -E -W --keep-going -n -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info docs/_build docs/_generated

## Quick pass of every benchmark (a few minutes at most; bench/README.md gives the full sizes).
## BENCH_DB=postgres uses scratch databases on $${BENCH_PG_URL:-postgresql://postgres@127.0.0.1:5432}.
BENCH_DB ?= sqlite
bench: install
	$(PY) bench/throughput.py --db $(BENCH_DB) --workers 1 --runs 500
	$(PY) bench/throughput.py --db $(BENCH_DB) --workers 4 --runs 500
	$(PY) bench/tick.py --db $(BENCH_DB) --due 1000 --idle 10000 --repeat 1 --idle-ticks 5
	$(PY) bench/lag.py --db $(BENCH_DB) --duration 6 --schedules 60
	$(PY) bench/scale.py --db $(BENCH_DB) --runs 20000 --requests 5
	$(PY) bench/memory.py --db $(BENCH_DB) --runs 3000 --warmup 500
	$(PY) bench/bulk.py --db $(BENCH_DB) --dead 5000 --others 5000
