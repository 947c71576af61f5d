"""headlab.report: a study end to end on the tiny preset with two seeds (every artefact, this
run's own numbers, MLA both ways), the paper's numbers attached by role, and prose that follows
the statistics: each claim appears exactly when its rule says so."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as scipy_stats

import headlab.analysis.heads
import headlab.analysis.similarity
import headlab.report.writer
import headlab.study.stats
import headlab.study.tables
from doc_blocks import code_block, run_python
from headlab.cli.main import main
from headlab.model.gpt import GPT
from headlab.report.writer import DOCS_FIGURES, FIGURES, write_report
from headlab.study.claims import claims, per_seed_metrics, rule_text
from headlab.study.conclusions import rank_table, with_conclusions, without_conclusions
from headlab.study.paper import PAPER, SEED_SPECTRA
from headlab.study.roles import comparison_roles
from headlab.study.table_files import SHIPPED, StudyTables, read_study_tables
from headlab.study.tables import rope_ratio_table

pytestmark = pytest.mark.xdist_group("report_study")  # `study` trains runs: made once (conftest)

STEPS = 12
ROLES = comparison_roles("tiny")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The README's way from runs to tables to report, run as written but for its budget: the tiny
    preset for STEPS steps, 2 seeds, quiet, into a temporary folder."""
    out = tmp_path_factory.mktemp("report")
    run = run_python(code_block("README.md", "from headlab.study import Study"), substitutes=[
        ('Study("cpu-small", None, "runs/reproduce")', f'Study("tiny", {STEPS}, {str(out)!r})'),
        ("study.train(seeds=3)", "study.train(seeds=2, progress=False, log=lambda message: None)"),
        ('"cpu-small", study.folder', '"tiny", study.folder')])
    return out, run["runs"], run["report"]


