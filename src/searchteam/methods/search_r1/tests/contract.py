"""Search-R1's declarations for the generic suites (tests/support/contracts.py): its action parser."""

from __future__ import annotations

from searchteam.methods.search_r1 import team as search_r1
from tests.support.contracts import FuzzTarget


def check_action(r: search_r1.Action) -> None:
    assert r.kind in ("search", "answer", "invalid") and (r.kind == "invalid") == (r.error is not None)
    assert r.kind == "invalid" or r.content.strip()


FUZZ_TARGETS = [
    FuzzTarget(
        "search_r1.parse_action",
        search_r1.parse_action,
        ("think", "search", "answer", "information"),
        check_action,
    ),
]
