# distsched: `make run` starts a local scheduler, `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test test-postgres lint bench clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

install: $(VENV)/.installed

## Migrate the SQLite database, then run the web server and one worker that also ticks.
run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_demo_admin
	@echo ""
	@echo "  admin:    http://$(HOST):$(PORT)/admin/"
	@echo "  API docs: http://$(HOST):$(PORT)/api/docs"
	@echo "  metrics:  http://$(HOST):$(PORT)/metrics"
	@echo "  Ctrl-C stops the server and the worker."
	@echo ""
	@trap 'kill -TERM $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT; \
	$(PY) manage.py runworker --with-tick & worker=$$!; \
	$(PY) manage.py runserver --noreload $(HOST):$(PORT)

## The whole suite (the database comes from DATABASE_URL; SQLite by default).
test: install
	$(PY) manage.py makemigrations --check --dry-run
	DJANGO_SETTINGS_MODULE=tests.settings $(PY) manage.py makemigrations --check --dry-run
	$(PY) -m pytest

test-postgres: install
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/distsched} $(MAKE) test

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build dist *.egg-info
