"""Drive many episodes concurrently over shared batching backends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from searchteam.errors import LLMError, RetrievalError
from searchteam.llm.base import LLM, AsyncLLM
from searchteam.llm.models import model_label
from searchteam.progress import progress_bar
from searchteam.retrieval.base import Retriever
from searchteam.runtime.batcher import Batcher, Dispatcher
from searchteam.runtime.context import Backends, Context, LLMFrontend, Sampling, SearchRequest, TurnHook
from searchteam.runtime.failures import TeamBugs, describe_failure, failure_kind
from searchteam.types import Episode, Passage, Question

TeamRun = Callable[[Question, Context], Awaitable[str]]
INFRASTRUCTURE_ERRORS = (LLMError, RetrievalError)


def batched_search(retriever: Retriever) -> Callable[[list[SearchRequest]], list[list[Passage]]]:
    """One retriever call per batch, at the largest k asked for, sliced per request."""

    def process(requests: list[SearchRequest]) -> list[list[Passage]]:
        k = max(k for _, k in requests)
        ranked = retriever.search([q for q, _ in requests], k)
        return [hits[:k_i] for hits, (_, k_i) in zip(ranked, requests, strict=True)]

    return process


def make_backends(llms: dict[str, LLM], retriever: Retriever | None, max_batch: int = 32) -> Backends:
    """The run's front-ends: a request-level `Dispatcher` for each engine that batches on its side (an
    HTTP server, bounded by its `concurrency`), a `Batcher` of up to `max_batch` requests for the others."""
    return Backends(
        llms={name: llm_frontend(b, max_batch) for name, b in llms.items()},
        search=Batcher(batched_search(retriever), max_batch=max(64, max_batch)) if retriever else None,
        model_names={name: model_label(b.name) for name, b in llms.items() if name != "policy"},
    )


def llm_frontend(backend: LLM, max_batch: int) -> LLMFrontend:
    if isinstance(backend, AsyncLLM):
        return Dispatcher(backend.agenerate, backend.concurrency, close=backend.aclose)
    return Batcher(backend.generate, max_batch)


@dataclass
class RunStats:
    wall_seconds: float = 0.0
    llm_busy_seconds: float = 0.0
    search_busy_seconds: float = 0.0
    episodes: int = 0

    @property
    def orchestration_share(self) -> float:
        """Share of wall time when neither the model nor the retriever was working."""
        if not self.wall_seconds:
            return 0.0
        busy = min(self.wall_seconds, self.llm_busy_seconds + self.search_busy_seconds)
        return 1.0 - busy / self.wall_seconds


async def run_episodes(
    team_run: TeamRun,
    method: str,
    questions: Iterable[Question],
    backends: Backends,
    sampling: Sampling,
    *,
    model_name: str = "",
    concurrency: int = 64,
    on_episode: Callable[[Episode], None] | None = None,
    on_turn: TurnHook | None = None,
    progress: bool = True,
    training: bool = False,
    bugs: TeamBugs | None = None,
) -> tuple[list[Episode], RunStats]:
    """Run `team_run` on every question with at most `concurrency` episodes in flight.

    A failing episode is recorded with its error and kind (`runtime.failures`) and the run goes on, until
    the same team bug repeats (`bugs`, the run's count; a fresh one per call when not given): then
    `TeamBug` stops it. A dead backend (LLMError, RetrievalError) stops the run at once, since every
    other episode would fail the same way. Each finished episode is handed to `on_episode` at once (a
    failed one too, before the run stops), so callers can persist it incrementally; each turn to
    `on_turn` as it is recorded, so callers can show the team at work. The episodes come back in the
    order of `questions`."""
    questions = list(questions)
    bugs = bugs or TeamBugs(method)
    limit = asyncio.Semaphore(concurrency)
    episodes: list[Episode | None] = [None] * len(questions)
    stats = RunStats()
    started = time.perf_counter()

    with progress_bar(progress and len(questions) > 1) as bar:
        task = bar.add_task(method, total=len(questions))

        async def one(position: int, q: Question) -> None:
            async with limit:
                bugs.check()  # no episode starts once a bug has repeated
                episode = await run_episode(
                    team_run, method, q, backends, sampling, model_name, training, on_turn, bugs
                )
            episodes[position] = episode
            if on_episode:
                on_episode(episode)
            bar.advance(task)
            bugs.check()

        tasks = [asyncio.ensure_future(one(i, q)) for i, q in enumerate(questions)]
        try:
            await asyncio.gather(*tasks)
        finally:  # a run that stops stops every episode still under way
            for unfinished in tasks:
                unfinished.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for batcher in [*backends.llms.values(), backends.search]:
                if batcher is not None:
                    await batcher.aclose()
    stats.wall_seconds = time.perf_counter() - started
    stats.llm_busy_seconds = sum(b.stats.busy_seconds for b in backends.llms.values())
    stats.search_busy_seconds = backends.search.stats.busy_seconds if backends.search else 0.0
    finished = [e for e in episodes if e is not None]  # all of them: a failure raised above
    stats.episodes = len(finished)
    return finished, stats


async def run_episode(
    team_run: TeamRun,
    method: str,
    q: Question,
    backends: Backends,
    sampling: Sampling,
    model_name: str = "",
    training: bool = False,
    on_turn: TurnHook | None = None,
    bugs: TeamBugs | None = None,
) -> Episode:
    """One episode on shared backends (which stay open): a failure is recorded on the episode with its
    kind, a bug also counted in `bugs`; a dead backend (INFRASTRUCTURE_ERRORS) raises. `on_turn` is told of
    each turn as it is recorded."""
    episode = Episode(question=q, method=method, model=model_name)
    ctx = Context(episode, backends, sampling, training=training, on_turn=on_turn)
    started = time.perf_counter()
    bug = None
    try:
        episode.answer = await team_run(q, ctx)
    except INFRASTRUCTURE_ERRORS:
        raise
    except Exception as exc:
        episode.error, episode.error_kind = describe_failure(exc), failure_kind(exc)
        bug = exc if episode.error_kind == "bug" else None
    if bugs is not None:
        bugs.ended(bug)
    episode.seconds = time.perf_counter() - started
    return episode
