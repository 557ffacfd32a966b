"""The front-ends every episode's calls go through: a `Batcher` gathers concurrent calls into batches for a
blocking in-process backend; a `Dispatcher` sends each call the moment it is made to an async one (an HTTP
server), with a bound on the calls in flight."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    busy_seconds: float = 0.0  # with at least one call under way
    peak_in_flight: int = 0  # calls under way at once, at most (a batcher: its largest batch)

    @property
    def mean_batch(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class Batcher(Generic[Req, Res]):
    """`await submit(x)` from any number of coroutines; one worker runs `process(batch)` in a thread,
    taking up to `max_batch` pending items each time. While a batch runs, new calls queue up, so the
    next batch is as full as the workload allows (no fixed waiting window)."""

    def __init__(self, process: Callable[[list[Req]], list[Res]], max_batch: int = 32) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.process = process
        self.max_batch = max_batch
        self.stats = BatchStats()
        self._pending: list[tuple[Req, asyncio.Future[Res]]] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, item: Req) -> Res:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._work())
        future: asyncio.Future[Res] = loop.create_future()
        self._pending.append((item, future))
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    async def _work(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(0)  # let coroutines that are ready this tick enqueue too
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                await self._run_batch(batch)

    async def _run_batch(self, batch: list[tuple[Req, asyncio.Future[Res]]]) -> None:
        started = time.perf_counter()
        try:
            results = await asyncio.to_thread(self.process, [item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"backend returned {len(results)} results for {len(batch)} inputs")
        except Exception as exc:  # every caller of the batch sees the backend's error
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self.stats.batches += 1
            self.stats.items += len(batch)
            self.stats.busy_seconds += time.perf_counter() - started
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, len(batch))

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None


class Dispatcher(Generic[Req, Res]):
    """`await submit(x)` from any number of coroutines: each call goes out at once as `process(x)`, with at
    most `limit` under way (the others wait for a free slot, first come first served). For engines that
    batch on their side (vLLM's continuous batching): no call waits for another to finish. `close` runs on
    `aclose` (e.g. the engine's HTTP client)."""

    def __init__(
        self,
        process: Callable[[Req], Awaitable[Res]],
        limit: int,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.process = process
        self.limit = limit
        self.stats = BatchStats()
        self._close = close
        self._slots: asyncio.Semaphore | None = None
        self._in_flight = 0
        self._busy_since = 0.0

    async def submit(self, item: Req) -> Res:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        async with self._slots:
            self._started()
            try:
                return await self.process(item)
            finally:
                self._finished()

    def _started(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
        self._in_flight += 1
        self.stats.batches += 1
        self.stats.items += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self._in_flight)

    def _finished(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self.stats.busy_seconds += time.perf_counter() - self._busy_since

    async def aclose(self) -> None:
        self._slots = None  # the next run may be on another event loop
        if self._close is not None:
            await self._close()
