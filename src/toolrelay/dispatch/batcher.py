"""Natural batching of database writes: whatever arrives while one flush runs goes next."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """``submit`` waits until its item was written by ``flush`` (one call for many items)."""

    def __init__(self, flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]]) -> None:
        self._flush = flush
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._runner: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        while self._pending:
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
