"""The suite's shared fixtures and the helpers its tests import (`tiny_model`, `write_run`, the
study settings the shared studies train): torch, headlab and hypothesis's profile. tests/conftest.py
registers this module as a plugin in every process that runs tests, but not in an xdist controller,
which only hands tests to its workers: `make test`'s controller starts its workers without loading
torch first (2.6 s here, while the workers' core sat idle)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from matplotlib.figure import Figure

from headlab import GPT, load_corpus, preset, train, train_preset
from headlab.data import sources
from headlab.io import Manifest, file_digest
from headlab.runs.checkpoints import save_checkpoint
from headlab.runs.layout import MANIFEST, RUN, run_manifest
from headlab.runs.metrics import MetricsLog
from headlab.schema import FAMILIES
from stand_in_figures import save_stand_in

# Property tests draw a fixed sequence of examples, so `make test` is reproducible and a red run is red
# on every rerun, on any machine; HEADLAB_EXPLORE=1 (`make test-explore`) draws new ones each run.
# A draw that ever failed is pinned in its test as an explicit @example, so both keep checking it.
# No example database: the suite writes nothing into the repository.
EXPLORE_ENV = "HEADLAB_EXPLORE"
settings.register_profile("fixed", derandomize=True, max_examples=20, stateful_step_count=6, deadline=None,
                          database=None)
settings.register_profile("explore", max_examples=60, stateful_step_count=12, deadline=None, database=None)
settings.load_profile("explore" if os.environ.get(EXPLORE_ENV, "") not in ("", "0") else "fixed")

ROOT = Path(__file__).resolve().parent.parent

# torch's own thread count on this machine, read before the suite pins one thread.
DEFAULT_THREADS = torch.get_num_threads()

# Under `make test` two xdist workers fill both cores, so a process a test starts (a command line, a
# notebook's kernel, a study's training worker) at torch's default two threads oversubscribes them: a
# tiny model's forward took 2x the CPU-seconds of one thread, passive waiting included (5x spinning).
# Its torch reads this when it loads; the worker read its own above, so the `threads` tests keep both counts.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Every decode path: each family's, and MLA's second cache (not absorbed).
DECODE_CASES = [*((family, True) for family in FAMILIES), ("mla", False)]


def torchrun_headlab(cwd: Path, args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=2 -m headlab ARGS` as a user starts it, in `cwd`:
    two gloo processes on the CPU, one OpenMP thread each, the corpus cache in cwd/cache."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HEADLAB_CACHE": str(cwd / "cache")}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "headlab", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


# The study that torchrun_study trains (into --out study): the tiny preset, one seed, four steps, three
# variants: MHA (the reference) and the two whose parameters a sharded step deals out unlike a plain
# block's (LRKV's 3-D per-head factors, MLA's latents); all six take twice the CPU-seconds.
TORCHRUN_VARIANTS = ("mha", "lrkv-small", "mla")
TORCHRUN_STUDY = ["reproduce", "--preset", "tiny", "--seeds", "1", "--steps", "4", "--corpus", "synthetic",
                  "--only", *TORCHRUN_VARIANTS]


@pytest.fixture(scope="session")
def torchrun_study(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The folder where `torchrun ... -m headlab TORCHRUN_STUDY --out study` ran once
    and what that launch printed. Launches cost seconds of imports per rank, so the tests that read
    this study share it; they are in xdist group "torchrun_study" (one worker trains it)."""
    cwd = tmp_path_factory.mktemp("torchrun-study")
    return cwd, torchrun_headlab(cwd, [*TORCHRUN_STUDY, "--out", "study"])


@pytest.fixture(scope="session")
def synthetic_tokens(tmp_path_factory) -> Path:
    """A token cache holding the synthetic corpus as `--corpus synthetic` reads it, tokenized once
    (~0.5 CPU-s each time). Never written again: `own_cache` copies it."""
    cache = tmp_path_factory.mktemp("synthetic-tokens")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(sources.CACHE_ENV, str(cache))
        load_corpus("synthetic")
    return cache


@pytest.fixture
def own_cache(tmp_path_factory, monkeypatch, synthetic_tokens) -> Path:
    """A token cache of this test's own ($HEADLAB_CACHE, beside tmp_path, which stays empty) that
    holds only the synthetic corpus's tokens, as if a command had read it before: a copy, so a
    test may damage it."""
    cache = shutil.copytree(synthetic_tokens, tmp_path_factory.mktemp("cache") / "cache")
    monkeypatch.setenv(sources.CACHE_ENV, str(cache))
    return cache


