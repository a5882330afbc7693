"""An upstream route that holds its answer until the test opens the gate, and notes when it
answered; and waiting for a condition another thread makes true (bounded)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

HOLD_LIMIT = 20.0  # seconds a held request waits for its gate at most
UNTIL_LIMIT = 5.0  # seconds `until` waits for its condition at most


@dataclass
class Gate:
    opened: threading.Event = field(default_factory=threading.Event)
    answered_at: float | None = None  # time.monotonic() when the upstream answered

    async def handler(self, _request: web.Request, _hit: int) -> web.StreamResponse:
        await asyncio.to_thread(self.opened.wait, HOLD_LIMIT)
        self.answered_at = time.monotonic()
        return web.json_response({"city": "Held", "temperature_c": 1.0})

    def open(self) -> None:
        self.opened.set()


def until(condition: Callable[[], bool], limit: float = UNTIL_LIMIT) -> bool:
    """Wait (bounded) until ``condition()``; whether it became true."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


async def until_async(condition: Callable[[], bool], limit: float = UNTIL_LIMIT) -> bool:
    """``until`` for a coroutine: the loop keeps running while it waits."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.002)
    return True
