"""Natural batching of database writes: whatever arrives while one flush runs goes next."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """``submit`` waits until its item was written by ``flush`` (one call for many items).

    ``linger``: before each flush, how long to wait for more items (called each time; 0:
    none), unless ``full`` items are already waiting.
    """

    def __init__(
        self,
        flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        linger: Callable[[], float] | None = None,
        full: int = 0,
    ) -> None:
        self._flush = flush
        self._linger = linger
        self._full = full
        self._filled = asyncio.Event()
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        return await self.enqueue(item)

    def enqueue(self, item: T) -> asyncio.Future[R]:
        """Queue ``item`` now; the future is its result once written."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._full and len(self._pending) >= self._full:
            self._filled.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return future

    async def drain(self) -> None:
        """Once everything queued so far has been flushed (the flushing is not cancelled
        when this wait is)."""
        while self._runner is not None and not self._runner.done():
            await asyncio.wait({self._runner})

    async def _run(self) -> None:
        while self._pending:
            delay = self._linger() if self._linger is not None else 0.0
            if delay > 0 and not (self._full and len(self._pending) >= self._full):
                self._filled.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._filled.wait(), delay)
            batch, self._pending = self._pending, []
            try:
                results = await self._flush([item for item, _ in batch])
            except BaseException as exc:  # every waiter learns of the failure
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
