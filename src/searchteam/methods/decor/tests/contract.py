"""DECOR's declarations for the generic suites (tests/support/contracts.py): its planner, filter and fact
parsers, and a memory small enough to run the compressor."""

from __future__ import annotations

from searchteam.methods.decor import team as decor
from tests.support.contracts import FUZZ_QUESTION, FuzzTarget, check_text_and_error


def check_planner(r: decor.PlannerAction) -> None:
    assert (r.query is None or r.query.strip()) and (r.error is None or r.error)


FUZZ_TARGETS = [
    FuzzTarget(
        "decor.parse_planner",
        lambda t: decor.parse_planner(t, True, FUZZ_QUESTION),
        ("think", "search"),
        check_planner,
    ),
    FuzzTarget(
        "decor.parse_filter",
        lambda t: decor.parse_tagged(t, "filter", decor.NO_EVIDENCE),
        ("think", "filter"),
        check_text_and_error,
    ),
    FuzzTarget(
        "decor.parse_facts", lambda t: decor.parse_facts(t, "verbatim"), ("facts",), check_text_and_error
    ),
]
OPTION_BRANCHES = [({"memory_max_tokens": 1}, "QDS")]
