"""second_hop_turns: one hand-made set of searches, counted by hand."""

from __future__ import annotations

import pytest

from experiments.second_hop_turns import Searched, tally

GOLD = {"q1": {"Alpha", "Beta"}, "q2": {"Alpha", "Beta"}, "q3": {"Alpha", "Beta"}}


def test_later_searches_that_find_a_new_supporting_title_are_counted():
    runs = [
        Searched("q1", [["Alpha", "Gamma"], ["Beta"]], 1.0, written=1),  # the second search found Beta
        Searched("q2", [["Alpha", "Beta"]], 0.5),  # both at once
        Searched("q3", [["Gamma"], ["Gamma"]], 0.0),  # nothing, twice
        Searched("no-titles", [["Alpha"]], 1.0),  # not counted
    ]
    c = tally(runs, GOLD)
    assert c["questions"] == 3 and c["searches"] == 5
    assert (c["first: all"], c["first: some"], c["first: none"]) == (1, 1, 1)
    assert c["later found new"] == 1 and c["end: all"] == 2 and c["written"] == 1
    assert c["F1, all found"] == pytest.approx(0.75) and c["F1, not all"] == 0.0
    assert c["F1, a later search found one"] == 1.0
