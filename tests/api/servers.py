"""Real servers on loopback for API tests: the app under uvicorn, and an upstream, each in
a thread with its own event loop (so sync tests, Playwright's included, can talk to them)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI

from tests.dispatch.upstream import Upstream, start_upstream

T = TypeVar("T")
START_TIMEOUT = 30.0  # seconds for a server to start listening
STOP_TIMEOUT = 30.0  # seconds for it to stop (the in-process worker drains first)


@contextmanager
def serve_app(app: FastAPI, sock: socket.socket | None = None) -> Iterator[str]:
    """Run ``app`` under uvicorn on 127.0.0.1 (a free port, or the bound ``sock`` when its
    address had to be known first); yields its base URL."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", access_log=False
    )
    server = uvicorn.Server(config)
    sockets = [sock] if sock is not None else None
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": sockets}, name="uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT)


class LoopThread:
    """An asyncio loop running in a thread; ``run`` executes a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(START_TIMEOUT)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(STOP_TIMEOUT)
        self.loop.close()


@contextmanager
def threaded_upstream() -> Iterator[Upstream]:
    """The dispatcher tests' scriptable upstream, served from its own thread."""
    loop = LoopThread()
    upstream, runner = loop.run(start_upstream())
    try:
        yield upstream
    finally:
        loop.run(runner.cleanup())
        loop.close()
