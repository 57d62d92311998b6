# The series' commands. `make run` and `make test` are all a learner needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test lab refresh bench lint clean

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

## run: execute every lesson headless; executed notebooks and figures go to results/
run: $(STAMP)
	$(PY) -m helpers.run_notebooks

## test: unit tests, then nbval over notebooks/ (small profile, CPU, as stored)
test: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m pytest

## lab: open the series in JupyterLab
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

## refresh: re-execute the lessons in place (small profile, CPU) to update nbval's reference
refresh: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m helpers.run_notebooks --in-place

## bench: the measurements without notebooks; writes results/bench.json
bench: $(STAMP)
	$(PY) -m helpers.bench

lint: $(STAMP)
	$(VENV)/bin/ruff check helpers tests notebooks

clean:
	rm -rf results
