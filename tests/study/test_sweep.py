"""headlab sweep: every grid point an ordinary study, the table's differences are the paired
statistics of those runs, and the paragraph says what the rule says."""

import re
from pathlib import Path

import pandas as pd
import pytest

from headlab.analysis.tables import load_tables
from headlab.cli.main import main
from headlab.io import Manifest
from headlab.report import plots
from headlab.report.sweep_page import write_sweep_report
from headlab.study.claims import difference_to_mha, margins, per_seed_metrics
from headlab.study.roles import comparison_roles
from headlab.study.sweep import GridPoint, grid
from headlab.study.sweep_claims import sweep_sentences, verdict
from headlab.study.table_files import loss_unit
from headlab.study.tables import analysis_tables, training_table


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    # One job: worker processes would each import torch again, which costs more than these tiny runs
    # (the sweep of some roles below keeps the default, runs in worker processes).
    assert main(["sweep", "--preset", "tiny", "--lengths", "0.1", "0.2", "--seeds", "2", "--jobs", "1",
                 "--out", str(out)]) == 0
    tables, _ = load_tables(out, "sweep.json", "a sweep folder")
    return out, tables["sweep"]


def test_every_grid_point_is_a_reusable_study_and_the_table_holds_its_paired_statistics(swept):
    out, table = swept
    assert list(dict.fromkeys(table["point"])) == ["x0.1", "x0.2"] and list(dict.fromkeys(table["steps"])) == [4, 8]
    point = GridPoint("tiny", 0.2)
    runs = point.study(out).train(seeds=2, progress=False, log=lambda message: None)  # reused, not retrained
    assert all(r.run.step == 8 for r in runs)
    metrics = per_seed_metrics(analysis_tables(runs)["summary"], training_table(runs, loss_unit("byte")))
    rows = table[table["point"] == "x0.2"]
    assert len(rows) == 5 * 3 + 2  # five variants x (loss, two ranks), MLA's ranks at the other RoPE setting
    for row in rows.itertuples():
        column = {"validation loss": "val_loss", "uncentered effective rank": "uncentered",
                  "centered effective rank": "centered"}[row.metric]
        d = difference_to_mha(metrics, row.role, row.mla_rope, column)
        assert (row.mean, row.half_width, row.seeds) == pytest.approx((d.mean, d.half_width, 2))
        assert (row.margin, row.verdict) == (margins(metrics)[column], d.verdict(row.margin))
    text = (out / "sweep.md").read_text()
    assert all(f"- {s}" in text for s in sweep_sentences(table))
    assert (out / "figures" / "sweep.png").stat().st_size > 1000 and not (out / "figures" / "sweep.svg").exists()


def test_the_sweep_figure_draws_every_variant_in_its_flagship_colour(swept, tmp_path, monkeypatch):
    """The sweep draws only differences to Standard MHA, yet each variant keeps the colour the
    flagship and every other figure give it (a palette of the six), MLA's two settings MLA's."""
    _, table = swept
    roles = comparison_roles("tiny")
    flagship = plots.palette({config.label: role for role, config in roles.items()})
    figures, draw = [], plots.sweep_figure
    monkeypatch.setattr(plots, "sweep_figure", lambda *args, **kw: figures.append(draw(*args, **kw)) or figures[-1])
    write_sweep_report(table, tmp_path / "report")
    (legend,) = figures[0].legends
    drawn = {text.get_text(): handle.get_color() for handle, text in zip(legend.legend_handles, legend.get_texts())}
    assert drawn == {name: flagship[roles[role].label] for role, name in zip(table["role"], table["comparison"])}
    assert drawn[next(name for name in drawn if "excluded" in name)] == flagship[roles["mla"].label]


def _rows(means, verdicts, lengths=(1, 4, 10)):
    return pd.DataFrame({"length": lengths, "mean": means, "verdict": verdicts})


@pytest.mark.parametrize("means,verdicts,expected", [
    ([0.5, -0.2, 0.1], ["within", "within", "within"], "within the margin everywhere"),
    ([-5.0, -4.0, -6.0], ["lower", "lower", "lower"], "holds everywhere"),
    ([-5.0, 1.0, 4.0], ["lower", "within", "higher"], "changes sign"),
    ([-15.0, -7.0, 3.0], ["lower", "lower", "undecided"], "shrinks toward zero"),
    ([0.5, 2.0, 6.0], ["within", "undecided", "higher"], "appears"),
    ([-5.0, 0.5, -6.0], ["lower", "within", "lower"], "ordered at 2 of 3 points"),
])
def test_the_verdict_follows_the_rule_along_training_length(means, verdicts, expected):
    assert verdict(_rows(means, verdicts)) == expected
    assert verdict(_rows(means[::-1], verdicts[::-1], lengths=(10, 4, 1))) == expected  # order of rows is irrelevant


