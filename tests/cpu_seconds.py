"""What the suite costs in CPU-seconds, which a loaded machine does not distort as it does wall time.

Each test phase (setup, call, teardown) is charged the CPU-seconds that this process and its
children that ended and were waited for (torchrun ranks, CLI subprocesses, notebook kernels) spent
during it; a module or session fixture is charged to the test that first needs it (or, at teardown,
to the last). The figure travels in the report's user_properties, so under xdist the controller sums
the workers' tests. The terminal summary ends with the suite's total and the costliest files and
tests; HEADLAB_CPU_PROFILE=FILE.json also writes every test's CPU-seconds there.
"""
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

PROPERTY = "cpu_s"
PROFILE_ENV = "HEADLAB_CPU_PROFILE"
SHOWN = 5


def cpu_seconds(*whose: int) -> float:
    """User + system CPU-seconds of getrusage's `whose` (by default this process and its waited children)."""
    usages = [resource.getrusage(who) for who in whose or (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(usage.ru_utime + usage.ru_stime for usage in usages)


class CpuSeconds:
    """The plugin: registered by tests/conftest.py, so it also measures the notebooks nbmake collects."""

    def __init__(self):
        self.per_test: dict[str, float] = defaultdict(float)
        self.started = time.perf_counter()
        self.mark = 0.0

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item):
        self.mark = cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        now = cpu_seconds()
        outcome.get_result().user_properties.append((PROPERTY, round(now - self.mark, 4)))
        self.mark = now

    def pytest_runtest_logreport(self, report):
        self.per_test[report.nodeid] += sum(value for key, value in report.user_properties if key == PROPERTY)

    def pytest_terminal_summary(self, terminalreporter, config):
        if hasattr(config, "workerinput") or not self.per_test:
            return
        wall = time.perf_counter() - self.started
        per_file: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.per_test.items():
            per_file[nodeid.split("::")[0]] += seconds
        total = sum(self.per_test.values())
        write = terminalreporter.write_line
        write(f"CPU-seconds: {total:.0f} in {len(self.per_test)} tests, {cpu_seconds():.0f} in all this "
              f"pytest's processes (xdist workers, imports, collection), beside {wall:.0f} s of wall time")
        for title, table in (("files", per_file), ("tests", self.per_test)):
            write(f"  costliest {title}:")
            for name, seconds in sorted(table.items(), key=lambda kv: -kv[1])[:SHOWN]:
                write(f"    {seconds:6.1f}  {name}")
        if path := os.environ.get(PROFILE_ENV):
            Path(path).write_text(json.dumps(dict(sorted(self.per_test.items(), key=lambda kv: -kv[1])), indent=0))
