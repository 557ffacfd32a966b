"""JADE's declarations for the generic suites (tests/support/contracts.py): its workflow, sub-question and
query parsers, and the workflows that reach its other executors."""

from __future__ import annotations

from searchteam.methods.jade import team as jade
from searchteam.teams import parsing
from tests.support.contracts import FuzzTarget, check_flag, check_optional_text


def check_workflow(r: jade.Workflow) -> None:
    check_flag(r.ok, r.error)
    assert jade.workflow_error(r.steps) is None


def check_subquestions(r: list[str]) -> None:
    assert len(set(r)) == len(r) and all(s == s.strip() and s for s in r)


FUZZ_TARGETS = [
    FuzzTarget("jade.parse_workflow", jade.parse_workflow, ("workflow",), check_workflow),
    FuzzTarget("jade.parse_subquestions", jade.parse_subquestions, ("q1", "q2", "q3"), check_subquestions),
    FuzzTarget(
        "jade.rewritten_query", lambda t: parsing.last_tag(t, "query"), ("query",), check_optional_text
    ),
]
OPTION_BRANCHES = [({}, "QDP"), ({}, "QR, R, DS, AG")]