def _report_row(text: str, section: str, name: str) -> list[str]:
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    row = next(line for line in body.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_every_artefact_is_written(study):
    out, _, path = study
    assert path == out / "report.md"
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
    assert not list((out / "figures").glob("*.svg"))  # SVG only when asked for (svg=True, --svg)
    text = path.read_text()
    for name in FIGURES:
        assert f"figures/{name}.png" in text
    for name in ("spectra", "summary", "similarity", "norms"):
        table = pd.read_csv(out / f"{name}.csv")
        assert set(table["mla_rope"]) == {"included", "excluded"} and set(table["seed"]) == {0, 1}, name
        assert set(table["role"]) == set(ROLES), name
    training = pd.read_csv(out / "training.csv")
    assert set(training["loss_unit"]) == {"nats/byte"}
    assert (training.groupby(["model", "seed"])["step"].max() == STEPS).all()


def test_report_quotes_this_runs_numbers_as_mean_and_sd(study):
    out, _, path = study
    text = path.read_text()
    training, summary = pd.read_csv(out / "training.csv"), pd.read_csv(out / "summary.csv")
    final = training[training["step"] == STEPS]
    for role, config in ROLES.items():
        losses = final[final["model"] == config.label]["val_loss"]
        assert len(losses) == 2 and losses.iloc[0] != losses.iloc[1]  # two trainings, not one counted twice
        loss_row = _report_row(text, "## Validation loss", config.label)
        assert loss_row[1] == f"{losses.mean():.3f} ± {losses.std(ddof=1):.3f}"
        assert loss_row[3] == "2"
        name = config.label + (", RoPE part included" if role == "mla" else "")
        rows = summary[(summary["model"] == config.label) & (summary["mla_rope"] == "included")
                       & (summary["circuit"] == "qk") & (summary["kind"] == "uncentered")]
        by_seed = rows.groupby("seed")["effective_rank_pct_of_heads"].mean()
        by_layer = rows.groupby("layer")["effective_rank_pct_of_heads"].mean()
        expected = f"{by_seed.mean():.1f} ± {by_seed.std(ddof=1):.1f} [{by_layer.min():.1f}–{by_layer.max():.1f}]"
        assert _report_row(text, "## Effective rank", name)[1] == expected
        assert int(_report_row(text, "## KV cache", config.label)[1]) == config.kv_cache_values_per_token()
    mla = ROLES["mla"].label
    latent_only = _report_row(text, "## Effective rank", f"{mla}, RoPE part excluded (the paper's definition)")
    assert latent_only[-2:] == ["83.9", "78.5"]
    assert "**2 seed(s)**" in text and "95% t-interval" in text


def test_paper_numbers_attach_to_the_variant_of_their_role(study):
    """Each row carries the paper's numbers for its own role, whatever the order of the rows."""
    out, runs, _ = study
    tables = read_study_tables(out)
    metrics = per_seed_metrics(tables["summary"], tables["training"])
    shuffled = metrics.sample(frac=1.0, random_state=0)
    table = rank_table(tables["summary"], shuffled)
    assert set(PAPER) == set(ROLES)
    published = {"Standard MHA": (95.4, 82.4), "LRKV (r=16)": (88.8, 81.5), "LRKV (r=64)": (96.2, 83.0),
                 "MQA": (72.6, 78.4), "MLA (d_c=128)": (83.9, 78.5), "GQA (3 groups)": (90.5, 79.6)}
    paper_of_family = {"mha": "Standard MHA", "mqa": "MQA", "mla": "MLA (d_c=128)", "gqa": "GQA (3 groups)"}
    for row in table.to_dict("records"):
        config = ROLES[row["role"]]
        assert row["ours"].startswith(config.label)
        paper = row["paper (128M)"]
        if config.attention == "lrkv":  # the smaller of our two ranks stands for the paper's r=16
            smaller = config.kv_rank == min(c.kv_rank for c in ROLES.values() if c.attention == "lrkv")
            assert paper == ("LRKV (r=16)" if smaller else "LRKV (r=64)")
        else:
            assert paper == paper_of_family[config.attention]
        assert (row["paper uncentered"], row["paper centered"]) == published[paper]
    assert list(table["role"]) == [*ROLES, "mla"]  # figure order, then MLA at the other setting


# ---- prose from statistics ----------------------------------------------------------------

def synthetic_metrics(seeds: int, loss_gap: float, loss_noise: float, rank_gap: float = 0.0) -> pd.DataFrame:
    """Per-seed metrics of the six roles: MQA's loss = MHA's + loss_gap + alternating ±loss_noise,
    GQA's uncentered rank = MHA's − rank_gap; every other difference is alternating noise of 0.5
    points (within the ±3-point margin); centering adds 10 points to every run."""
    rows = []
    for seed in range(seeds):
        sign = 1 if seed % 2 else -1
        base_loss, base_rank = 2.0 + 0.1 * seed, 80.0 + seed
        for role, config in ROLES.items():
            loss = base_loss + (loss_gap + sign * loss_noise if role == "mqa" else 0.0)
            rank = base_rank - (rank_gap if role == "gqa" else 0.0) + (0.0 if role == "mha" else sign * 0.5)
            for mla_rope in ("included", "excluded"):
                rows.append({"role": role, "model": config.label, "mla_rope": mla_rope, "seed": seed,
                             "val_loss": loss, "loss_unit": "nats/byte", "uncentered": rank, "centered": rank + 10.0})
    return pd.DataFrame(rows)


def _half_width(differences) -> float:
    d = np.asarray(differences, dtype=float)
    return scipy_stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)


def test_an_ordering_appears_when_its_interval_excludes_zero():
    sentences = claims(synthetic_metrics(seeds=3, loss_gap=0.1, loss_noise=0.002, rank_gap=4.0))
    half = _half_width([0.1 - 0.002, 0.1 + 0.002, 0.1 - 0.002])
    mean = np.mean([0.1 - 0.002, 0.1 + 0.002, 0.1 - 0.002])
    assert f"MQA: validation loss higher than Standard MHA by {mean:.3f} ± {half:.3f} nats/byte." in sentences
    gqa = "GQA (2 KV heads): uncentered effective rank lower than Standard MHA by 4."
    assert any(s.startswith(gqa) for s in sentences)
    rise = "MQA: centering raises the effective rank by 10.00 ± 0.00 points of % of H (the paper: 72.6% → 78.4%)."
    assert rise in sentences


