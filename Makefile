# Two commands do all the set-up: `make run` (the main job) and `make test`.
# Each creates .venv and installs kbframe with its test, launcher and search extras when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kbframe-installed

.PHONY: run test bench bytecode clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,joblib,submitit,optuna]'
	touch $(STAMP)

# kbframe's bytecode, compiled once here rather than at every start of a command where
# Python may not write it (PYTHONDONTWRITEBYTECODE): ~0.1 s a command; a tree where it
# cannot be written (read-only) runs all the same
bytecode: $(STAMP)
	-$(PY) -m compileall -q kbframe

run: bytecode
	$(PY) -m kbframe +bench=decode_opt2

# the suite in parallel (pytest-xdist, one worker per core); tests of one xdist_group (the
# rows sharing one fixture, the tests marked serial) run on one worker, one after another
test: bytecode
	$(PY) -m pytest -n auto --dist loadgroup -rs

bench: bytecode
	$(PY) benchmarks/sim_speed.py

clean-venv:
	rm -rf $(VENV)
