# The few commands a person runs. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 8000
# Web processes for `make serve` / `make demo`; empty = the default (1 in embedded mode; with PostgreSQL and
# Redis GPUPOOL_WEB_WORKERS, else one per CPU, at least 2).
WORKERS ?=
WORKERS_ARG := $(if $(WORKERS),--workers $(WORKERS),)

.PHONY: demo serve test lint format bench clean install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Reinstall whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/gpupool demo --host $(HOST) --port $(PORT) $(WORKERS_ARG)

# The web tier alone (production: beside `celery -A portal worker`, `celery -A portal beat` and the agents;
# docs/production.md).
serve: $(VENV)/.installed
	$(BIN)/gpupool serve --host $(HOST) --port $(PORT) $(WORKERS_ARG)

test: $(VENV)/.installed
	$(BIN)/python scripts/test_prereqs.py
	$(BIN)/pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py permissions_doc --check

format: $(VENV)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The manual (docs/, mkdocs with the material theme) into site/; --strict fails on a broken link or nav entry.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(VENV)/.installed
	@for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) var .pytest_cache

# Fuzz the REST API with schemathesis against a live server (bounded; also part of `make test`).
.PHONY: schemathesis
schemathesis: $(VENV)/.installed
	$(BIN)/pytest -q -s tests/tenants/test_api_fuzz.py tests/security/test_api_fuzz.py