def test_an_ordering_vanishes_within_seed_noise_or_below_the_margin():
    sentences = claims(synthetic_metrics(seeds=3, loss_gap=0.001, loss_noise=0.03))
    assert not any("MQA: validation loss higher" in s or "MQA: validation loss lower" in s for s in sentences)
    assert any(s.startswith("MQA: validation loss undecided against Standard MHA at ±0.05 nats/byte (-0.009 ± ")
               for s in sentences)  # the interval reaches past the margin: neither equal nor ordered
    assert not any("effective rank higher" in s or "effective rank lower" in s for s in sentences)
    for role in ("lrkv-small", "lrkv-large", "mqa", "gqa"):  # 0.5-point alternating noise only
        assert any(s.startswith(f"{ROLES[role].label}: uncentered effective rank equal to Standard MHA's within ±3 "
                                "points of % of H (") for s in sentences)
    mla = ROLES["mla"].label
    assert any(s.startswith(f"{mla}, RoPE part excluded (the paper's definition): centered effective rank equal to "
                            "Standard MHA's within ±3") for s in sentences)
    # an interval that excludes zero yet lies inside the margin: significance without substance, no ordering
    small = claims(synthetic_metrics(seeds=3, loss_gap=0.02, loss_noise=0.002))
    assert any(s.startswith("MQA: validation loss equal to Standard MHA's within ±0.05 nats/byte (+0.019 ± ")
               for s in small)


def test_one_seed_claims_no_ordering():
    assert claims(synthetic_metrics(seeds=1, loss_gap=0.5, loss_noise=0.0, rank_gap=20.0)) == [
        "One seed: no orderings claimed."]
    assert "no ordering" in rule_text(1, 1)


def test_the_rule_states_how_many_orderings_chance_alone_would_give():
    sentences = claims(synthetic_metrics(seeds=3, loss_gap=0.1, loss_noise=0.002, rank_gap=4.0))
    text = rule_text(3, len(sentences))
    assert f"The {len(sentences)} comparisons below" in text
    assert f"about {0.05 * len(sentences):.1f} of them would still come out as orderings" in text


def test_rope_to_latent_ratio_measures_the_rope_part(study):
    import torch

    from headlab.study.study import StudyRun
    from shared_fixtures import tiny_model

    _, runs, _ = study
    ratios = rope_ratio_table(runs)
    assert list(ratios["seed"]) == [0, 1] and (ratios["rope_to_latent"] > 0).all()
    model = tiny_model("mla")
    config = model.config
    with torch.no_grad():
        for block in model.blocks:
            block.attn.wkv_a.weight[config.kv_latent_dim:] = 0  # the shared RoPE key
    no_rope = StudyRun("mla", config, 0, runs[0].folder, type(runs[0].run)(model, config, None, 0))
    assert rope_ratio_table([no_rope])["rope_to_latent"].tolist() == [pytest.approx(0.0, abs=1e-12)]


