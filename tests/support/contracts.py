"""What a method declares for the generic suites, in `<method package>/tests/contract.py`:

- `FUZZ_TARGETS`: its parsers of model output, each with the contract its result keeps on any text
  (tests/teams/test_fuzz_parsers.py fuzzes them);
- `OPTION_BRANCHES`: runs that reach what a run with default options does not, as (options, JADE workflow
  of the scripted reply) pairs (tests/test_errors.py checks that the team declares every role, model and
  option its runs use).

A method without the module has neither. The generic suites find them through the method registry, so a
new method adds them in its own folder."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import searchteam.methods as methods
from searchteam.methods import Method

FUZZ_QUESTION = "Which novelist was German?"


@dataclass(frozen=True)
class FuzzTarget:
    """A parser under test: how to call it on a text, the tags it reads, and its contract on the result."""

    name: str
    parse: Callable[[str], Any]
    tags: tuple[str, ...]
    check: Callable[[Any], None]


def check_flag(ok: bool, error: str | None) -> None:
    assert ok == (error is None)
    assert error is None or (isinstance(error, str) and error)


def check_text_and_error(r: tuple[str, str | None]) -> None:
    assert isinstance(r[0], str) and r[0].strip() and (r[1] is None or r[1])


def check_optional_text(r: str | None) -> None:
    assert r is None or isinstance(r, str)


def method_contract(method: Method) -> ModuleType | None:
    """The method's `tests/contract.py` module, or None when it declares nothing."""
    package = method.team.__module__.rsplit(".", 1)[0]
    if not (method.folder / "tests" / "contract.py").is_file():
        return None
    return importlib.import_module(f"{package}.tests.contract")


def fuzz_targets() -> list[FuzzTarget]:
    """Every registered method's parsers to fuzz."""
    return [
        t
        for m in methods.REGISTRY.values()
        if (c := method_contract(m))
        for t in getattr(c, "FUZZ_TARGETS", [])
    ]


def option_branches(method: Method) -> list[tuple[dict[str, Any], str]]:
    contract = method_contract(method)
    return list(getattr(contract, "OPTION_BRANCHES", [])) if contract else []
