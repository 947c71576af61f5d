# Everything installs into .venv. torch is pinned to the CPU build this machine has on disk;
# pyproject.toml only asks for torch>=2.9 so Colab and conda keep their own builds.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed
JOBS ?= 2  # runs trained at once by make demo: two one-thread runs beat one two-thread run by ~12% on 2 cores
# The browser test drives Debian's chromium (playwright's own browser download is not needed).
CHROMIUM := /usr/bin/chromium

.PHONY: install demo test bench notebooks lab browser clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet -e '.[notebooks,test]'
	touch $(STAMP)

install: $(STAMP)

# As root (CI, containers) a missing chromium is installed; otherwise this says what to install.
browser:
	@test -x $(CHROMIUM) || { test "$$(id -u)" = 0 && apt-get update -qq && apt-get install -y -qq chromium; } \
		|| { echo "the browser test needs Debian's chromium at $(CHROMIUM): sudo apt-get install chromium"; exit 1; }

demo: $(STAMP)
	$(PY) -m headlab reproduce --out runs/reproduce --jobs $(JOBS)

test: $(STAMP) browser
	$(PY) -m pytest -q --nbmake tests $(wildcard notebooks/*.ipynb)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# Re-pair the .ipynb with their .py sources, then execute them in small mode so the committed
# notebooks carry their figures (readable on GitHub or nbviewer without a kernel).
notebooks: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update notebooks/*.py
	cd notebooks && ../$(VENV)/bin/jupyter nbconvert --log-level WARN --to notebook --execute --inplace *.ipynb

lab: $(STAMP)  # as root (containers) JupyterLab must be told it may run so
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
