# One command each: `make test` (set-up + test suite), `make train` (set-up + the main job: RL from the cached base),
# `make play` (three nextqa-video episodes answered by the gold policy: the correct answers, to show the env and its reward).
# Set-up makes .venv with the CPU torch wheel installed first and pinned (constraints.txt), so nothing
# later pulls a multi-GB CUDA build, then installs relax-gym with its test extra.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
STAMP  := $(VENV)/.installed

.PHONY: setup test play train check bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt torch
	$(PIP) install --quiet -c constraints.txt -e '.[test]'
	touch $@

# Two workers (pytest-xdist): tests that share the Ray session, the sandbox engines or the real-width checkpoints
# stay in one group each, run one after another (tests/xdist_groups.py). `$(BIN)/python -m pytest` alone runs serially.
# Bytecode is written (git-ignored __pycache__) even where PYTHONDONTWRITEBYTECODE is set, as on this project's CI
# machines: without it each worker compiles and assertion-rewrites every test module at every collection (17 s a
# worker instead of 10) and every Python process the suite starts compiles the modules of ours it imports.
test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n 2 --dist loadgroup

play: $(STAMP)  # the gold policy answers; `.venv/bin/relax-gym envs play nextqa-video --policy stdin` to answer yourself
	$(BIN)/relax-gym envs play nextqa-video --episodes 3 --policy gold

check: $(STAMP)
	$(BIN)/relax-gym envs check --all

bench: $(STAMP)
	$(BIN)/python benchmarks/env_reset.py

clean:
	rm -rf $(VENV) .pytest_cache
	find relax_gym tests benchmarks scripts -name __pycache__ -type d -prune -exec rm -rf {} +

train: $(STAMP)
	$(BIN)/relax-gym train recipes/cpu-nextqa.yaml
