# The series' commands. `make run` and `make test` are all a learner needs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SITE_STAMP := $(VENV)/.site-installed

.PHONY: run test test-twins test-fast test-gpu-smoke test-bench-smoke lab lab-check refresh bench lint clean gpu-check mutants site site-check

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

# The website's tools (requirements-site.txt) join the same .venv on first use of `make site`;
# `-c requirements.txt` keeps the course's pins; `make test` never installs them.
$(SITE_STAMP): requirements-site.txt requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-site.txt -c requirements.txt
	@touch $(SITE_STAMP)

## run: execute every lesson headless; executed notebooks and figures go to results/
run: $(STAMP)
	$(PY) -m course_tools.run_notebooks

## test: unit tests, then nbval over notebooks/ (small profile, CPU, as stored); prints the
## 15 slowest. The twins of a lesson's own launch are left to test-twins: nbval runs the launch
test: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m pytest \
		-m "not gpu_smoke and not bench_smoke and not twin" --durations=15

## test-twins: the unit tests that launch what a lesson's own launch runs (CI runs them after
## make test)
test-twins: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m pytest -o addopts= -p no:cacheprovider \
		-m twin tests

## test-fast: the contributors' tier, under a minute: unit tests without notebooks, without
## torchrun launches and without the slow ones
test-fast: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m pytest -o addopts= -p no:cacheprovider \
		-m "not torchrun and not slow and not gpu_smoke" tests

## test-gpu-smoke: make gpu-check --smoke under pytest, every step's code path on the CPU
## (CI runs it after make test)
test-gpu-smoke: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m pytest -o addopts= -p no:cacheprovider \
		-m gpu_smoke tests/course_tools/test_gpu_check.py

## test-bench-smoke: make bench's sections rehearsed at tiny sizes on the CPU (CI runs it
## after make test)
test-bench-smoke: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m pytest -o addopts= -p no:cacheprovider \
		-m bench_smoke tests/course_tools

## lab: open the series in JupyterLab (as root too, as in a class's container): the
## repository is the server's root, so the lessons' links to docs/ work; it opens in
## notebooks/. The course's settings (docs/lab/overrides.json): no first-start news prompt,
## Markdown opens rendered, no autosave (a lesson changes on disk only when you save it)
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings
lab: $(STAMP)
	@mkdir -p $(LAB_SETTINGS) && cp docs/lab/overrides.json $(LAB_SETTINGS)/overrides.json
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks \
		$$([ "$$(id -u)" = 0 ] && echo --allow-root)

## lab-check: the lessons in JupyterLab in headless Chromium (Debian's chromium, or
## CHROMIUM=path): each opens unmodified, glossary links land on their term, lesson 01 runs
## clean with Run All, a wrong answer gets a hint; screenshots in results/lab/; first
## proves on planted flaws that it can fail
lab-check: $(SITE_STAMP)
	$(PY) -m course_tools.lab.check --self-test

## refresh: re-execute the lessons in place (small profile, CPU) to update nbval's reference
refresh: $(STAMP)
	TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(PY) -m course_tools.run_notebooks --in-place

## bench: the measurements without notebooks; writes results/bench.json
bench: $(STAMP)
	$(PY) -m course_tools.bench

## gpu-check: on a CUDA machine, every lesson's proof and measurement in one run (no install
## step); writes results/gpu_check.json and .md; e.g. ARGS="--budget 300" or ARGS=--smoke
gpu-check:
	@if [ -x $(PY) ]; then $(PY) -m course_tools.gpu_check $(ARGS); \
	else python3 -m course_tools.gpu_check $(ARGS); fi

## mutants: mutation testing (mutmut) of the correctness-critical helpers with their fast
## unit tests, set in pyproject's [tool.mutmut]; lists the mutants that survive and the score.
## PART=<package> (e.g. PART=debugging, PART=runs.llama_3d) runs and reports only that package
mutants: $(STAMP)
	$(PY) -m pip install --quiet mutmut==3.8.1
	rm -rf mutants
	OMP_NUM_THREADS=1 TUTORIAL_PROFILE=small CUDA_VISIBLE_DEVICES= $(VENV)/bin/mutmut run --max-children 2 $(if $(PART),"helpers.$(PART).*")
	$(PY) -m course_tools.mutation_report $(PART)

## site: the course as a static website in results/site/ (open results/site/index.html), built
## from the stored, executed notebooks in seconds (nothing re-runs); refuses a lesson stored
## unexecuted or with an error output
site: $(SITE_STAMP)
	$(PY) -m course_tools.website.build

## site-check: the built site in headless Chromium (Debian's chromium, or CHROMIUM=path): per
## page no console error, no failed or outside request, images decoded, math typeset, links
## resolved; screenshots in results/site/screens/; first proves on a broken site it can fail
site-check: site
	$(PY) -m course_tools.website.check --self-test

lint: $(STAMP)
	$(VENV)/bin/ruff check helpers course_tools tests solutions notebooks

clean:
	rm -rf results
