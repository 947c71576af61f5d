import gc
import importlib
import os
from pathlib import Path

# OpenMP threads that finish their share spin while they wait for the next parallel region (libgomp's
# default). Under `make test` two xdist workers share two cores, so a test run at torch's default two
# threads (the `threads` fixture) spun against the other worker: 14.7 CPU-s where its one-thread twin
# took 0.7 (1.7 passive). Passive waiting changes how an idle thread waits, never how work is split.
# OpenMP reads it when torch loads, so it is set before the import; workers, torchrun ranks and
# notebook kernels inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The tests' folders (tmp_path) go into memory when the machine has room there: the suite writes GBs of
# checkpoints (the paper-128m test alone 2.7 GB), and this machine's disk charged their page cache and
# writeback ~6 CPU-s and ~8 s of wall time in the disk and training tests that write most (61-63 s on
# /dev/shm against 67-69 s on /tmp, back to back). No test here is about a disk's speed: the full-disk
# tests inject the failure, or mount a tmpfs of their own. A passing test's folder is removed when it
# ends (tmp_path_retention_policy = "failed" in pyproject.toml), so memory holds the running tests' folders and
# the shared fixtures' (removed with the rest when the session passes).
# An explicit --basetemp or PYTEST_DEBUG_TEMPROOT (pytest's own setting for this) wins.
MEMORY_FOLDER = Path("/dev/shm")
MEMORY_NEEDED = 8 * 2 ** 30  # bytes free, for the 128m test's checkpoints beside the other worker's folders


def memory_folder_with_room(folder: Path = MEMORY_FOLDER, needed: int = MEMORY_NEEDED) -> Path | None:
    """`folder` if it is a directory this user may write in with `needed` bytes free, else None."""
    try:
        usage = os.statvfs(folder)
    except OSError:
        return None
    room = usage.f_bavail * usage.f_frsize
    return folder if folder.is_dir() and os.access(folder, os.W_OK | os.X_OK) and room >= needed else None


if (memory := memory_folder_with_room()) is not None:
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(memory))

import pytest  # noqa: E402

from cpu_seconds import CpuSeconds  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class NotebooksWriteOnlyRuns:
    """nbmake runs the notebooks in this checkout, from notebooks/: each may add to the checkout's
    top level and to notebooks/ nothing but runs/, and one that finds a finished small-mode study
    (the one the first notebook to need it trained: 03 in CI's clone) takes it up and adds nothing
    to it (in a fresh clone, test_notebooks_fresh.py checks the same of the notebooks it runs alone
    first)."""

    def __init__(self):
        self.before: set[str] = set()
        self.studies: dict[Path, set[Path]] = {}

    @staticmethod
    def listing() -> set[str]:
        return {path.name for path in ROOT.iterdir()} | {f"notebooks/{p.name}" for p in (ROOT / "notebooks").iterdir()}

    @staticmethod
    def finished_studies() -> dict[Path, set[Path]]:
        """Every finished small-mode study of this checkout (its tables written: one begun and
        stopped is for the next notebook to finish), with every path inside it."""
        return {meta.parent: set(meta.parent.rglob("*"))
                for meta in (ROOT / "runs" / "notebooks" / "small").glob("*/study.json")
                if (meta.parent / "summary.csv").exists()}

    def pytest_runtest_setup(self, item):
        if item.path.suffix == ".ipynb":
            self.before, self.studies = self.listing(), self.finished_studies()

    def pytest_runtest_teardown(self, item):
        if item.path.suffix == ".ipynb":
            added = sorted(self.listing() - self.before - {"runs"})
            assert not added, f"{item.path.name} wrote {added} into the checkout: a notebook writes only into runs/"
            for study, paths in self.studies.items():
                added = sorted(str(path.relative_to(study)) for path in set(study.rglob("*")) - paths)
                assert not added, f"{item.path.name} added {added} to the finished study {study}: it should take it up"
            if self.studies:
                studies = set((ROOT / "runs" / "notebooks" / "small").glob("*/study.json"))
                assert {meta.parent for meta in studies} == set(self.studies), \
                    f"{item.path.name} began another small study beside the finished one: it should take that up"


# nbmake's order: 03 (the flagship) is the first to need the small study, so in CI's clone it trains it
# alone first, and 01, 02 and 05 take it up (test_notebooks_fresh.py runs those three alone first).
NBMAKE_ORDER = ("00", "03", "01", "02", "04", "05")


def pytest_configure(config):
    """The CPU-seconds of every test, the notebooks included, and what nbmake's notebooks write (plugins,
    not this conftest's hooks, which pytest calls only for the tests under tests/); and, where tests
    run here, the shared fixtures (tests/shared_fixtures.py)."""
    config.pluginmanager.register(CpuSeconds(), "headlab_cpu_seconds")
    config.pluginmanager.register(NotebooksWriteOnlyRuns(), "headlab_notebooks_write_only_runs")
    if runs_tests_here(config):
        config.pluginmanager.register(importlib.import_module("shared_fixtures"), "headlab_shared_fixtures")


def runs_tests_here(config) -> bool:
    """Whether this process runs tests: any but the controller of an xdist run (`-n 2`), which hands
    them to its workers (xdist's own test: a distribution mode with workers to start, not only
    collecting; `--dist loadgroup` without `-n` runs them here)."""
    controller = not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no" \
        and bool(config.getoption("tx", None)) and not config.getoption("collectonly")
    return not controller


def pytest_collection_finish(session):
    """Every test module is imported now: freeze what is alive (torch, pandas and the rest, a few
    hundred thousand objects) out of the cyclic collector's reach, so the gc.collect that each
    timed step makes (a study's training notice, --plan) scans only what the tests create since,
    not the whole interpreter again, a second each time."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _freeze_what_earlier_modules_left():
    """The same for what the modules before this one left alive (session fixtures, caches, figures
    kept by widgets): collected once, then frozen, so the gc.collect that a study makes for every
    run it frees does not scan them again each time. A worker that had run the widget tests spent
    71 of the sweep test's 82 CPU seconds in 79 such collections, ~0.9 s each."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the tests' ids
def pytest_collection_modifyitems(items):
    """Under `pytest -n 2 --dist loadgroup` (make test), the notebooks and the browser test, which
    train and read the same small-mode runs under runs/notebooks/small/, run on one worker, one
    after the other, and so do the tests sharing the `torchrun_study` fixture (trained once), and
    those sharing `tiny_study`. A test module whose module fixture trains runs puts itself in a
    group of its own (`pytestmark`), or every worker running one of its tests would train that
    fixture again. Everything else
    spreads over both cores. The slow tests go first, so the last minute is not
    one long test on one core while the other idles. The notebooks count as slow, so their group
    starts early, and the browser test comes after them: its notebook 03 writes the small study
    into this checkout's runs/ (its lab folder holds no pyproject.toml), so before nbmake's it would
    take from nbmake's 03 the training alone first that a CI clone gives it (`NBMAKE_ORDER`)."""
    for item in items:
        if item.path.suffix == ".ipynb" or item.path.name == "test_browser.py":
            item.add_marker(pytest.mark.xdist_group("notebooks"))
        elif "torchrun_study" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("torchrun_study"))
        elif "tiny_study" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("tiny_study"))
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None and item.path.suffix != ".ipynb",
                                 item.path.name == "test_browser.py",
                                 NBMAKE_ORDER.index(item.path.name[:2]) if item.path.suffix == ".ipynb" else 0))
