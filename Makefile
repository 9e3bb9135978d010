# Two entry points, each bootstrapping the virtual environment on first use.
# The stamp depends on pyproject.toml, so a dependency change reinstalls.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.antdt-installed

.PHONY: demo test lint format bench bench-e2e bench-torchrun bench-chaos venv clean

demo: $(STAMP)
	$(BIN)/antdt demo

# Two workers: the serial test modules one after another on one, every other module beside them
# (tests/conftest.py groups them).
PYTEST_WORKERS ?= 2

# A worker ended by a test's timeout is replaced twice at most: a test that hangs fails the run
# in minutes, not at CI's limit.
test: lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --max-worker-restart 2

# ruff's lint rules and formatting (pyproject.toml); `make format` applies them.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The end-to-end benchmark (about 7 minutes): antdt bench on the standard scenario.
bench-e2e: $(STAMP)
	$(BIN)/antdt bench --json

# A user's own script under torchrun, plain DDP against ElasticJob (about 4 minutes).
bench-torchrun: $(STAMP)
	$(BIN)/python bench/torchrun_bench.py --ranks 2 --repeat 3 --modes beside,hook,dd,preduce,ps --json

# Drawn chaos schedules, 30 seeds per training mode (about 2 hours): docs/reliability.md's table.
bench-chaos: $(STAMP)
	$(BIN)/python bench/chaos_seeds.py --modes sync,preduce,async --seeds 1-30 --json

bench: $(STAMP)
	$(BIN)/python bench/codec_bench.py
	$(BIN)/python bench/broker_start_bench.py
	$(BIN)/python bench/reset_pickup_bench.py
	$(BIN)/python bench/broker_log_bench.py
	$(BIN)/python bench/offset_gap_bench.py
	$(BIN)/python bench/sharder_bench.py
	$(BIN)/python bench/agent_bench.py
	$(BIN)/python bench/monitor_bench.py
	$(BIN)/python bench/controller_bench.py
	$(BIN)/python bench/comm_hook_bench.py

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found (set PYTHON=...)" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,lightning,hf]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .benchmarks
