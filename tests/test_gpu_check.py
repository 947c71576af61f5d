"""benchmarks/gpu_check.py in --smoke mode: the GPU check's every stage runs on CPU (tiny preset)."""

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd

from headlab.data import sources
from headlab.training.runs import has_checkpoint

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_gpu_check_smoke_runs_every_stage(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # dataclasses look their module up
    spec.loader.exec_module(gpu_check)
    runs, results = tmp_path / "runs", tmp_path / "results.json"
    assert gpu_check.main(["--smoke", "--runs-dir", str(runs), "--json", str(results)]) == 0
    report = json.loads(results.read_text())
    throughput = report["throughput"]
    assert [row["variant"] for row in throughput][0] == "Standard MHA" and len(throughput) == 6
    assert all(row["tokens_per_s"] > 0 and 0 < row["mfu"] for row in throughput)
    assert all(row["agree"] for row in report["cache"]) and len(report["generation"]) == 6
    assert any(c["check"].startswith("Standard MHA MFU") for c in report["checks"])
    assert sum(has_checkpoint(folder) for folder in runs.iterdir()) == 6
    summary = pd.read_csv(runs / "analysis" / "summary.csv")
    assert summary["model"].nunique() == 6 and set(summary["layer"]) == {0, 1}
    measured = {row["variant"]: row for row in report["report_measurements"]}
    assert len(measured) == 6 and all(row["moments_s"] > 0 and row["behaviour_s"] > 0 for row in measured.values())
    assert [v for v, row in measured.items() if row["norm_effect_s"] is None] == ["MLA (d_c=12)"]  # no QK-norm
    out = capsys.readouterr().out
    assert "### Head analysis" in out and "### The report's measurements on the training device" in out
