"""One team on long-lived batching backends, answering many questions at once (`TeamService`), within
the server's bounds (`ServeLimits`)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request

from searchteam.config import RunConfig
from searchteam.errors import TeamBug
from searchteam.factory import Components, build_components, build_sampling
from searchteam.runtime import Backends, Sampling, make_backends
from searchteam.runtime.context import TurnHook
from searchteam.runtime.failures import TeamBugs
from searchteam.runtime.runner import run_episode
from searchteam.runtime.turns import TurnFeed
from searchteam.server_limits import ServeLimits
from searchteam.teams import Team
from searchteam.types import Episode, Question


class TeamService:
    """A team on long-lived batching backends; `answer` runs one episode, many of them concurrently."""

    def __init__(
        self,
        team: Team,
        method: str,
        model: str,
        backends: Backends,
        sampling: Sampling,
        limits: ServeLimits | None = None,
    ) -> None:
        self.team, self.method, self.model = team, method, model
        self.backends, self.sampling, self.limits = backends, sampling, limits or ServeLimits()
        self.served = 0
        self.cancelled = 0  # episodes stopped before their end: the client went away, or the time ran out
        self.bugs = TeamBugs(method)
        self.broken: TeamBug | None = None  # a team bug repeated: the service answers nothing more
        self.on_broken: Callable[[TeamBug], None] | None = None  # e.g. stop the server
        self._ids = itertools.count(1)
        self._slots: asyncio.Semaphore | None = None

    async def answer(
        self, question: str, golden_answers: list[str] | None = None, on_turn: TurnHook | None = None
    ) -> Episode:
        """Run the team on one question; an expected failure or a first team bug is recorded on the
        episode, a dead backend raises. A team bug seen twice raises `TeamBug`, then and for every later
        request, and `on_broken` is told once. `on_turn` is told of each turn as it finishes."""
        if self.broken:
            raise self.broken
        try:
            async with self._semaphore():
                episode = await self._episode(question, golden_answers or [], on_turn)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.served += 1
        self._check_bugs()
        return episode

    async def _episode(self, question: str, golden_answers: list[str], on_turn: TurnHook | None) -> Episode:
        q = Question(id=f"req-{next(self._ids)}", question=question, golden_answers=golden_answers)
        return await run_episode(
            self.team.solve,
            self.method,
            q,
            self.backends,
            self.sampling,
            self.model,
            on_turn=on_turn,
            bugs=self.bugs,
        )

    def _check_bugs(self) -> None:
        try:
            self.bugs.check()
        except TeamBug as bug:
            if self.broken is None:
                self.broken = bug
                if self.on_broken:
                    self.on_broken(bug)
            raise

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limits.concurrency)
        return self._slots

    def batching(self) -> dict[str, dict[str, float]]:
        """Per backend: calls so far, their mean batch size (> 1 when requests shared batches) and the most
        under way at once."""
        batchers = {
            **self.backends.llms,
            **({"search": self.backends.search} if self.backends.search else {}),
        }
        return {
            name: {
                "batches": b.stats.batches,
                "items": b.stats.items,
                "mean_batch": round(b.stats.mean_batch, 2),
                "peak_in_flight": b.stats.peak_in_flight,
            }
            for name, b in batchers.items()
        }

    async def aclose(self) -> None:
        for batcher in [*self.backends.llms.values(), self.backends.search]:
            if batcher is not None:
                await batcher.aclose()


def build_service(
    config: RunConfig, components: Components | None = None, limits: ServeLimits | None = None
) -> TeamService:
    """The service for `config`: its team, model(s) and retriever (loaded unless `components` are given). It
    serves the team by its name: a method's, or a composed team file's stem."""
    components = components or build_components(config)
    backends = make_backends(components.llms, components.retriever, max_batch=config.batch_size)
    limits = limits or ServeLimits(concurrency=config.concurrency)
    return TeamService(
        components.team, components.team.name, config.model, backends, build_sampling(config), limits
    )


async def episode_stream(
    service: TeamService, question: str, golds: list[str], request: Request | None = None
) -> AsyncIterator[dict[str, Any] | Episode]:
    """Each turn's event as the turn finishes, then the episode (a dead backend or a team bug raises).

    The episode runs as its own task, cancelled when the consumer stops early (its generator is closed
    or cancelled) or, given `request`, as soon as the client disconnects; then the stream just ends."""
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    task = asyncio.create_task(service.answer(question, golds, on_turn=TurnFeed(events.put_nowait)))
    task.add_done_callback(lambda _: events.put_nowait(None))
    watcher = asyncio.create_task(_cancel_on_disconnect(request, task)) if request else None
    try:
        while (event := await events.get()) is not None:
            yield event
        if not task.cancelled():
            yield task.result()
    finally:
        task.cancel()
        if watcher:
            watcher.cancel()


async def _cancel_on_disconnect(request: Request, task: asyncio.Task[Episode]) -> None:
    """Cancel `task` when the client of `request` goes away (its body is read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()


def usage(episode: Episode) -> dict[str, int]:
    return {
        "prompt_tokens": episode.prompt_tokens,
        "completion_tokens": episode.completion_tokens,
        "total_tokens": episode.prompt_tokens + episode.completion_tokens,
    }
