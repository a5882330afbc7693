"""Calls made in a process that runs a worker go to that worker directly (migration 0036).

``serve`` makes calls (the API's invoke, MCP's tools/call) and runs a worker in the same
event loop. Before making a call it reserves a slot of that worker; the call is inserted
already claimed for it (lease owner, lease, attempt 1), and handed over once committed: no
NOTIFY, no wake-up, no claim scan. Where the worker is full, stopping or absent, the call
is made as any other and notifies. If the process dies in between, the lease runs out and
any worker claims the call again, as after a worker that died holding it.

Making a call and handing it over is one step no cancellation splits (``make``): a
request cancelled while its insert is in flight (the client gone, a shutdown) would
otherwise leave a committed call claimed for a worker that was never told, waiting out
its lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from toolrelay.registry.service import Claim

if TYPE_CHECKING:
    from toolrelay.dispatch.worker import Worker

__all__ = ["HandOff"]

T = TypeVar("T")


class HandOff:
    """The in-process worker's door, for this process's calls; used in its event loop."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self._making: set[asyncio.Task[Any]] = set()  # the loop holds tasks only weakly

    async def make(
        self,
        making: Callable[[Claim | None], Awaitable[T]],
        made: Callable[[T], UUID | None],
        owner: UUID | None = None,
    ) -> T:
        """``making(claim)``'s value: the call made with a slot of the in-process worker
        (when it has one free) and settled with ``made(value)``, the call's id. It runs to
        its end in a task of its own, whatever happens to the caller: once the insert is
        sent, its call is handed over or its slot given back, as when a worker thread made
        it (a cancelled caller still raises CancelledError). ``owner``: whose call it is (an
        owner's calls take at most a share of the worker's slots this way)."""

        async def whole() -> T:
            claim = self.reserve(owner)
            value: T | None = None
            try:
                value = await making(claim)
                return value
            finally:  # a call waiting for approval was not claimed: the worker finds that
                self.settle(claim, made(value) if value is not None else None, owner)

        task: asyncio.Task[T] = asyncio.ensure_future(whole())
        self._making.add(task)
        task.add_done_callback(self._making.discard)
        # shield: the caller's cancellation (asyncio's or anyio's) stops its wait, not this
        return await asyncio.shield(task)

    async def made_all(self, timeout: float) -> None:
        """Once every call being made has been made and settled, or ``timeout`` s have
        passed (a shutdown waits for those whose requests were cancelled before the worker
        stops; one stuck on a database that does not answer does not hold it forever)."""
        if self._making:
            await asyncio.wait(set(self._making), timeout=timeout)

    def reserve(self, owner: UUID | None = None) -> Claim | None:
        """Before making a call: the claim to make it with, or None (made unclaimed)."""
        return self.worker.reserve(owner) if self.worker is not None else None

    def settle(
        self, claim: Claim | None, invocation_id: UUID | None, owner: UUID | None = None
    ) -> None:
        """After making it (``invocation_id`` None: none was made)."""
        if self.worker is None:
            return
        if claim is not None:
            self.worker.adopt(invocation_id, owner)
        elif invocation_id is not None and self.worker.taking_hand_offs:
            self.worker.poke()  # made unclaimed here: claimed in turn, without a NOTIFY
