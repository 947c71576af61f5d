"""tools/gpu_window.py: --smoke runs every stage, each in its own process, on the CPU with only
the modules the GPU image has (no ipywidgets, no jupyter, no matplotlib, no seaborn), into one
JSON beside a log; a stage that fails or finds the budget spent says so there."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headlab.data import sources

TOOLS = Path(__file__).resolve().parents[2] / "tools"
SCRIPT = TOOLS / "gpu_window.py"
# headlab's dependencies (pyproject.toml) that no node check imports, and the notebook server
ABSENT_ON_THE_GPU_IMAGE = ("ipywidgets", "matplotlib", "seaborn", "jupyterlab", "jupyter_server", "ipykernel")


def without_modules(folder: Path) -> dict[str, str]:
    """An environment whose Python (and its children's) cannot import ABSENT_ON_THE_GPU_IMAGE."""
    for name in ABSENT_ON_THE_GPU_IMAGE:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named {name!r}\")\n")
    return {**os.environ, "PYTHONPATH": str(folder), sources.CACHE_ENV: str(folder / "cache"),
            "GPU_WINDOW_PORT": "29561"}


@pytest.mark.slow
def test_the_smoke_window_runs_every_stage_without_the_notebook_modules(tmp_path):
    out = tmp_path / "window"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True,
                          text=True, timeout=900, env=without_modules(tmp_path / "absent"))
    report = json.loads((out / "gpu_window.json").read_text())
    stages = report["stages"]
    assert done.returncode == 0, (done.stdout[-2000:], (out / "gpu_window.log").read_text()[-3000:])
    assert list(stages) == ["probe", "trainer", "optimizers", "lrkv_memory", "attention", "notice_then_ddp",
                            "recompile_order"] and all(stage["ok"] for stage in stages.values())
    probe = stages["probe"]
    assert probe["ipywidgets"] is False and probe["missing_needs"] == []
    assert probe["tf32_after_headlab"] == {"allow_tf32": "True", "get_float32_matmul_precision": "high",
                                           "fp32_precision": "tf32"}
    assert stages["trainer"]["tokens_per_s"] > 0 and stages["trainer"]["checkpoint_s"]
    assert all(isinstance(t, float) for key, t in stages["optimizers"].items() if key.endswith("per rank"))
    assert stages["lrkv_memory"]["kv_rank"] == 4 and stages["attention"]["MATH ms"] > 0
    assert stages["notice_then_ddp"]["notice_graphs"] >= 1
    order = stages["recompile_order"]
    assert order["order"][0] == "Standard MHA" and order["compiled_versions"] == 6 and order["fallback_lines"] == []
    log = (out / "gpu_window.log").read_text()
    assert all(f"## {name}: exit 0" in log for name in stages)


def test_a_crashed_or_hung_stage_and_a_spent_budget_are_said_in_the_json(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    import gpu_window

    def crash(smoke):  # as a CUDA abort would: the process ends before it writes its result
        print("the GPU fell off the bus", file=sys.stderr, flush=True)
        os._exit(1)

    monkeypatch.setattr(gpu_window, "STAGES", ("probe", "trainer", "attention"))
    monkeypatch.setattr(gpu_window, "probe", crash)
    monkeypatch.setattr(gpu_window, "trainer", lambda smoke: time.sleep(60))
    monkeypatch.setitem(gpu_window.STAGE_CAP_S, "trainer", 1)
    monkeypatch.setattr(gpu_window, "attention", lambda smoke: {"said": print("attention ran") or True})
    report = gpu_window.window(tmp_path / "out", smoke=True, budget_s=60)
    assert report["stages"]["probe"] == {"ok": False, "error": "exit 1: the GPU fell off the bus"}
    assert report["stages"]["trainer"] == {"ok": False, "error": "exit -9: timed out after 1 s"}
    assert report["stages"]["attention"]["ok"] and report["stages"]["attention"]["said"]
    log = (tmp_path / "out" / "gpu_window.log").read_text()
    assert "## probe: exit 1\nthe GPU fell off the bus\n" in log and "## attention: exit 0\nattention ran\n" in log
    report = gpu_window.window(tmp_path / "out", smoke=True, budget_s=0)
    assert report["stages"]["trainer"]["error"] == "skipped: the window's budget is spent"
    assert json.loads((tmp_path / "out" / "gpu_window.json").read_text()) == json.loads(json.dumps(report))
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["gpu_window.json", "gpu_window.log"]
