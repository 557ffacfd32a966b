"""QAgent's declarations for the generic suites (tests/support/contracts.py): its round parser, and submodule
mode, which runs the frozen generator."""

from __future__ import annotations

from searchteam.methods.qagent import team as qagent
from tests.support.contracts import FuzzTarget


def check_round(r: qagent.RoundOutput) -> None:
    assert r.kind in ("search", "answer", "malformed") and all(isinstance(i, str) and i for i in r.issues)
    assert r.kind != "search" or (1 <= len(r.queries) <= qagent.MAX_QUERIES and all(r.queries))
    assert r.kind != "answer" or r.answer
    assert r.kind != "malformed" or r.issues


FUZZ_TARGETS = [
    FuzzTarget(
        "qagent.parse_round",
        lambda t: qagent.parse_round(t, True),
        ("plan", "search", "query", "reflection", "answer"),
        check_round,
    ),
]
OPTION_BRANCHES = [({"mode": "submodule"}, "QDS")]
