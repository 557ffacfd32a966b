"""Why an episode ended without its answer, and when a run stops for it.

Three kinds of failure end one episode and let the run go on: the engine refused a request (`rejected`, a
prompt past its context), the question cannot be taken as given (`input`, a `DataError` such as a malformed
given decomposition), or the team's own code raised (`bug`). A model's malformed output is no failure: the
team flags the turn and falls back. A dead backend is none either: it raises and stops the run.

A bug is known by its exception type and the line that raised it. `TeamBugs` counts them over a run; the
same bug seen `repeats` times stops the run with a `TeamBug` that carries its traceback and count."""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path

from searchteam.errors import DataError, RequestRejected, TeamBug
from searchteam.types import FailureKind

EXPECTED_FAILURES: dict[type[Exception], FailureKind] = {RequestRejected: "rejected", DataError: "input"}
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # src/searchteam


def failure_kind(exc: BaseException) -> FailureKind:
    """`rejected`, `input` or `bug` (anything the team's code raised that is neither)."""
    return next((kind for cls, kind in EXPECTED_FAILURES.items() if isinstance(exc, cls)), "bug")


def raised_at(exc: BaseException) -> str:
    """The innermost frame of `exc`'s traceback as `path:line in function`, the path inside the package
    when the frame is searchteam's."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    frame = frames[-1]
    path = Path(frame.filename)
    shown = f"searchteam/{path.relative_to(PACKAGE_ROOT)}" if path.is_relative_to(PACKAGE_ROOT) else path.name
    return f"{shown}:{frame.lineno} in {frame.name}"


def describe_failure(exc: BaseException) -> str:
    """The episode's `error`: the exception, and for a bug where it was raised."""
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} (at {raised_at(exc)})" if failure_kind(exc) == "bug" else text


class TeamBugs:
    """The team bugs of one run (eval, a training run, a server's life), by exception type and place, and
    the episodes it has ended."""

    def __init__(self, method: str, repeats: int = 2) -> None:
        self.method, self.repeats = method, repeats
        self.episodes = 0
        self.counts: Counter[str] = Counter()
        self.first: dict[str, tuple[str, str]] = {}  # per bug: its first `error` and traceback

    def ended(self, bug: BaseException | None = None) -> None:
        """One more episode ended, by `bug` if given (its first message and traceback are kept)."""
        self.episodes += 1
        if bug is None:
            return
        key = f"{type(bug).__name__} at {raised_at(bug)}"
        self.counts[key] += 1
        if key not in self.first:
            self.first[key] = (describe_failure(bug), "".join(traceback.format_exception(bug)))

    def check(self) -> None:
        """Raise `TeamBug` once a bug has been seen `repeats` times."""
        key, n = self.counts.most_common(1)[0] if self.counts else ("", 0)
        if n >= self.repeats:
            error, trace = self.first[key]
            seen = f"in {n} of the {self.episodes} episodes so far"
            headline = f"the {self.method} team has a bug, {seen}: {error}"
            raise TeamBug(f"{headline}\n{trace}")
