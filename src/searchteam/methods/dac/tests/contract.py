"""DAC's declarations for the generic suites (tests/support/contracts.py): its searcher's parser."""

from __future__ import annotations

from searchteam.methods.dac import team as dac
from tests.support.contracts import FuzzTarget


def check_searcher(r: dac.SearcherAction) -> None:
    assert r.kind in ("search", "stop", "invalid") and (r.kind == "invalid") == (r.error is not None)
    assert r.kind != "search" or r.query.strip()


FUZZ_TARGETS = [
    FuzzTarget(
        "dac.parse_searcher", dac.parse_searcher, ("think", "search", "stop", "information"), check_searcher
    ),
]