def test_the_paragraph_groups_comparisons_by_verdict():
    table = pd.DataFrame([{"point": f"x{length}", "length": length, "steps": 10 * length, "n_layer": 4, "role": role,
                           "comparison": name, "mla_rope": "included", "metric": "uncentered effective rank",
                           "unit": "points", "mean": mean, "half_width": 1.0, "seeds": 3, "margin": 3.0,
                           "verdict": "within" if abs(mean) < 2.0 else "lower"}
                          for length, means in ((1, (-15.0, -5.0)), (10, (0.5, -6.0)))
                          for (role, name), mean in zip((("mla", "MLA"), ("mqa", "MQA")), means)])
    sentences = sweep_sentences(table)
    assert sentences[0] == ("Across the 2 grid points (along length), by the paired 95% rule with each metric's "
                            "margin δ (within ±δ, an ordering only beyond it):")
    assert "shrinks toward zero: MLA: uncentered effective rank." in sentences
    assert "holds everywhere (lower than Standard MHA): MQA: uncentered effective rank." in sentences
    assert sweep_sentences(table.assign(seeds=1)) == ["One seed per point: no orderings claimed."]


def test_a_bad_grid_is_one_clear_line(capsys):
    assert main(["sweep", "--preset", "tiny", "--set", "kv_rank=0"]) == 2
    assert "kv_rank" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not ModelConfig or TrainConfig fields"):
        grid("tiny", [1.0], fields={"colour": [1]})
    with pytest.raises(SystemExit, match="2"):  # the lengths axis sets the steps
        main(["sweep", "--preset", "tiny", "--set", "steps=10,20"])
    assert "FIELD=V1,V2" in capsys.readouterr().err


def test_a_grid_over_training_settings_trains_each_point_with_them():
    points = grid("tiny", [1.0], fields={"optimizer": ["adamw", "muon"], "weight_decay": [0.0, 0.1]})
    assert [p.key for p in points] == ["x1-optimizeradamw-weight_decay0", "x1-optimizeradamw-weight_decay0.1",
                                       "x1-optimizermuon-weight_decay0", "x1-optimizermuon-weight_decay0.1"]
    config = points[3].study(Path("s")).train_config(1)
    assert (config.optimizer, config.weight_decay, config.seed) == ("muon", 0.1, 1)
    assert points[3].study(Path("s")).roles == GridPoint("tiny", 1.0).study(Path("s")).roles  # models untouched
    with pytest.raises(ValueError, match="optimizer"):
        grid("tiny", [1.0], fields={"optimizer": ["sgd"]})


def test_every_grid_point_trains_distinct_runs():
    keys = [p.key for p in grid("tiny", [1.0], fields={"rope_base": [100000.0, 100000.4]})]
    assert len(set(keys)) == 2  # not both 'rope_base100000'
    for lengths, fields in (([0.001, 0.01], {}), ([1.0, 1.0], {}), ([1.0], {"kv_rank": [2, 2]}),
                            ([1.0], {"kv_residual_init": [0.0, -0.0]}), ([1.0], {"lr": [0.001, 1e-3]})):
        with pytest.raises(ValueError, match="train the same runs"):
            grid("tiny", lengths, fields=fields, only=("mha", "lrkv-large"))
    with pytest.raises(ValueError, match="roles lrkv-small and lrkv-large become the same model"):
        grid("tiny", [1.0], fields={"kv_rank": [2, 4]})  # both LRKV roles at each rank: one model twice
    with pytest.raises(ValueError, match="give one of them"):
        grid("tiny", [1.0], depths=[2], fields={"n_layer": [3]})


