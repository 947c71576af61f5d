import json
import subprocess
import sys

import pytest
from headlab import GPT, preset
from headlab.cli import describe, main


def _info(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headlab", "info", *args], capture_output=True, text=True)


@pytest.mark.parametrize("name,rank,fraction", [
    ("paper-128m", 46, 52.6), ("paper-1.2b", 51, 48.2), ("paper-2.5b", 55, 48.5), ("paper-6.3b", 54, 45.3)])
def test_info_reproduces_the_papers_lrkv_cache_fractions(name, rank, fraction, capsys):
    assert main(["info", "--preset", name, "--attention", "lrkv", "--kv-rank", str(rank), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert round(100 * row["kv_fraction_of_mha"], 1) == fraction
    assert row["kv_values_per_token_per_layer"] == 2 * (128 + preset(name).n_head * rank)


def test_info_table_lists_all_five_families_with_bytes(capsys):
    assert main(["info", "--preset", "paper-128m", "--context", "2048", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    for label in ("Standard MHA", "MQA", "GQA (3 KV heads)", "MLA (d_c=128)", "LRKV (r=46)"):
        assert label in out
    assert "72.0 MiB" in out  # MHA: 2·6·128 values × 12 layers × 2048 tokens × 2 bytes (paper Table 12)


def test_describe_counts_parameters_of_a_real_model_and_bytes_from_the_formula():
    config = preset("tiny", "mla", q_latent_dim=8)
    row = describe(config, context=10, dtype="float32", batch_size=3)
    assert row["params"] == sum(p.numel() for p in GPT(config).parameters())
    assert row["kv_cache_bytes"] == (12 + 4) * config.n_layer * 10 * 3 * 4


def test_python_m_headlab_info_rejects_bad_values_naming_the_field():
    result = _info("--preset", "paper-128m", "--attention", "lrkv", "--kv-rank", "200")
    assert result.returncode == 2
    assert "ModelConfig.kv_rank = 200" in result.stderr and "1..128" in result.stderr


def test_info_reads_a_config_file(tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(preset("tiny", "gqa").to_json())
    assert main(["info", "--config", str(path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["attention"] == "gqa" and row["kv_values_per_token_per_layer"] == 2 * 2 * 8
