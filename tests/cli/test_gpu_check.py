"""tools/gpu_check.py: --smoke runs every stage a CPU can run (torchrun with gloo, FSDP, exact
resume, SDPA backends, the six variants' tables, tokenization) into one summary; the verdicts of the
GPU-only stages are checked here on the values they judge; any FAIL makes the exit status 1."""

import importlib.util
import json
import sys
from contextlib import nullcontext
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from headlab.data import sources
from headlab.model.config import preset
from headlab.model.gpt import GPT
from headlab.runs.checkpoints import has_checkpoint

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_check.py"


@pytest.fixture
def gpu_check(tmp_path, monkeypatch):
    """The script as a module, with its corpus cache (its training processes' too) in tmp_path."""
    return load_gpu_check(tmp_path, monkeypatch)


def load_gpu_check(tmp_path, monkeypatch):
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_smoke_runs_every_stage(gpu_check, tmp_path, capsys):
    runs, results = tmp_path / "runs", tmp_path / "results.json"
    assert gpu_check.main(["--smoke", "--runs-dir", str(runs), "--json", str(results)]) == 0
    report = json.loads(results.read_text())
    checks = {c["check"]: c for c in report["checks"]}
    assert len(checks) == len(report["checks"]) and {c["result"] for c in checks.values()} == {"PASS", "SKIP"}
    for name in ("torchrun FSDP", "checkpoint and exact resume", "decode cache bytes = formula",
                 "head analysis and report measurements", "tokenization: byte", "tokenization: bpe:8192"):
        assert checks[name]["result"] == "PASS", checks[name]
    assert "2 x cpu (gloo)" in checks["torchrun FSDP"]["detail"]
    assert "bit-identical" in checks["checkpoint and exact resume"]["detail"]
    for name in ("peak memory vs plan", "recompiles under --compile", "Standard MHA MFU", "tokens/s: MQA"):
        assert checks[name]["result"] == "SKIP", checks[name]  # GPU-only, or a performance target
    assert checks["torchrun DDP"] == {"check": "torchrun DDP", "result": "SKIP", "detail": "--smoke launches FSDP "
                                      "alone (the same check); a GPU node runs both"}
    assert report["sdpa_backends"] == {label: ["FLASH_ATTENTION (CPU)"] for label in report["sdpa_backends"]}
    assert len(report["sdpa_backends"]) == 6 and all(checks[f"SDPA backend: {v}"]["result"] == "PASS"
                                                     for v in report["sdpa_backends"])
    assert {(row["tokenizer"], row["workers"]) for row in report["tokenization"]} >= {("byte", 1), ("bpe:8192", 2)}
    throughput = report["throughput"]
    assert [row["variant"] for row in throughput][0] == "Standard MHA" and len(throughput) == 6
    assert all(row["tokens_per_s"] > 0 and 0 < row["mfu"] for row in throughput)
    assert all(row["agree"] for row in report["cache"]) and len(report["generation"]) == 6
    assert sum(has_checkpoint(folder) for folder in runs.iterdir()) == 6
    summary = pd.read_csv(runs / "analysis" / "summary.csv")
    assert summary["model"].nunique() == 6 and set(summary["layer"]) == {0, 1}
    measured = {row["variant"]: row for row in report["report_measurements"]}
    assert len(measured) == 6 and all(row["moments_s"] > 0 and row["behaviour_s"] > 0 for row in measured.values())
    assert [v for v, row in measured.items() if row["norm_effect_s"] is None] == ["MLA (d_c=12)"]  # no QK-norm
    out = capsys.readouterr().out
    assert "### Head analysis" in out and "### The report's measurements on the training device" in out
    assert "## Summary" in out and "| torchrun DDP " in out and f"{len(checks)} checks: " in out