def test_report_has_the_through_training_and_measures_sections_with_their_figures(study):
    out, runs, path = study
    text = path.read_text()
    for section in ("## Effective rank through training", "## Do the measures agree?"):
        assert section in text
    for name in ("effective_rank_through_training_uncentered", "effective_rank_through_training_centered",
                 "measures_uncentered", "measures_centered"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000 and f"figures/{name}.png" in text
    snapshots = pd.read_csv(out / "snapshot_summary.csv")
    assert snapshots.groupby(["model", "seed"])["step"].max().eq(STEPS).all() and snapshots["step"].min() == 0
    measures = pd.read_csv(out / "measures.csv")
    assert set(measures["measure"]) == {"frobenius", "data", "jensen_shannon"} and set(measures["seed"]) == {0, 1}
    assert "Query compensation" in text or "One seed" in text


def test_headlab_report_redraws_the_same_report_from_the_tables_alone(study, monkeypatch, capsys):
    """`headlab report DIR` reads the study's tables and nothing else: with the run folders moved
    away and analysis made to fail, it rewrites report.md identically and redraws every figure."""
    out, _, path = study
    written = path.read_text()
    path.unlink()
    (out / "figures" / "spectra_uncentered.png").unlink()

    def no_analysis(*args, **kwargs):
        raise AssertionError("the report re-analysed a model")

    for module in (headlab.analysis.similarity, headlab.study.tables):
        monkeypatch.setattr(module, "analyze", no_analysis)
    monkeypatch.setattr(headlab.study.tables, "analyze_study", no_analysis)
    (out / "runs").rename(out / "runs-away")
    try:
        assert main(["report", str(out)]) == 0
    finally:
        (out / "runs-away").rename(out / "runs")
    assert path.read_text() == written
    assert (out / "figures" / "spectra_uncentered.png").stat().st_size > 1000


def test_headlab_report_refuses_edited_tables_naming_the_file(study, capsys):
    out, _, _ = study
    summary = out / "summary.csv"
    original = summary.read_bytes()
    try:
        summary.write_bytes(original.replace(b"Standard MHA", b"Standard MHB", 1))
        assert main(["report", str(out)]) == 2
        assert "summary.csv does not match" in capsys.readouterr().err
    finally:
        summary.write_bytes(original)
    assert set(read_study_tables(out).tables) >= {"summary", "spectra", "training", "measures", "snapshot_summary"}


def test_a_report_cut_short_leaves_the_previous_one_whole(study, monkeypatch):
    """report.md is replaced atomically: a write that dies half-way (a full disk) leaves the
    previous report byte for byte, and no temporary file behind."""
    import dataclasses

    import headlab.io

    out, _, path = study
    before = path.read_bytes()
    tables = read_study_tables(out)
    renamed = dataclasses.replace(tables, meta={**tables.meta, "preset": "another"})  # a different report
    real_write = headlab.io.HashingFile.write

    def dies_half_way(self, data):  # every atomic write goes through a HashingFile; report.md is the one here
        real_write(self, memoryview(data)[:len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(headlab.io.HashingFile, "write", dies_half_way)
    with pytest.raises(OSError):
        write_report(renamed, out)
    assert path.read_bytes() == before
    assert not [p for p in out.iterdir() if p.name.startswith(".report.md")]


def test_each_claim_says_whether_it_has_settled_since_half_way():
    """The same comparison half-way through training: MQA's loss gap to MHA shrank by 0.1 in every
    seed since then, more than the ±0.05 margin (still moving); GQA's rank gap is the same up to
    seed noise: its change is shown, not judged (a 'settled' verdict turned on machine noise)."""
    from headlab.study.claims import Halfway

    end = synthetic_metrics(seeds=3, loss_gap=0.1, loss_noise=0.002, rank_gap=4.0)
    half = synthetic_metrics(seeds=3, loss_gap=0.2, loss_noise=0.002, rank_gap=4.0)
    gqa = half["role"] == "gqa"
    half.loc[gqa, "uncentered"] += np.tile([0.3, 0.3, -0.3, -0.3, 0.1, 0.1], 1)[:gqa.sum()]
    sentences = claims(end, Halfway(half, rank_step=50, loss_step=40))
    mqa_loss = next(s for s in sentences if s.startswith("MQA: validation loss"))
    assert mqa_loss.endswith("[still moving: changed by -0.100 ± 0.000 since step 40].")
    gqa_rank = next(s for s in sentences if s.startswith(f"{ROLES['gqa'].label}: uncentered effective rank"))
    assert "lower than Standard MHA by 4.17" in gqa_rank and "[changed by" in gqa_rank
    assert gqa_rank.endswith("since step 50].") and "settled" not in gqa_rank
    assert all(s.endswith("].") for s in sentences)  # every claim carries its mark
    assert not any("[" in s for s in claims(end))  # none without a half-way point


def test_the_halfway_point_is_the_snapshot_nearest_half_the_steps():
    from headlab.study.claims import halfway

    rows = [{"model": "Standard MHA", "role": "mha", "seed": seed, "step": step, "layer": 0, "circuit": "qk",
             "mla_rope": mla_rope, "kind": kind, "effective_rank_pct_of_heads": 50.0 + step}
            for seed in (0, 1) for step in (0, 1, 2, 4, 30, 60, 90, 120) for mla_rope in ("included", "excluded")
            for kind in ("uncentered", "centered")]
    training = pd.DataFrame([{"model": "Standard MHA", "role": "mha", "seed": seed, "step": step, "tokens": step,
                              "val_loss": 3.0 - step / 100, "val_bpb": 1.0, "loss_unit": "nats/byte"}
                             for seed in (0, 1) for step in (0, 50, 100, 120)])
    half = halfway(pd.DataFrame(rows), training)
    assert (half.rank_step, half.loss_step) == (60, 50)
    assert set(half.metrics["uncentered"]) == {110.0} and set(half.metrics["val_loss"]) == {2.5}
    assert halfway(pd.DataFrame(rows).query("step == 120"), training) is None


def test_headlab_docs_writes_the_readme_figures_and_headline_table(study, tmp_path, capsys):
    out, _, _ = study
    assert main(["docs", str(out), "--out", str(tmp_path / "docs")]) == 0
    docs = tmp_path / "docs"
    assert sorted(path.name for path in docs.glob("*.png")) == sorted(f"{name}.png" for name in DOCS_FIGURES)
    assert not list(docs.glob("*.svg"))  # SVG only with --svg
    headline = (docs / "headline.md").read_text()
    for role, config in ROLES.items():
        assert f"| {role} | {config.label} |" in headline  # a row per variant in the loss table
    assert "2 seeds" in headline and " ± " in headline


def test_the_report_states_the_training_recipe_and_what_changed_from_the_preset(study):
    out, runs, report = study
    meta = read_study_tables(out).meta
    assert meta["train"]["optimizer"] == "adamw" and meta["changed"] == {} and meta["unread"] == {}
    text = report.read_text()
    assert "Trained with AdamW; which optimizer trains which tensor of each variant" in text
    assert "| Standard MHA, MQA, GQA (2 KV heads) | AdamW | 0.003 (lr) | 0.1 (weight_decay) | wte, attn.c_q, " \
        "attn.c_k, attn.c_v, attn.c_proj, mlp.c_fc, mlp.c_proj, lm_head |" in text  # the plan: a row per group
    # tables written before the plan was recorded: the recipe in words, as then
    muon = {**meta, "optimizers": None, "train": {**meta["train"], "optimizer": "muon", "lrkv_factor_decay": False},
            "changed": {"optimizer": "muon", "lrkv_factor_decay": False}}
    text = headlab.report.writer.recipe_text(muon)
    assert "Muon on the blocks' matrices (lr 0.02" in text and "no weight decay on LRKV's factors" in text
    assert text.endswith("Changed from the preset `tiny`: `optimizer = muon`, `lrkv_factor_decay = False`.")
    qk_by_adamw = headlab.report.writer.recipe_text({**muon, "train": {**muon["train"], "muon_qk": False}})
    assert "Muon on the blocks' matrices but those that form only queries or keys (AdamW there, lr 0.003, weight " \
        "decay 0.1: not the paper's recipe; MLA's joint key/value latents stay on Muon) (lr 0.02" in qk_by_adamw


@pytest.mark.usefixtures("figures_saved_as_stand_ins")  # the settings are judged here, not the figures
def test_reproduce_set_replaces_preset_settings_and_records_them(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["reproduce", "--preset", "tiny", "--steps", "2", "--seeds", "1", "--corpus", "synthetic",
                 "--jobs", "1",  # worker processes would each import torch again: more than these runs cost
                 "--set", "weight_decay=0", "--set", "n_layer=1", "--out", str(out)]) == 0
    meta = read_study_tables(out).meta
    assert meta["changed"] == {"weight_decay": 0.0, "n_layer": 1} and meta["n_layer"] == 1
    assert "`weight_decay = 0.0`, `n_layer = 1`" in (out / "report.md").read_text()
    capsys.readouterr()
    for argv, says in ((["--set", "optimizer=adamw,muon"], "one value per field"),
                       (["--set", "parallel=ddp", "--parallel", "ddp"], "given both as a flag and with --set"),
                       (["--set", "lr=0.1", "--set", "lr=0.2"], "given twice")):
        assert main(["reproduce", "--preset", "tiny", "--out", str(tmp_path / "refused"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and not (tmp_path / "refused").exists()


def test_the_lrkv_factor_section_is_read_from_tables_that_match_the_weights(study):
    out, runs, report = study
    tables = read_study_tables(out)
    factors, through, bound = tables["lrkv_factors"], tables["factor_training"], tables["rank_bound"]
    assert set(factors["role"]) == {"lrkv-small", "lrkv-large"} and set(factors["seed"]) == {0, 1}
    run = next(r for r in runs if r.role == "lrkv-large" and r.seed == 1)
    shared, residuals = headlab.analysis.heads.load_heads(run.run.model).layer(0).decomposition("key")
    rows = factors[(factors["role"] == "lrkv-large") & (factors["seed"] == 1) & (factors["layer"] == 0)
                   & (factors["projection"] == "key")]
    assert rows["norm_ratio"].to_numpy() == pytest.approx(np.linalg.norm(residuals, axis=(1, 2))
                                                          / np.linalg.norm(shared))
    last = through[(through["step"] == STEPS) & (through["role"] == "lrkv-large") & (through["seed"] == 1)]
    assert last.set_index("layer")["norm_ratio"].to_numpy() == pytest.approx(
        factors[(factors["role"] == "lrkv-large") & (factors["seed"] == 1) & (factors["projection"] == "key")]
        .groupby("layer")["norm_ratio"].mean().to_numpy())  # the last snapshot is the final checkpoint
    assert set(bound["role"]) == {"mha"} and set(bound["rank"]) == {c.kv_rank for c in ROLES.values()
                                                                     if c.attention == "lrkv"}
    cells = _report_row(report.read_text(), "## LRKV's factors", run.label)
    per_seed = factors[(factors["role"] == "lrkv-large") & (factors["projection"] == "key")].groupby("seed")
    assert cells[3] == headlab.study.stats.spread(per_seed["norm_ratio"].mean().to_numpy()).format(3)
    assert (out / "figures" / "lrkv_norm_ratio_through_training.png").stat().st_size > 1000


# ---- baselines: random initialisation and the seed figure -------------------------------------------

def _step0(config, seed: int, mla_rope: str = "included"):
    """The step-0 analysis built here, independently of headlab's init code."""
    torch.manual_seed(seed)
    return headlab.analysis.similarity.analyze(GPT(config), label=config.label, mla_rope=mla_rope)


def _spread(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.2f} ± {values.std(ddof=1):.2f}"


def test_the_tables_and_the_rank_table_carry_the_random_init_baseline(study):
    """init_spectra and init_summary: every run of the study at step 0, equal to an independently
    drawn model of its config and seed; the report's effective-rank table quotes them per variant."""
    out, runs, path = study
    init_spectra, init_summary = pd.read_csv(out / "init_spectra.csv"), pd.read_csv(out / "init_summary.csv")
    for run in runs:
        for mla_rope in ("included", "excluded"):
            ours = init_spectra[(init_spectra["model"] == run.label) & (init_spectra["seed"] == run.seed)
                                & (init_spectra["mla_rope"] == mla_rope)]
            expected = _step0(run.config, run.seed, mla_rope).spectra
            np.testing.assert_allclose(ours["eigenvalue"].to_numpy(), expected["eigenvalue"].to_numpy(), atol=1e-9)
    text = path.read_text()
    assert "'random init': the same runs at step 0" in text
    for role, config in ROLES.items():
        name = config.label + (", RoPE part included" if role == "mla" else "")
        row = _report_row(text, "## Effective rank", name)
        rows = init_summary[(init_summary["model"] == config.label) & (init_summary["mla_rope"] == "included")]
        for kind, cell in (("uncentered", row[2]), ("centered", row[4])):
            by_seed = rows[rows["kind"] == kind].groupby("seed")["effective_rank_pct_of_heads"].mean()
            assert cell == f"{by_seed.mean():.1f} ± {by_seed.std(ddof=1):.1f}", (name, kind)


def test_the_report_has_the_distance_to_the_seed_figure(study):
    """A row per method and panel: λ₁ trained and at init (mean ± sd over seeds) beside the paper's
    λ₁ of the same role and panel; tiny's 4 heads leave d₁ (spectra of 6) out, saying so."""
    out, _, path = study
    text = path.read_text()
    section = text.split("## Distance to the seed figure", 1)[1].split("\n## ", 1)[0]
    assert "Our 4 heads against the paper's 6" in section and "| d₁" not in section
    spectra, init = pd.read_csv(out / "spectra.csv"), pd.read_csv(out / "init_spectra.csv")

    def first(table, model, layer):
        rows = table[(table["model"] == model) & (table["layer"] == layer) & (table["index"] == 1)
                     & (table["kind"] == "uncentered") & (table["circuit"] == "qk") & (table["mla_rope"] == "included")]
        return rows.sort_values("seed")["eigenvalue"]

    lines = [line for line in section.splitlines() if line.startswith("| ") and "ours" not in line]
    assert len(lines) == 2 * len(ROLES)  # tiny's two layers: Early (L=0) and Late (L=1)
    for panel, layer, paper_layer in (("Early", 0, 0), ("Late", 1, 11)):
        for role, config in ROLES.items():
            row = next(cells for cells in (line.strip("|").split("|") for line in lines)
                       if cells[0].strip() == config.label and cells[2].strip().startswith(panel))
            cells = [cell.strip() for cell in row]
            assert cells[1] == PAPER[role].label and cells[2] == f"{panel} (L={layer}) ↔ paper L={paper_layer}"
            assert cells[3] == f"{SEED_SPECTRA[role][panel].first:.2f}"
            assert cells[4] == _spread(first(spectra, config.label, layer))
            assert cells[5] == _spread(first(init, config.label, layer))


def test_the_reports_flagship_draws_the_init_baseline_and_the_seed_marks(study, monkeypatch):
    out, _, _ = study
    drawn = {}
    monkeypatch.setattr(headlab.report.writer.plots, "save_figure",
                        lambda figure, manifest, name, **options: drawn.setdefault(name, figure))
    headlab.report.writer.draw_figures(read_study_tables(out), None, None, ("spectra_uncentered",))
    early, late = drawn["spectra_uncentered"].axes
    init = pd.read_csv(out / "init_spectra.csv")
    for ax, layer, panel in ((early, 0, "Early"), (late, 1, "Late")):
        dashed = {line.get_gid(): line for line in ax.get_lines() if line.get_linestyle() == "--"}
        marks = {line.get_gid(): line for line in ax.get_lines() if (line.get_gid() or "").startswith("seed:")}
        for role, config in ROLES.items():
            rows = init[(init["model"] == config.label) & (init["layer"] == layer) & (init["kind"] == "uncentered")
                        & (init["circuit"] == "qk") & (init["mla_rope"] == "included")]
            np.testing.assert_allclose(dashed[f"init:{config.label}"].get_ydata(),
                                       rows.groupby("index")["eigenvalue"].mean())
            assert list(marks[f"seed:{config.label}"].get_ydata()) == [SEED_SPECTRA[role][panel].first]


def test_headline_md_quotes_the_baseline_and_the_distance_to_the_seed_figure():
    """From the shipped demo tables (cpu-small, 6 heads like the paper's): headline.md's rank table
    has the random-init columns, and its distance table d₁ = Σ|λ/Σλ − s/Σs| per method and panel."""
    shipped = read_study_tables(SHIPPED)
    text = "\n".join(headlab.report.writer.headline_lines(shipped))
    assert "| random init, uncentered |" in text and "| random init, centered |" in text
    spectra = shipped["spectra"]
    mha = spectra[(spectra["role"] == "mha") & (spectra["layer"] == 0) & (spectra["kind"] == "uncentered")
                  & (spectra["circuit"] == "qk") & (spectra["mla_rope"] == "included")]
    seed_curve = np.array(SEED_SPECTRA["mha"]["Early"].eigenvalues())
    distances = [np.abs(g.sort_values("index")["eigenvalue"].to_numpy() / 6 - seed_curve / seed_curve.sum()).sum()
                 for _, g in mha.groupby("seed")]
    row = next(line for line in text.splitlines() if line.startswith("| Standard MHA | Standard MHA | Early (L=0)"))
    assert row.split("|")[-3].strip() == _spread(distances)  # d₁ ours, before d₁ random init
    kept = {k: v for k, v in without_conclusions(shipped.tables).items() if not k.startswith("init_")}
    old = StudyTables(with_conclusions(kept, shipped.meta), shipped.meta)  # as tables before init spectra read
    older = "\n".join(headlab.report.writer.headline_lines(old))
    assert "No random-initialisation baseline in these tables" in older and "| random init" not in older
