# Two entry points, each self-contained on a fresh machine:
#   make demo   -- the main job on the embedded default
#   make test   -- the whole test suite
#   make lint   -- ruff check, ruff format --check, mypy src (CI runs it too)
#   make bench-nt -- the NTK benchmark against neural-tangents (JAX) in its own .venv-nt; make test never installs JAX
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

VENV_NT ?= .venv-nt
PY_NT := $(VENV_NT)/bin/python
STAMP_NT := $(VENV_NT)/.installed

.PHONY: venv demo test lint bench bench-nt test-nt clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,hf,lightning]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/widthscope demo

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

# the house rules as tools (configuration in pyproject.toml); .ci/run runs it before the tests
lint: $(STAMP)
	$(VENV)/bin/ruff check src
	$(VENV)/bin/ruff format --check src
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# numpy < 2 for jaxlib 0.4.23: constraints-nt.txt (not constraints.txt) pins this environment
$(STAMP_NT): pyproject.toml constraints-nt.txt
	test -x $(PY_NT) || $(PYTHON) -m venv $(VENV_NT)
	$(PY_NT) -m pip install --quiet --disable-pip-version-check -c constraints-nt.txt torch==2.13.0
	$(PY_NT) -m pip install --quiet --disable-pip-version-check -c constraints-nt.txt -e '.[test,nt]'
	touch $(STAMP_NT)

bench-nt: $(STAMP_NT)
	OMP_NUM_THREADS=1 nice $(PY_NT) benchmarks/ntk_vs_nt.py

test-nt: $(STAMP_NT)
	$(PY_NT) -m pytest -q -p no:cacheprovider tests/test_bench_ntk_vs_nt.py

clean:
	rm -rf $(VENV) $(VENV_NT) build *.egg-info
