# Two commands: `make run` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
VPY := $(VENV)/bin/python

# The first Python >= 3.12 found: $(PYTHON) if given, then python3.13,
# python3.12, python3 on PATH, then pyenv's installed versions.
PYTHON ?= $(shell for p in python3.13 python3.12 python3 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do \
	  command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v $$p; break; }; \
	done)

.PHONY: run test install lint docs docs-serve bench clean

$(VENV)/.installed: pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "Python 3.12 or newer is needed (none found on PATH or under pyenv)." >&2; exit 1; fi
	@echo "Using $(PYTHON)"
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

# RUNS_EXAMPLES=1: the example kinds and demo apps (examples/), for development only.
run: install
	RUNS_EXAMPLES=$${RUNS_EXAMPLES:-1} $(VPY) manage.py up

# The linters first (ruff format and check, mypy, import contracts, makemigrations --check), then the
# documentation's strict build: CI runs `make test` and nothing else.
test: lint docs
	$(VPY) -m pytest

# mypy imports the settings (the django-stubs plugin), which only parse DATABASE_URL: it is given
# a URL nothing connects to, so it needs no database (manage.py would start the embedded one).
MYPY := DEBUG=1 DATABASE_URL=postgres://localhost/typecheck $(VENV)/bin/mypy config runs workers

# Development entry points: settings refuse to start with DEBUG off and no
# SECRET_KEY (`make run` turns DEBUG on in manage.py up, `make test` brings its own key).
lint: install
	$(VENV)/bin/ruff format --check config runs workers examples tests bench docs/gen
	$(VENV)/bin/ruff check config runs workers examples tests bench docs/gen
	$(MYPY)
	$(VENV)/bin/lint-imports --no-cache --no-logo
	DEBUG=$${DEBUG:-1} RUNS_EXAMPLES=1 $(VPY) manage.py makemigrations --check --dry-run

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link or anchor, a page
# missing from the nav, a `:::` naming code that is gone or an undocumented setting fails it.
# Only its warnings are shown (not --quiet, which hides them from strict mode too: it would pass).
docs: install
	@set -o pipefail; NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict 2>&1 | { grep -v '^INFO ' || true; }

# The site while you write it, rebuilt on every change.
docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

bench: install
	$(VPY) bench/engine.py

clean:
	rm -rf $(VENV) .data
