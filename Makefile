# The two quick-start commands: `make run` and `make test`. Both create venv/ on first use.
PYTHON ?= python3
VENV := venv
PY := $(VENV)/bin/python

.PHONY: run test test-all lint report dev clean-results

# --no-cache-dir: the downloaded wheels are not kept a second time in ~/.cache/pip
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-cache-dir -r requirements.txt
	touch $@

run: $(VENV)/.installed  ## the quick sweep on this machine, then result/
	$(PY) bench.py run --preset quick

# The fast tier leaves out what pytest.ini marks trainer (but keeps the one smoke training), postgres, slurm,
# browser, timing and slow; it keeps real SQLite files and real bench.py processes with the stub trainer.
FAST := smoke or not (trainer or postgres or slurm or browser or timing or slow)

test: $(VENV)/.installed  ## the fast tier (a few minutes)
	$(PY) -m pytest -q -m "$(FAST)"

test-all: $(VENV)/.installed  ## every test (CI: real trainers, PostgreSQL, SLURM, a browser)
	$(PY) -m pytest -q

lint: $(VENV)/.installed  ## the linter, with the rules in pyproject.toml
	$(PY) -m ruff check .

report: $(VENV)/.installed  ## result/ again from results.db
	$(PY) bench.py report

dev: $(VENV)/.installed  ## extra packages for benchmarks/ (transformers for the GPT-2 peer)
	$(PY) -m pip install --quiet --no-deps -r requirements-dev.txt

clean-results:  ## forget every run (keeps data/ caches)
	rm -f results.db results.db-wal results.db-shm
	rm -rf result/* output/run-* output/once-*