def test_a_failed_check_or_a_broken_stage_makes_the_exit_status_1(gpu_check, tmp_path, monkeypatch, capsys):
    def broken(*args):
        raise RuntimeError("the GPU fell off the bus")

    monkeypatch.setattr(gpu_check, "distributed_checks", lambda launch: [gpu_check.Check("torchrun DDP", "FAIL", "x")])
    monkeypatch.setattr(gpu_check, "variant_checks", broken)
    monkeypatch.setattr(gpu_check, "tokenization_checks", lambda *args: [gpu_check.Check("tokenization", "PASS", "")])
    assert gpu_check.main(["--smoke", "--runs-dir", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 1
    checks = json.loads((tmp_path / "r.json").read_text())["checks"]
    assert [(c["check"], c["result"]) for c in checks] == [("torchrun DDP", "FAIL"), ("six variants", "FAIL"),
                                                           ("tokenization", "PASS")]
    assert checks[1]["detail"] == "raised RuntimeError: the GPU fell off the bus"
    assert "3 checks: 1 PASS, 2 FAIL, 0 WARN, 0 SKIP" in capsys.readouterr().out
    monkeypatch.setattr(gpu_check, "distributed_checks", lambda launch: [])
    monkeypatch.setattr(gpu_check, "variant_checks", lambda *args: [gpu_check.Check("MFU", "SKIP", "")])
    assert gpu_check.main(["--smoke", "--runs-dir", str(tmp_path)]) == 0


def test_gpu_only_verdicts_judge_what_a_gpu_would_show(gpu_check):
    """The CUDA branches of the SDPA, memory, resume and recompile checks, on the values they judge."""
    assert gpu_check.sdpa_check("GQA", {"FLASH_ATTENTION"}, "cuda").result == "PASS"
    assert gpu_check.sdpa_check("GQA", {"FLASH_ATTENTION", "MATH"}, "cuda").result == "FAIL"
    assert gpu_check.sdpa_check("GQA", {"MATH"}, "cpu").result == "PASS"
    assert gpu_check.sdpa_check("GQA", set(), "cpu").result == "FAIL"
    assert gpu_check.memory_check("MHA", 9 << 30, 10 << 30).result == "PASS"
    assert gpu_check.memory_check("MHA", 11 << 30, 10 << 30).detail.endswith("(ratio 1.10)")
    assert gpu_check.memory_check("MHA", 11 << 30, 10 << 30).result == "FAIL"
    assert gpu_check.resume_verdict(0.0, "cuda").result == "PASS"
    assert "not bit-identical" in gpu_check.resume_verdict(3e-7, "cuda").detail
    assert gpu_check.resume_verdict(3e-7, "cpu").result == gpu_check.resume_verdict(1e-3, "cuda").result == "FAIL"
    seen = {"MHA": {"recompiles": []}, "MQA": {"recompiles": ["Recompiling function forward\n  - size mismatch"]}}
    assert [c.result for c in gpu_check.recompile_checks(seen, compiled=True)] == ["PASS", "FAIL"]


def test_sdpa_backends_sees_a_fallback_to_math(gpu_check):
    model = GPT(preset("tiny", "gqa"))
    with sdpa_kernel(SDPBackend.MATH):
        assert gpu_check.sdpa_backends(model, nullcontext()) == {"MATH"}
    assert all(p.grad is None for p in model.parameters())


def test_recompile_log_counts_recompilations_not_first_compilations(gpu_check):
    def double(x):
        return 2 * x

    torch.compiler.reset()
    compiled = torch.compile(double, backend="eager")  # dynamo's guards without inductor: CPU-cheap
    with gpu_check.RecompileLog() as log:
        compiled(torch.ones(3))
        compiled(torch.ones(3))
        assert log.messages == []
        compiled(torch.ones(4))  # another shape fails the first compilation's guards
    assert len(log.messages) == 1 and "double" in log.messages[0]
    torch.compiler.reset()


def test_a_node_with_base_dependencies_only_gets_the_table_with_reasons(tmp_path, monkeypatch, capsys):
    """Without pyarrow and zstandard (the corpora extra) and without a GPU the check still loads
    and prints its summary: every GPU row and the tokenization row SKIP, each saying why; exit 0."""
    for module in ("pyarrow", "pyarrow.parquet", "zstandard"):
        monkeypatch.setitem(sys.modules, module, None)  # `import pyarrow` now raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "benchmarks.tokenization", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    module = load_gpu_check(tmp_path, monkeypatch)
    assert module.main(["--runs-dir", str(tmp_path / "runs"), "--json", str(tmp_path / "r.json")]) == 0
    checks = json.loads((tmp_path / "r.json").read_text())["checks"]
    assert {c["result"] for c in checks} == {"SKIP"} and len(checks) == len(module.GPU_STAGES) + 1
    assert all("no CUDA device" in c["detail"] for c in checks[:-1])
    assert checks[-1]["check"] == "tokenization" and "pyarrow" in checks[-1]["detail"]
    assert "headlab[corpora]" in checks[-1]["detail"] and "## Summary" in capsys.readouterr().out


def test_a_missed_performance_target_warns_without_failing_the_node(gpu_check, tmp_path, monkeypatch):
    missed = gpu_check.target("Standard MHA MFU", False, "31.0% (target >= 40%)", enforced=True)
    assert missed.result == "WARN"
    assert gpu_check.target("Standard MHA MFU", True, "", enforced=True).result == "PASS"
    monkeypatch.setattr(gpu_check, "distributed_checks", lambda launch: [gpu_check.Check("torchrun DDP", "PASS", "")])
    monkeypatch.setattr(gpu_check, "variant_checks", lambda *args: [missed])
    monkeypatch.setattr(gpu_check, "tokenization_checks", lambda *args: [])
    assert gpu_check.main(["--smoke", "--runs-dir", str(tmp_path)]) == 0


def _fake_torch(folder: Path, version: str) -> str:
    """A PYTHONPATH whose `torch` reports `version` and 8 CUDA devices, and nothing else."""
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text(f"__version__ = {version!r}\n"
                                                  "class version:\n    cuda = '12.8'\n"
                                                  "class cuda:\n    is_available = staticmethod(lambda: True)\n"
                                                  "    device_count = staticmethod(lambda: 8)\n")
    return str(folder)


def test_the_wrapper_refuses_a_torch_older_than_pyprojects_bound_before_anything_runs(tmp_path):
    """The oldest torch `make test-torch` ran green is pyproject.toml's `torch>=X.Y`: gpu_check.sh reads
    that bound, refuses one minor release below it in one line (exit status 2), and lets the bound
    itself through to the next gate (here: the modules the check needs, one made missing)."""
    import os
    import re
    import subprocess

    pyproject = (SCRIPT.parents[1] / "pyproject.toml").read_text()
    major, minor = map(int, re.search(r'"torch>=(\d+)\.(\d+)"', pyproject).groups())
    older = f"{major}.{minor - 1}.0+cu128"

    def wrapper(pythonpath: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT.with_suffix(".sh"))], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": pythonpath})

    refused = wrapper(_fake_torch(tmp_path / "old", older))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert f"torch {older}; headlab needs torch >= {major}.{minor} (pyproject.toml)" in refused.stderr
    assert "Traceback" not in refused.stderr
    _fake_torch(tmp_path / "new", f"{major}.{minor}.0+cu128")
    at_bound = wrapper(_without(tmp_path / "new", "tqdm"))
    assert at_bound.returncode == 2 and "needs torch" not in at_bound.stderr, at_bound.stderr[-2000:]
    assert "lacks tqdm" in at_bound.stderr


def _without(tmp_path, *names: str) -> str:
    """A PYTHONPATH on which each of `names` is a package whose import fails as a missing one's does."""
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named {name!r}\")\n")
    return str(tmp_path)


