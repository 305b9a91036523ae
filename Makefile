# Developer and CI entry points. Everything runs from the project venv (.venv).
#   make install    create .venv (if missing), install the package with its dev extra, build the assets
#   make assets     the vendored browser files (npm ci --prefix web, copied to botmemory/static/vendor)
#   make up         local stack: Neo4j + Redis + API + worker (python -m tools.devstack up), and the
#                   offline model stub when OPENAI_BASE_URL is not set
#   make model      the offline model stub in the foreground (python -m tools.model_stub; ARGS='--port 8099')
#   make down       stop the local stack and the test stack
#   make test       start the test-profile Neo4j/Redis, then pytest (extra flags: make test ARGS='-k foo')
#   make test-unit  the unit tier: pure functions in seconds, no services (tests/unit; ARGS as for test)
#   make test-deep  the Hypothesis access-model and label tests with 200 examples
#   make bench      the memory benchmark (bench/memory_bench.py)
#   make bench-learning  the learning benchmark (bench/learning_bench.py; own Redis db 5)
#   make soak       10 minutes of mixed traffic, a worker kill -9 and a Redis restart (own stores; not in CI)
#   make eval       LoCoMo retrieval recall through the public API (eval/locomo.py; own Redis db 6)
#   make lint       ruff check + ruff format --check + the layer contract (lint-imports)
#   make layers     which package imports which (python -m tools.layers)
#   make typecheck  pyright (strict, see pyproject.toml)
#   make demo       a guided tour against the running stack (make demo DEMO_MODEL=gpt-4o-mini; without
#                   OPENAI_BASE_URL it uses the offline model stub)
#   make mcp        the MCP server over streamable HTTP for the running stack (MCP_PORT, default 8765)
#   make client     regenerate the Python client (client/) from the schema snapshot and client/queries

SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# ariadne-codegen needs graphql-core < 3.3, Strawberry >= 3.3: the generator has a venv of its own.
CODEGEN_VENV := .venv-codegen
CODEGEN := $(CODEGEN_VENV)/bin/ariadne-codegen
ARGS ?=

# The test profile: own data dir and ports, so it runs beside the local stack (override the
# ports to run two checkouts' suites at once, e.g. `TEST_BOLT_PORT=27687 make test`).
TEST_BOLT_PORT ?= 17687
TEST_REDIS_PORT ?= 16379
TEST_API_PORT ?= 18000
TEST_ENV := BOTMEMORY_ENV=test BOTMEMORY_DATA_DIR=.data/test \
	BOTMEMORY_NEO4J_BOLT_PORT=$(TEST_BOLT_PORT) BOTMEMORY_NEO4J_URI=bolt://127.0.0.1:$(TEST_BOLT_PORT) \
	BOTMEMORY_REDIS_PORT=$(TEST_REDIS_PORT) BOTMEMORY_REDIS_URL=redis://127.0.0.1:$(TEST_REDIS_PORT)/0 \
	BOTMEMORY_API_PORT=$(TEST_API_PORT)

# The soak's own stores: it restarts its Redis, so nothing else may use them.
SOAK_ENV := BOTMEMORY_ENV=test BOTMEMORY_DATA_DIR=.data/soak \
	BOTMEMORY_NEO4J_BOLT_PORT=19687 BOTMEMORY_NEO4J_URI=bolt://127.0.0.1:19687 \
	BOTMEMORY_REDIS_PORT=19379 BOTMEMORY_REDIS_URL=redis://127.0.0.1:19379/0 BOTMEMORY_API_PORT=19000

.PHONY: layers install assets up down test test-unit test-deep bench bench-channel bench-learning soak eval lint typecheck status demo mcp client model

