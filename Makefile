# moeops: `make run` starts the app with example data; `make test` runs the whole suite.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum requirements.txt | cut -c1-12)
PG_URL ?= postgres://postgres@127.0.0.1:5432/moeops
POSTGRES_ANSWERS = [ -n "$$DATABASE_URL" ] || pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null \
	|| $(PY) -c "import socket; socket.create_connection(('127.0.0.1', 5432), 1)" 2>/dev/null
# make test's passes list their slowest tests, so CI's log shows what keeps it from 20 minutes
DURATIONS ?= --durations=15
# make run PORT=8001 STANDIN_PORT=30001: the web app's and the stand-in engine's ports
PORT ?= 8000
STANDIN_PORT ?= 30000

.PHONY: install run test check test-gpu gpu-wheels lint test-sqlite test-postgres _pytest-sqlite _pytest-postgres browser-deps engine clean

$(STAMP): requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py load_example_data
	$(PY) manage.py runlocal --port $(PORT) --standin-port $(STANDIN_PORT)

# Debian's Chromium for the browser tests; Playwright's own browser download cannot work here.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The real engine of the tests: vLLM's CPU build in a virtualenv of its own and a tiny random MoE,
# both under var/engine (cached). A failed install does not stop the suite: the engine's tests
# then fail, each with the reason.
engine: install
	@$(PY) -m tests.engine install || echo "the real engine could not be installed: its tests will fail (see var/engine/install.log)"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# Day to day: lint and the tests that start no engine, browser or whole stack and fuzz no API
# (SQLite). The fuzz file is not even collected: schemathesis builds its tests from the API
# schema at collection, a minute of a 2-core box.
UNIT := not gpu and not e2e and not browser and not engine and not faults and not fuzz
FUZZ := tests/web/test_api_schema.py
# make check's pytest processes (pytest-xdist): a third of its time the tests wait on sockets and
# the processes they start, so three keep two cores busier than two do (decision 46). Each takes
# a Redis database of its own (tests/conftest.py), and a `quiet` test runs while the others wait.
CHECK_WORKERS ?= 3
check: lint
	@mkdir -p var
	env -u DATABASE_URL -u REDIS_URL -u MOEOPS_TEST_REDIS_DB MOEOPS_QUIET_LOCK=$(CURDIR)/var/check-quiet.lock \
		$(VENV)/bin/pytest -q -n $(CHECK_WORKERS) -m "$(UNIT)" --ignore=$(FUZZ) $(DURATIONS)

test-sqlite: install browser-deps engine _pytest-sqlite

# Runs the tests that touch the database again on PostgreSQL, when one answers.
test-postgres: install _pytest-postgres

# Three passes side by side, each mostly waiting (servers starting, sweeps running, timeouts), so
# that together they take about as long as the longest: the timed pass (SQLite: the real engine's
# tests, those that judge timings against limits and most of the fault suite), the untimed rest
# on SQLite, and the tests that touch the database again on PostgreSQL, with the browser suite
# and the make-run faults, which run once, there. While a test marked `quiet` runs (it judges the real vLLM's rounds against each other),
# the other passes wait between their tests (tests/quiet.py). Their output follows the timed one's.
TIMED := engine or timing or quiet or sqlite_once
test: lint browser-deps engine
	@mkdir -p var
	@if $(POSTGRES_ANSWERS); then \
		export MOEOPS_QUIET_LOCK=$(CURDIR)/var/test-quiet.lock; \
		$(MAKE) --no-print-directory _pytest-postgres > var/test-postgres.log 2>&1 & pg=$$!; \
		MOEOPS_SQLITE_BESIDE_POSTGRES=1 MOEOPS_TEST_REDIS_DB=15 $(MAKE) --no-print-directory \
			_pytest-sqlite PART=untimed MARKS="not ($(TIMED))" > var/test-sqlite-untimed.log 2>&1 & untimed=$$!; \
		MOEOPS_SQLITE_BESIDE_POSTGRES=1 $(MAKE) --no-print-directory _pytest-sqlite PART=timed MARKS="$(TIMED)" \
			TESTS=--ignore=$(FUZZ); timed=$$?; \
		wait $$untimed; untimed=$$?; wait $$pg; postgres=$$?; \
		cat var/test-sqlite-untimed.log var/test-postgres.log; \
		echo "== SQLite timed: exit $$timed, SQLite untimed: exit $$untimed, PostgreSQL: exit $$postgres =="; \
		test $$timed -eq 0 && test $$untimed -eq 0 && test $$postgres -eq 0; \
	else \
		echo "PostgreSQL not reachable on 127.0.0.1:5432 and DATABASE_URL unset: SQLite only"; \
		$(MAKE) --no-print-directory _pytest-sqlite; \
	fi

# make _pytest-sqlite MARKS="engine or timing" TESTS=tests/e2e: a part of the SQLite pass (the
# timed one leaves out only the fuzz file, which holds none of its tests and takes a minute to
# collect)
_pytest-sqlite:
	@echo "== SQLite$(if $(PART), ($(PART))) =="
	env -u DATABASE_URL $(VENV)/bin/pytest -m "not gpu$(if $(MARKS), and ($(MARKS)))" $(DURATIONS) $(TESTS)

_pytest-postgres:
	@if $(POSTGRES_ANSWERS); then \
		echo "== PostgreSQL =="; \
		DATABASE_URL=$${DATABASE_URL:-$(PG_URL)} MOEOPS_DB_TESTS_ONLY=1 $(VENV)/bin/pytest -m "not gpu" $(DURATIONS); \
	else echo "PostgreSQL not reachable on 127.0.0.1:5432 and DATABASE_URL unset: SQLite only"; fi

# The gpu-marked tests, on a machine with a CUDA GPU. Neither they nor their files need Django
# (hence no conftest, whose fixtures start the web side), so a GPU host's own Python with torch,
# Triton, pytest, hypothesis, pydantic and ijson runs them too: make test-gpu GPU_PYTHON=python3
# (the tuner reads its bodies from domain.wire, pydantic; step traces stream with ijson). For a
# GPU host that reaches no package registry, `make gpu-wheels` leaves those two with what they
# need in var/gpu-wheels, for that host's Python (GPU_HOST_PY): pip install --no-index there;
# and it unpacks the engines' sources the tests load into var/engine/sources: carry both.
GPU_HOST_PY ?= 3.12
GPU_HOST_WHEELS := $(shell grep -E '^(pydantic|ijson)==' requirements.txt)
GPU_PYTHON ?= $(PY)
GPU_TESTS := tests/tuning/test_fused_moe.py tests/tuning/test_gpu_tuning.py tests/tuning/test_engine_backend_sglang.py \
	tests/tuning/test_vllm_tma_gpu.py tests/tuning/test_vllm_sorted_a_gpu.py tests/domain/test_step_breakdown_gpu.py
test-gpu: $(if $(filter $(PY),$(GPU_PYTHON)),install)
	$(GPU_PYTHON) -m pytest -p no:cacheprovider --noconftest -m gpu $(GPU_TESTS)

gpu-wheels: install
	$(VENV)/bin/pip download --quiet --disable-pip-version-check --only-binary=:all: \
		--python-version $(GPU_HOST_PY) --platform manylinux2014_x86_64 \
		--platform manylinux_2_17_x86_64 -d var/gpu-wheels $(GPU_HOST_WHEELS)
	$(PY) -m tests.engine sources

clean:
	rm -rf $(VENV) var staticfiles test-artifacts