def test_the_wrapper_names_every_missing_module_the_check_uses_in_one_line(tmp_path):
    """A Python without scipy and tqdm (two modules the check imports through headlab): gpu_check.sh
    names both in one line and exits with status 2 before any stage runs, no traceback."""
    import os
    import subprocess

    done = subprocess.run(["bash", str(SCRIPT.with_suffix(".sh")), "--smoke"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHON": sys.executable,
                                            "PYTHONPATH": _without(tmp_path, "scipy", "tqdm", "ipywidgets")})
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == [f"node_checks.py: {sys.executable} lacks scipy, tqdm, which the GPU checks "
                                        "use: pip install scipy tqdm (or pip install -e . in the checkout)"]


def test_the_checks_need_neither_ipywidgets_nor_the_figures_modules(tmp_path):
    """The GPU image has no ipywidgets (nor, perhaps, matplotlib or seaborn): the wrapper's step that
    refused such a node (exit status 2) lets it through; tests/cli/test_gpu_window.py runs the
    window's stages without them."""
    import os
    import subprocess

    done = subprocess.run([sys.executable, str(SCRIPT.parent / "node_checks.py")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH":
                                           _without(tmp_path, "ipywidgets", "matplotlib", "seaborn")})
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]


def test_the_variants_train_at_a_batch_the_card_holds(gpu_check):
    """paper-128m's six variants at 16 sequences need more than a 16-24 GB card: halved until the
    plan fits (a T4's 16 GB: 4); an 80 GB card keeps 16."""
    from headlab.study.roles import comparison_variants
    from headlab.training.memory import USABLE_MEMORY_FRACTION, memory_per_device

    variants = gpu_check.sys.modules["gpu_variants"]
    for gib in (16, 24):
        fitting = variants.fitting_batch_size("paper-128m", 16, None, gib << 30)
        assert 1 <= fitting < 16
        assert all(memory_per_device(config, fitting, 1, "ddp", "muon", "bfloat16").total
                   <= USABLE_MEMORY_FRACTION * (gib << 30) for config in comparison_variants("paper-128m"))
    assert variants.fitting_batch_size("paper-128m", 16, None, 80 << 30) == 16
