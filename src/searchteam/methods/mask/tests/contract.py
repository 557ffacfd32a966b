"""M-ASK's declarations for the generic suites (tests/support/contracts.py): its four parsers."""

from __future__ import annotations

from searchteam.methods.mask import team as mask
from tests.support.contracts import FUZZ_QUESTION, FuzzTarget, check_flag, check_text_and_error


def check_plan(r: mask.Plan) -> None:
    state = r.state
    assert state.question == FUZZ_QUESTION and state.trajectory and isinstance(state.predicted_answer, str)
    assert all(s.answer and isinstance(s.query, str) for s in state.trajectory)
    assert all(isinstance(e, str) and e for e in r.errors)


def check_search(r: mask.SearchAction) -> None:
    check_flag(r.ok, r.error)
    assert (r.query is None or r.query.strip()) and (r.ok or r.query == FUZZ_QUESTION)


def check_operation(r: tuple[mask.Operation, str | None]) -> None:
    op, error = r
    assert op.kind in ("update", "add") and (error is None or error)
    assert op.kind == "add" or (error is None and op.index in (1, 2, 3))


FUZZ_TARGETS = [
    FuzzTarget(
        "mask.parse_plan",
        lambda t: mask.parse_plan(t, FUZZ_QUESTION),
        ("q1", "a1", "q2", "a2", "predicted_answer"),
        check_plan,
    ),
    FuzzTarget(
        "mask.parse_search",
        lambda t: mask.parse_search(t, False, FUZZ_QUESTION),
        ("search", "end", "/end"),
        check_search,
    ),
    FuzzTarget(
        "mask.parse_operation", lambda t: mask.parse_operation(t, 3), ("Update", "Add"), check_operation
    ),
    FuzzTarget("mask.parse_evidence", mask.parse_evidence, ("evidence",), check_text_and_error),
]
