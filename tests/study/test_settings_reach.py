"""Settings say no more than they do (issue 45, class 6): what a setting reaches is derived from the
code that builds and trains a run (`headlab.training.reads`), a study refuses one that reaches no
role it trains and keeps one the others need, the report prints which optimizer trains which
tensor from the plan the optimizers are made from, and names a changed setting that reached no run.
No run is trained here: studies are checked as they are made, the plan read from meta models."""

from __future__ import annotations

from pathlib import Path

import pytest

from headlab.cli.main import main
from headlab.model.config import preset
from headlab.report.paper_tables import optimizer_frame, optimizer_lines, recipe_text
from headlab.study.study import Study, StudyRun
from headlab.study.sweep import grid
from headlab.study.table_files import unsupported_meta
from headlab.study.tables import changed_settings, optimizer_rows
from headlab.training.config import train_preset


def study(**settings) -> Study:
    return Study("tiny", 2, Path("/nonexistent/study"), corpus="synthetic", **settings)


@pytest.mark.parametrize("train,only", [({"matrix_lr": 0.05}, None), ({"embedding_lr": 0.1}, None),
                                        ({"unembedding_lr": 0.1}, ("mha", "mqa")),
                                        ({"optimizer": "muon", "lrkv_b_optimizer": "muon"}, ("mha", "mla")),
                                        ({"muon_qk": True}, None)])
def test_a_training_setting_that_trains_no_tensor_of_a_role_is_refused(train, only):
    """matrix_lr under AdamW trained runs bit-identical to the plain study's, and the report said it changed."""
    name = [k for k in train if k != "optimizer"][0]
    with pytest.raises(ValueError, match=f"{name} = .* changes none of the roles trained"):
        study(train_overrides=train, only=only)


def test_a_setting_that_trains_something_or_that_the_others_need_is_kept():
    study(train_overrides={"optimizer": "muon", "matrix_lr": 0.05})
    study(train_overrides={"optimizer": "muon", "muon_qk": False}, only=("mha",))  # optimizer: muon_qk needs it
    study(train_overrides={"lr": 0.003, "warmup_steps": 1, "device": "cpu"}, only=("mqa",))
    # n_kv_head is read by GQA alone, yet n_head 3 needs a divisor of 3 beside it
    assert [c.n_head for c in study(model_overrides={"n_head": 3, "n_kv_head": 3}, only=("mha", "mqa")).variants] == [
        3, 3]
    with pytest.raises(ValueError, match="n_kv_head = 1 changes none of the roles trained .*only gqa read it"):
        study(model_overrides={"n_kv_head": 1}, only=("mha", "mqa"))
    with pytest.raises(ValueError, match="lr = 0.01 changes none .*only lrkv-small, lrkv-large read it"):
        study(model_overrides={"arch": "nanochat"}, train_overrides={"optimizer": "muon", "lr": 0.01},
              only=("mha", "mqa"))  # nanochat's norms hold no parameter: lr trains LRKV's B_h alone


@pytest.mark.parametrize("field,values", [("device", ["cpu", "auto"]), ("compile", ["off", "aot_eager"]),
                                          ("embedding_lr", [0.1, 0.3]), ("log_every", [1, 2])])
def test_a_sweep_over_what_trains_nothing_different_is_refused(field, values):
    """Points that train identical runs would be counted as agreement."""
    with pytest.raises(ValueError, match="train the same runs|changes none of the roles"):
        grid("tiny", [1.0], fields={field: values}, only=("mha", "mla"))


def test_train_compile_empty_is_refused_in_one_line(tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--corpus", "synthetic", "--steps", "1", "--compile", "",
                 "--out", str(tmp_path / "run")]) == 2
    assert "TrainConfig.compile = '' is invalid" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_the_report_prints_which_optimizer_trains_which_tensor_from_the_plan():
    """muon_qk False was reported study-wide as 'W_Q, W_K by AdamW', while MLA's key path stays on
    Muon and LRKV's B_h is AdamW's without decay: the plan, printed per variant, says so."""
    runs = [StudyRun(role, config, 0, Path("/nonexistent")) for role, config in
            Study("tiny", 2, Path("."), only=("mha", "mla", "lrkv-small")).roles.items()]
    recipe = train_preset("tiny", optimizer="muon", muon_qk=False)
    rows = optimizer_rows(runs, recipe)
    plan = optimizer_frame(rows)
    where = {(row["variants"], tensor): (row["optimizer"], row["weight decay"]) for row in plan.to_dict("records")
             for tensor in row["tensors (each block's named once)"].split(", ")}
    mla, lrkv = (next(r.config.label for r in runs if r.role == role) for role in ("mla", "lrkv-small"))
    assert where[(mla, "attn.wq")] == ("AdamW", "0.1 (weight_decay)")
    assert where[(mla, "attn.wkv_a")][0] == where[(mla, "attn.wkv_b")][0] == "Muon"
    assert where[(lrkv, "attn.k_shared")] == where[(lrkv, "attn.u_k")] == ("AdamW", "0.1 (weight_decay)")
    assert where[(lrkv, "attn.b_k")] == ("AdamW", "none")
    meta = {"train": {"optimizer": "muon", "muon_qk": False, "warmup_steps": 5, "min_lr_ratio": 0.1, "batch_size": 8},
            "preset": "tiny", "optimizers": rows, "changed": {"muon_qk": False}, "unread": {"matrix_lr": 0.05}}
    text = recipe_text(meta)
    assert "W_Q, W_K" not in text and "which optimizer trains which tensor" in text
    assert "only queries or keys left to AdamW (not the paper's recipe)" in text and "the paper's split" not in text
    assert text.endswith("Set, but read by none of these runs (nothing trained differs for it): `matrix_lr = 0.05`.")
    table = "\n".join(optimizer_lines(meta))
    assert f"| {mla} | Muon | 0.02 (matrix_lr) | 0.1 (weight_decay) | attn.wkv_a, attn.wkv_b" in table


def test_a_changed_setting_that_reaches_no_run_is_named_apart():
    runs = [StudyRun("mha", preset("tiny", "mha"), 0, Path("/nonexistent"))]
    assert changed_settings(runs, train_preset("tiny", matrix_lr=0.05, lr=0.01), "tiny") == (
        {"lr": 0.01}, {"matrix_lr": 0.05})
    assert changed_settings(runs, train_preset("tiny", optimizer="muon", muon_qk=False), "tiny") == (
        {"optimizer": "muon", "muon_qk": False}, {})


def test_a_setting_kept_for_the_others_is_read_back_with_the_study():
    """n_kv_head = 3 beside n_head = 3 reaches no MHA or MQA run (the report names it apart), yet
    the study's tables are read back as of a preset that holds it (found by a hostile input: the
    tables of such a study were refused as edited by hand)."""
    meta = {"preset": "tiny", "changed": {"n_head": 3}, "unread": {"n_kv_head": 3}, "n_layer": 2, "n_head": 3,
            "d_model": 32, "head_dim": 8}
    assert unsupported_meta({}, meta) is None
    assert "cannot take" in unsupported_meta({}, {**meta, "unread": {}})
