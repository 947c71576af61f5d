"""How `make test` spreads the suite over its two workers (`pytest -n 2 --dist loadgroup`)."""

import pytest


def test_grouped_tests_carry_their_group_to_the_scheduler(request):
    """xdist learns a test's group from an `@group` suffix that its own collection hook writes into
    the test's id, after conftest has marked the test. If the suffix is missing (the marks came
    too late, or pytest 9.2, which ignores the written id: pytest-xdist#1386), the notebooks that
    share runs/notebooks/small/ and the tests that share one torchrun study run on both workers at
    once, and nothing else says so."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not an xdist worker under --dist loadgroup")
    grouped = [item for item in request.session.items if item.get_closest_marker("xdist_group")]
    assert grouped, "conftest marks the notebooks and the torchrun_study tests, modules with costly fixtures themselves"
    lost = [item.nodeid for item in grouped  # xdist joins a test's groups, sorted, with "_"
            if not item.nodeid.endswith("@" + "_".join(sorted({m.args[0] for m in item.iter_markers("xdist_group")})))]
    assert lost == []