def test_a_sweep_of_some_roles_over_a_field_compares_the_same_variant_at_every_point(tmp_path, capsys):
    out = tmp_path / "some"
    # one job: worker processes (test_study.py holds them bit for bit) would each import torch again
    assert main(["sweep", "--preset", "tiny", "--lengths", "0.1", "--set", "kv_residual_init=0,1", "--seeds", "2",
                 "--only", "mha", "lrkv-large", "--jobs", "1", "--out", str(out), "--svg"]) == 0
    table = load_tables(out, "sweep.json", "a sweep folder")[0]["sweep"]
    listed = Manifest.read(out, "sweep.json", "a sweep folder").files
    assert {"figures/sweep.png", "figures/sweep.svg"} <= set(listed) and (out / "figures" / "sweep.svg").is_file()
    assert set(table["role"]) == {"lrkv-large"} and table["comparison"].nunique() == 1  # not one name per init
    assert sorted(table["kv_residual_init"].unique()) == [0.0, 1.0]
    assert all(len(rows) == 2 for _, rows in table.groupby(["comparison", "metric"]))
    assert sorted(p.name for p in (out / "x0.1-kv_residual_init0" / "runs").iterdir()) == [
        "lrkv-r4-init-0-seed0", "lrkv-r4-init-0-seed1", "standard-mha-seed0", "standard-mha-seed1"]
    assert "nan" not in (out / "sweep.md").read_text()
    assert main(["sweep", "--preset", "tiny", "--only", "mqa", "--out", str(tmp_path / "no-mha")]) == 2
    assert "include 'mha'" in capsys.readouterr().err and not (tmp_path / "no-mha").exists()
    assert main(["sweep", "--preset", "tiny", "--only", "mha", "mha", "--out", str(tmp_path / "mha-alone")]) == 2
    assert "at least one variant" in capsys.readouterr().err and not (tmp_path / "mha-alone").exists()


def test_a_field_set_twice_is_refused_in_one_line_before_the_folder_exists(tmp_path, capsys):
    out = tmp_path / "twice"
    assert main(["sweep", "--preset", "tiny", "--set", "lr=0.001", "--set", "lr=0.01,0.02", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == "headlab: error: --set lr is given twice: give it once"
    assert not out.exists()
    for refused in (["--set", "attention=mha,mla"], ["--set", "device=meta"], ["--jobs", "99"]):
        assert main(["sweep", "--preset", "tiny", *refused, "--out", str(out)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1 and not out.exists()


def test_a_field_no_trained_role_reads_is_refused_in_one_line_before_the_folder_exists(tmp_path, capsys):
    """kv_rank swept over MHA and MLA alone trained the same runs at every point, under other names."""
    out = tmp_path / "unread"
    for setting, only, readers in (("kv_rank=2,4", ["mha", "mla"], "lrkv-small, lrkv-large"),
                                   ("n_kv_head=1,2", ["mha", "mqa"], "gqa"),
                                   ("q_latent_dim=0,8", ["mha", "gqa"], "mla"),
                                   ("lrkv_factor_decay=true,false", ["mha", "mla"], "lrkv-small, lrkv-large")):
        assert main(["sweep", "--preset", "tiny", "--set", setting, "--only", *only, "--out", str(out)]) == 2
        said = capsys.readouterr().err.strip()
        assert len(said.splitlines()) == 1 and not out.exists()
        assert f"changes none of the roles trained ({', '.join(only)}): only {readers} read it" in said
    assert len(grid("tiny", [1.0], fields={"kv_rank": [2, 4]}, only=("mha", "lrkv-large"))) == 2  # a reader: fine
    assert len(grid("tiny", [1.0], fields={"arch": ["headlab", "nanochat"]}, only=("mha", "mqa"))) == 2


def test_a_diverged_point_is_named_and_the_others_are_tabulated(tmp_path, capsys, monkeypatch):
    from headlab.study import study as study_module

    out = tmp_path / "diverging"
    argv = ["sweep", "--preset", "tiny", "--lengths", "0.1", "--seeds", "1", "--only", "mha", "mla",
            "--set", "lr=0.003,10", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "1 of 2 grid point(s) diverged (x0.1-lr10): left out of the table, which holds the other points" in said
    assert re.search(r"sweep point x0.1-lr10 left out: 2 run\(s\) diverged, .*standard-mha-seed0: loss [\d.]+ "
                     r"nats/byte at step 4, worse than a uniform guess \(ln 256 = 5.545\)", said)
    table = load_tables(out, "sweep.json", "a sweep folder")[0]["sweep"]
    assert set(table["point"]) == {"x0.1-lr0.003"} and (out / "sweep.md").exists()
    train = study_module.train  # a finished run is reused through it: it loads, trains nothing

    def reused(config, train_config, corpus, out, **kwargs):
        assert "lr10" not in str(out), "a diverged run was trained again"
        return train(config, train_config, corpus, out=out, **kwargs)

    monkeypatch.setattr(study_module, "train", reused)
    assert main(argv) == 0  # the rerun reports the same
    assert "x0.1-lr10 left out" in capsys.readouterr().out
    assert main([*argv[:-6], "--set", "lr=10", "--jobs", "1", "--out", str(out)]) == 2  # nothing left: one line
    assert capsys.readouterr().err.strip().splitlines() == [
        "headlab: error: 1 of 1 grid point(s) diverged (x0.1-lr10): nothing to tabulate; sweep lower learning rates"]
