# Featureline: `make demo` runs the main job end to end; `make test` runs the test suite.
# Both create .venv and install the pinned dependencies on first use; re-runs reuse it
# until pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= data/demo
DEMO_EVENTS ?= 200000
QUALIFY_LOG ?= data/qualify/events.jsonl
# `make test` runs the suite in this many processes (pytest-xdist), each test module whole in
# one of them (its fixtures built once); the suite is CPU-bound, one process left a core idle
# a third of the time. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2

export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)
export SPARK_LOCAL_IP ?= 127.0.0.1
# Material for MkDocs prints a banner about its successor on every build.
export NO_MKDOCS_2_WARNING := 1

.PHONY: help venv java test test-fast docs lint typecheck demo stop bench qualify gpu-check clean FORCE

help:
	@echo "make demo   sample logs → ETL → Feast/Redis → embeddings → the API, end to end (embedded defaults)"
	@echo "make test   run the test suite (creates .venv on first use)"
	@echo "make test-fast  the suite without Spark jobs and the slow end-to-end runs (~4 min)"
	@echo "make docs   build the user guide into site/ (open site/index.html)"
	@echo "make lint   ruff check"
	@echo "make typecheck  mypy over the package"
	@echo "make stop   stop what the demo left running (the API, the embedded Redis)"
	@echo "make bench  run the benchmarks (BENCH_ARGS=... to pass options)"
	@echo "make qualify  will the ETL run on the GPU? NVIDIA's Qualification tool on a run of it"
	@echo "make gpu-check  will the ETL run on the GPU? the RAPIDS plugin plans it (explain-only, no GPU)"

# The package's files: the editable install (setuptools' strict mode, a tree of links that
# static tools follow) links each one, so a file added or removed means a new install.
PACKAGE_FILES := $(shell git ls-files --cached --others --exclude-standard -- core etl \
	feature_store hps api trainer stream featureline spark_conf 2>/dev/null | sort)
FILES_STAMP := $(VENV)/.package-files
# uv installs the pinned dependencies (downloads in parallel; a cold install half of pip's
# time) and compiles their bytecode then, on both cores: where PYTHONDONTWRITEBYTECODE is set
# nothing else would, and every process would compile each module it imports again. Its own
# pin is in pyproject.toml's dev extra.
UV_PIN := $(shell sed -n 's/^ *"\(uv==[^"]*\)".*/\1/p' pyproject.toml)

$(FILES_STAMP): FORCE
	@mkdir -p $(VENV)
	@echo '$(PACKAGE_FILES)' | cmp -s - $@ || echo '$(PACKAGE_FILES)' > $@

$(STAMP): pyproject.toml $(FILES_STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10+ is required")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check '$(UV_PIN)'
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev]' \
		-C editable_mode=strict
	touch $(STAMP)

venv: $(STAMP)

java:
	@scripts/check_java.sh

# The tools the tests use are fetched while the linters run (nothing then waits on a
# download), and Debian's chromium installed for the guide's browser test; a tool that
# cannot be fetched is reported, and its tests skip or fail.
test: venv java
	@{ $(BIN)/featureline fetch & scripts/install_chromium.sh; wait; } > $(VENV)/fetch.log 2>&1 & \
	fetching=$$!; \
	$(BIN)/ruff check . && $(MAKE) --no-print-directory typecheck; linted=$$?; \
	wait $$fetching; cat $(VENV)/fetch.log; exit $$linted
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The suite without the end-to-end runs marked slow (each a Spark job or a benchmark in a
# process of its own): for a quick check while developing; `make test` runs them all.
test-fast: venv java
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow and not spark" $(PYTEST_ARGS)

# The user guide into site/ (docs/ARCHITECTURE.md, "The user guide"); strict: a broken link
# or a page left out of the navigation fails, as in `make test`.
docs: venv
	$(BIN)/mkdocs build --strict

lint: venv
	$(BIN)/ruff check .

# mypy over the installed package (the strict editable install's link tree), run outside the
# checkout so that it reads the package as installed.
typecheck: venv
	cd $(VENV) && bin/mypy --config-file ../pyproject.toml -p featureline

demo: venv java
	$(BIN)/featureline demo --out $(DEMO_DIR) --events $(DEMO_EVENTS)

stop:
	-test -f $(DEMO_DIR)/api.pid && kill $$(cat $(DEMO_DIR)/api.pid) && rm -f $(DEMO_DIR)/api.pid
	-test -x $(BIN)/featureline && $(BIN)/featureline redis stop

bench: venv java
	$(BIN)/python benchmarks/bench_etl.py $(BENCH_ARGS)

qualify: venv java
	test -f $(QUALIFY_LOG) || $(BIN)/featureline datagen --events $(DEMO_EVENTS) --out $(QUALIFY_LOG) --bad-fraction 0.01
	$(BIN)/featureline etl qualify --input $(QUALIFY_LOG) --refit-vocabularies $(QUALIFY_ARGS)

gpu-check: venv java
	test -f $(QUALIFY_LOG) || $(BIN)/featureline datagen --events $(DEMO_EVENTS) --out $(QUALIFY_LOG) --bad-fraction 0.01
	$(BIN)/featureline etl gpu-check --input $(QUALIFY_LOG) --refit-vocabularies $(GPU_CHECK_ARGS)

clean: stop
	rm -rf $(VENV) data feature_store/data .pytest_cache spark-warehouse site

FORCE:
