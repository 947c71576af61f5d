"""A study whose tables hold a layer without a QK circuit and a dead head (issue 39, class 3): the
report names them in one line, and the layer means leave the undefined layer out, with its count,
instead of averaging it in or failing. Built on the shipped demo tables: nothing is trained."""

from __future__ import annotations

import numpy as np
import pytest

from headlab.analysis.zero_forms import zero_form_note
from headlab.report.writer import write_report
from headlab.schema import KINDS, SPECTRUM_METRICS
from headlab.study.claims import per_seed_metrics
from headlab.study.table_files import SHIPPED, StudyTables, read_study_tables


@pytest.fixture(scope="module")
def demo() -> StudyTables:
    return read_study_tables(SHIPPED)


def _with_zero_forms(demo: StudyTables) -> StudyTables:
    """MHA seed 0: layer 1 has no QK circuit; MQA seed 1: head 2 of layer 0 is dead. Both as
    `analyze` writes them: NaN."""
    tables = {name: table.copy() for name, table in demo.tables.items()}

    def rows(table, role, seed, layer):
        return ((table["role"] == role) & (table["seed"] == seed) & (table["circuit"] == "qk")
                & (table["layer"] == layer))

    tables["summary"].loc[rows(tables["summary"], "mha", 0, 1),
                          [*SPECTRUM_METRICS, "mean_offdiag_similarity"]] = np.nan
    tables["spectra"].loc[rows(tables["spectra"], "mha", 0, 1), ["eigenvalue", "variance_ratio", "cumulative"]] = np.nan
    similarity = tables["similarity"]
    similarity.loc[rows(similarity, "mha", 0, 1), "value"] = np.nan
    similarity.loc[rows(similarity, "mqa", 1, 0) & ((similarity["head_i"] == 2) | (similarity["head_j"] == 2)),
                   "value"] = np.nan
    return StudyTables(tables, demo.meta)


@pytest.mark.usefixtures("figures_saved_as_stand_ins")  # drawn from the NaN tables, then saved as stand-ins
def test_the_report_names_undefined_layers_and_dead_heads_and_leaves_them_out_of_the_means(demo, tmp_path):
    tables = _with_zero_forms(demo)
    text = write_report(tables, tmp_path / "report").read_text()
    note = next(line for line in text.splitlines() if line.startswith("Undefined, "))
    n_layer = demo.meta["n_layer"]
    for setting in ("included", "excluded"):
        assert f"Standard MHA qk mla_rope {setting} seed 0 layer 1 (1 of {n_layer} layers)" in note
        assert f"MQA qk mla_rope {setting} seed 1 layer 0 head 2" in note
    assert "nan" not in text.split("## Effective rank", 1)[1].split("\n## ", 1)[0]

    # the layer mean of MHA seed 0 is over its other layers, not a mean with the missing layer as 0
    summary = demo["summary"]
    defined = summary[(summary["role"] == "mha") & (summary["seed"] == 0) & (summary["circuit"] == "qk")
                      & (summary["layer"] != 1)]
    metrics = per_seed_metrics(tables["summary"], tables["training"])
    ours = metrics[(metrics["role"] == "mha") & (metrics["seed"] == 0)]
    for kind in KINDS:
        expected = defined[defined["kind"] == kind].groupby("mla_rope")["effective_rank_pct_of_heads"].mean()
        np.testing.assert_allclose(ours.set_index("mla_rope")[kind].loc[expected.index], expected)


def test_a_study_without_zero_forms_says_nothing_of_them(demo):
    assert zero_form_note(demo["similarity"]) is None  # the report's line is this note
