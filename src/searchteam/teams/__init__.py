"""The shared team layer: the `Team` base class and its settings, tag parsing, the growing transcript of
monolithic agents, the selectors and the single answer call several methods reuse. The methods themselves
live in `searchteam.methods` (one package per paper)."""

from __future__ import annotations

from searchteam.teams.base import Team, TeamSettings

__all__ = ["Team", "TeamSettings"]