# How `tiny_run` trains the tiny preset's MHA: four steps in small batches, a checkpoint every two.
TINY_TRAINING = train_preset("tiny", steps=4, batch_size=4, eval_every=2, eval_batches=1, checkpoint_every=2,
                             log_every=1)
TINY_CORPUS = {"name": "synthetic", "n_chars": 30_000}  # what `tiny_run` trains on: load_corpus(**TINY_CORPUS)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished run of the tiny preset's MHA trained as `TINY_TRAINING` on `TINY_CORPUS`, made
    once: tests copy it (a copy resumes where it is) and never write it."""
    out = tmp_path_factory.mktemp("tiny-run") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(sources.CACHE_ENV, str(out.parent / "cache"))
        return train(preset("tiny", "mha"), TINY_TRAINING, load_corpus(**TINY_CORPUS), out=out, progress=False).path


# The study that `tiny_study` holds: the tiny preset, one seed, four steps, MHA and MLA (the variant
# with the most files of its own: latent factors, RoPE part) on the synthetic corpus, in this process.
TINY_STUDY = ["reproduce", "--preset", "tiny", "--corpus", "synthetic", "--steps", "4", "--seeds", "1",
              "--only", "mha", "mla", "--jobs", "1"]


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory, synthetic_tokens) -> Path:
    """A finished study as `headlab TINY_STUDY --out study` writes it (runs, tables, figures,
    report.md), made once: tests copy it and never write it. A cache copied from
    `synthetic_tokens` (`own_cache`) reads its runs' corpus, so `TINY_STUDY` into a copy reuses
    them. Its tests are in xdist group "tiny_study" (one worker trains it)."""
    from headlab.cli.main import main  # the command line's modules: only where a study is made

    out = tmp_path_factory.mktemp("tiny-study") / "study"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(sources.CACHE_ENV, str(shutil.copytree(synthetic_tokens, out.parent / "cache")))
        assert main([*TINY_STUDY, "--out", str(out)]) == 0
    return out


@pytest.fixture
def figures_saved_as_stand_ins(monkeypatch):
    """Every figure the test saves saved as a stand-in (tests/stand_in_figures.py), for the tests
    that judge what commands do to files, or a report's text: `pytest.mark.usefixtures(...)`.
    Through the test's own `monkeypatch`, so a patch of `Figure.savefig` the test makes on top is
    undone before this one, whichever fixture was set up first."""
    monkeypatch.setattr(Figure, "savefig", save_stand_in)


def write_run(folder: Path, model: GPT, dtype: torch.dtype | None = None, **config_changes) -> Path:
    """A headlab run folder as the trainer writes it: a manifest, config.json with a "model" key
    (`config_changes` applied) and a current step-0 checkpoint of `model`'s weights."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {**model.config.to_dict(), **config_changes}
    manifest = Manifest.claim(folder, MANIFEST, RUN)
    manifest.write_bytes("config.json", json.dumps({"format": "headlab", "model": config}).encode())
    manifest.save()
    weights = {k: v.to(dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    save_checkpoint(folder, weights, [], torch.Generator(), step=0, metrics=MetricsLog(None))
    return folder


def forge_manifest_entry(run: Path, name: str) -> None:
    """Record file `name`'s present content in the run's manifest, as a forger would: what the
    content checks behind the hash must then catch on their own."""
    manifest = run_manifest(run)
    path = manifest.file(name)
    manifest.files[name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    manifest.save()


def tiny_model(attention: str, seed: int = 0, **overrides) -> GPT:
    """A tiny random model; norms and all weights randomised so no path hides behind init (a matrix
    initialised to zero, as nanochat's output projections, is drawn anew)."""
    torch.manual_seed(seed)
    model = GPT(preset("tiny", attention, **overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p)) if p.dim() < 2 else p.mul_(3.0) if p.any() else p.normal_(std=0.3)
    return model.eval()


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    """Test tensors are tiny: intra-op threads only add sync overhead (seconds on a busy box)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tokens():
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, 97, (2, 24), generator=generator)


@pytest.fixture(params=sorted({1, DEFAULT_THREADS}), ids=lambda n: f"{n}-thread")
def threads(request):
    """Run a test single-threaded and with torch's default thread count: its exact equalities
    must hold under both (more threads may split reductions differently, never randomly)."""
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(1)