# The project with its dev extra, the Python client (its own distribution, used by the demo and
# tests/test_client.py) and the client's code generator (tests/test_client.py checks its output).
install: $(CODEGEN)
	@test -x $(VENV)/bin/pip || { rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -e '.[dev]' -e ./client
	$(PY) -m tools.assets
	@touch $(INSTALLED)

# Skips npm while botmemory/static/vendor matches web/package-lock.json (a stamp).
assets: | $(INSTALLED)
	$(PY) -m tools.assets

$(CODEGEN): client/requirements-codegen.txt
	@test -x $(CODEGEN_VENV)/bin/pip || { rm -rf $(CODEGEN_VENV) && $(PYTHON) -m venv $(CODEGEN_VENV); }
	$(CODEGEN_VENV)/bin/pip install -q -r client/requirements-codegen.txt
	@touch $@

# The client's generated packages, written anew from schema/schema.graphql and client/queries
# (run after a schema or operation change; tests/test_client.py fails while they are stale).
client: $(CODEGEN)
	rm -rf client/botmemory_client/generated_async client/botmemory_client/generated_sync
	cd client && ../$(CODEGEN) --config codegen-async.toml >/dev/null && ../$(CODEGEN) --config codegen-sync.toml >/dev/null

# Order-only prerequisite of the targets below: install when the venv is missing, when the last
# install did not finish (a network error half way left a venv without its packages, and every
# later target failed on an import), or when what it installs changed since (a pull that adds a
# dependency). The stamp is written by a finished install.
$(INSTALLED): pyproject.toml client/pyproject.toml web/package-lock.json
	$(MAKE) install

up: | $(INSTALLED)
	$(PY) -m tools.devstack up

down:
	@if [ -x $(PY) ]; then \
		rc=0; \
		$(PY) -m tools.devstack down || rc=1; \
		$(TEST_ENV) $(PY) -m tools.devstack down || rc=1; \
		exit $$rc; \
	fi

status: | $(INSTALLED)
	$(PY) -m tools.devstack status
	$(TEST_ENV) $(PY) -m tools.devstack status

test: | $(INSTALLED)
	$(PY) -m tools.devstack test-tools
	$(TEST_ENV) $(PY) -m tools.devstack services
	$(TEST_ENV) $(VENV)/bin/pytest $(ARGS)

# Pure functions only: no Neo4j, Redis, API or model server (tests/unit/conftest.py refuses their fixtures).
test-unit: | $(INSTALLED)
	$(VENV)/bin/pytest -q tests/unit $(ARGS)

# The property tests run deeper than in CI (about 5–10 minutes here).
test-deep: | $(INSTALLED)
	$(TEST_ENV) $(PY) -m tools.devstack services
	BOTMEMORY_HYPOTHESIS_EXAMPLES=200 BOTMEMORY_HYPOTHESIS_STEPS=40 $(TEST_ENV) $(VENV)/bin/pytest -q \
		tests/test_access_model.py tests/test_search_access.py tests/test_label_equivalence.py $(ARGS)

# Benchmarks against the test-profile stack (own ids, cleaned up after): make bench ARGS='--quick'
bench: | $(INSTALLED)
	$(TEST_ENV) $(PY) -m tools.devstack services
	$(TEST_ENV) $(PY) -m bench.memory_bench $(ARGS)

# A group chat's context as its channel grows to 20,000 members (bench/channel_bench.py).
bench-channel: | $(INSTALLED)
	$(TEST_ENV) $(PY) -m tools.devstack services
	$(TEST_ENV) $(PY) -m bench.channel_bench $(ARGS)

# Learning overhead (latency and throughput, scripted model) with its own workers on Redis db 5,
# apart from a test suite's queue on db 0: make bench-learning ARGS='--quick'
bench-learning: | $(INSTALLED)
	$(TEST_ENV) $(PY) -m tools.devstack services
	$(TEST_ENV) BOTMEMORY_REDIS_URL=redis://127.0.0.1:$(TEST_REDIS_PORT)/5 $(PY) -m bench.learning_bench $(ARGS)

# Mixed traffic for 10 minutes with a worker kill -9 and a Redis restart (bench/soak.py): make soak
# [ARGS='--minutes 3']; results in bench/soak-results.md. Its stores stop with it.
soak: | $(INSTALLED)
	$(SOAK_ENV) $(PY) -m tools.devstack services
	$(SOAK_ENV) $(PY) -m bench.soak $(ARGS); rc=$$?; $(SOAK_ENV) $(PY) -m tools.devstack down; exit $$rc

# Retrieval recall on LoCoMo conversations replayed through the public API (scripted model; own API,
# worker and Redis db 6): make eval ARGS='--conversations conv-41 --questions 20' | '--all' | '--leak-check'
eval: | $(INSTALLED)
	$(TEST_ENV) $(PY) -m tools.devstack services
	$(TEST_ENV) BOTMEMORY_REDIS_URL=redis://127.0.0.1:$(TEST_REDIS_PORT)/6 $(PY) -m eval.locomo $(ARGS)

lint: | $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

layers: | $(INSTALLED)
	$(PY) -m tools.layers

typecheck: | $(INSTALLED)
	$(VENV)/bin/pyright

# The offline model stub in the foreground, for an API run some other way (point it at
# http://127.0.0.1:8099/v1 with OPENAI_BASE_URL): make model [ARGS='--port 8099']
model: | $(INSTALLED)
	$(PY) -m tools.model_stub $(ARGS)

# A guided tour against the running stack (`make up`): make demo [DEMO_MODEL=gpt-4o-mini]. Without
# OPENAI_BASE_URL the stack runs the offline model stub, which serves any model name.
DEMO_MODEL ?= $(if $(OPENAI_BASE_URL),,botmemory-stub)
demo: | $(INSTALLED)
	$(PY) -m tools.demo $(if $(DEMO_MODEL),--model $(DEMO_MODEL),)

# Agents' tools at http://127.0.0.1:$(MCP_PORT)/mcp; each request brings its person token.
MCP_PORT ?= 8765
mcp: | $(INSTALLED)
	$(PY) -m botmemory.mcp --http --port $(MCP_PORT)
