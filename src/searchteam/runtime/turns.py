"""Turns as they finish, as events a stream shows (`searchteam serve`, `searchteam ask --stream`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from searchteam.types import Episode, Retrieval, Turn


def turn_event(index: int, turn: Turn, searches: list[Retrieval]) -> dict[str, Any]:
    """One finished turn: its role and output, and the titles of what the team retrieved since the turn
    before (what this turn's prompt could draw on). Format flags are set after the turn, so not here."""
    return {
        "index": index,
        "step": turn.step,
        "role": turn.role,
        "model": turn.model,
        "output": turn.completion,
        "searches": [{"query": r.query, "titles": [p.title for p in r.passages]} for r in searches],
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": turn.completion_tokens,
        "seconds": round(turn.seconds, 3),
    }


def run_order(episode: Episode) -> list[Turn | Retrieval]:
    """The episode's turns and searches in the order they finished: each search before the turns that ran
    after it. (A turn and a search of the same `step` can come either way: retrieve-then-read or a turn
    that writes the query.)"""
    turns = [(2 * i + 1, turn) for i, turn in enumerate(episode.turns)]
    searches = [(2 * r.after_turns, r) for r in episode.retrievals]
    return [item for _, item in sorted([*turns, *searches], key=lambda pair: pair[0])]


class TurnFeed:
    """A TurnHook (for one episode) handing each turn, as a `turn_event`, to `put`."""

    def __init__(self, put: Callable[[dict[str, Any]], None]) -> None:
        self.put = put
        self.searched = 0  # retrievals already shown with an earlier turn

    def __call__(self, episode: Episode, turn: Turn) -> None:
        searches = episode.retrievals[self.searched :]
        self.searched = len(episode.retrievals)
        self.put(turn_event(len(episode.turns) - 1, turn, searches))
