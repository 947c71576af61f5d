"""A study's conclusions (claims with their data, seed distances, baselines, the spreads the report
quotes) are tables the study computes once: written beside its other tables, read back as written,
and computed when read for tables written before studies kept them (as the demo tables were shipped
until `scripts/ship_tables.py --conclusions cpu-small` wrote theirs)."""

from __future__ import annotations

import pandas as pd
import pytest

from headlab.study.conclusions import CONCLUSIONS, DISPLAY, conclusions, without_conclusions
from headlab.study.stats import HIGHER, LOWER, UNDECIDED, WITHIN
from headlab.study.table_files import SHIPPED, StudyTables, read_study_tables, write_study_tables


@pytest.fixture(scope="module")
def shipped():
    return read_study_tables(SHIPPED)


def assert_conclusions_equal(read: StudyTables, computed: dict[str, pd.DataFrame]) -> None:
    """Every conclusion table of `read` as in `computed`: the report's text tables cell for cell (an
    empty cell included), the numbers to 1e-12."""
    for name in CONCLUSIONS:
        if name in DISPLAY:
            assert read[name].equals(computed[name]), name
        else:
            pd.testing.assert_frame_equal(read[name].reset_index(drop=True), computed[name].reset_index(drop=True),
                                          check_dtype=False, check_names=False, check_exact=False, rtol=1e-12)


@pytest.fixture(scope="module")
def written_before(shipped, tmp_path_factory):
    """The demo study's tables as a study wrote them before it kept its conclusions."""
    folder = tmp_path_factory.mktemp("before-conclusions")
    write_study_tables(StudyTables(without_conclusions(shipped.tables), shipped.meta), folder)
    return folder


def test_the_shipped_demo_tables_hold_their_conclusions_as_written(shipped):
    assert all((SHIPPED / f"{name}.csv").is_file() for name in CONCLUSIONS)  # read, not computed, by every notebook
    assert set(shipped["claims"]["section"]) == {"comparison", "rule", "margins", "training", "measures"}


def test_tables_written_before_studies_kept_conclusions_get_them_when_read(shipped, written_before):
    assert not any((written_before / f"{name}.csv").exists() for name in CONCLUSIONS)
    before = read_study_tables(written_before)
    assert set(CONCLUSIONS) <= set(before.tables)  # it has init spectra, LRKV and the measures: every one
    assert_conclusions_equal(before, shipped.tables)  # computed on reading as they were when written


def test_conclusions_written_once_are_read_back_as_computed(shipped, tmp_path):
    """And the shipped ones are what today's code computes (else: scripts/ship_tables.py --conclusions cpu-small)."""
    write_study_tables(shipped, tmp_path)
    again = read_study_tables(tmp_path)
    computed = conclusions(without_conclusions(shipped.tables), shipped.meta)
    assert all((tmp_path / f"{name}.csv").is_file() for name in CONCLUSIONS)
    assert_conclusions_equal(again, computed)


def test_a_claims_data_says_what_its_sentence_says(shipped):
    rows = shipped["claims"][shipped["claims"]["section"] == "comparison"]
    assert len(rows) == 5 + 6 + 6 + 7  # loss of 5 variants, either rank of 6 (MLA both ways), centering of 7
    words = {WITHIN: ("equal to", "unchanged"), UNDECIDED: ("undecided",), HIGHER: ("higher", "raises"),
             LOWER: ("lower",)}
    for row in rows.itertuples():
        assert any(word in row.sentence for word in words[row.verdict]), row.sentence
        assert (abs(row.difference) + row.half_width < row.margin) == (row.verdict == WITHIN)
        shown = f"{row.difference:+.2f} ± {row.half_width:.2f}" if row.verdict in (WITHIN, UNDECIDED) else \
            f"by {abs(row.difference):.2f} ± {row.half_width:.2f}"
        assert shown in row.sentence or row.metric == "val_loss", (shown, row.sentence)
        assert row.seeds == 3 and row.role != "mha" or row.metric == "centering"
