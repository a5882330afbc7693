"""The upstream every system under test calls: an aiohttp server in its own process.

It records the arrival time (time.time(), the clock PostgreSQL's now() also reads) of the
first request for each X-Toolrelay-Invocation value, and counts repeats. The harness reads
and resets that record over two control routes.

Run: ``python -m bench.upstream`` prints ``PORT <n>`` once listening on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.constants import (
    INVOCATION_HEADER,
    PROCESS_START_TIMEOUT_S,
    UPSTREAM_HOST,
    UPSTREAM_PATH,
)
from bench.procs import Child, python_module

STATS_PATH = "/_bench/stats"
RESET_PATH = "/_bench/reset"
RESPONSE_BODY = b'{"ok":true}'
CONTROL_TIMEOUT_S = 60.0


@dataclass
class Record:
    first: dict[str, float] = field(default_factory=dict)  # invocation -> first arrival
    repeats: dict[str, int] = field(default_factory=dict)  # invocation -> extra arrivals
    without_header: int = 0
    total: int = 0

    async def call(self, request: web.Request) -> web.Response:
        now = time.time()
        self.total += 1
        key = request.headers.get(INVOCATION_HEADER)
        if key is None:
            self.without_header += 1
        elif key in self.first:
            self.repeats[key] = self.repeats.get(key, 0) + 1
        else:
            self.first[key] = now
        await request.read()
        return web.Response(body=RESPONSE_BODY, content_type="application/json")

    async def stats(self, _request: web.Request) -> web.Response:
        body = {
            "total": self.total,
            "without_header": self.without_header,
            "first": self.first,
            "repeats": self.repeats,
        }
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    async def reset(self, _request: web.Request) -> web.Response:
        self.first, self.repeats = {}, {}
        self.without_header = self.total = 0
        return web.Response(body=RESPONSE_BODY, content_type="application/json")


async def serve() -> None:
    record = Record()
    app = web.Application()
    app.router.add_get(STATS_PATH, record.stats)
    app.router.add_post(RESET_PATH, record.reset)
    app.router.add_post(UPSTREAM_PATH, record.call)
    app.router.add_get(UPSTREAM_PATH, record.call)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, UPSTREAM_HOST, 0, backlog=1024)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


@dataclass
class Arrivals:
    """What the upstream saw since its last reset."""

    total: int
    without_header: int
    first: dict[str, float]
    repeats: dict[str, int]

    @property
    def duplicates(self) -> int:
        """Requests beyond the first for one invocation: must be 0."""
        return sum(self.repeats.values())

    def window(self) -> tuple[float, float]:
        times = self.first.values()
        return (min(times), max(times)) if self.first else (0.0, 0.0)


class UpstreamProcess:
    """The harness's handle on the upstream child."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.child = Child("upstream", python_module("bench.upstream"), env, log_path, True)
        deadline = time.monotonic() + PROCESS_START_TIMEOUT_S
        line = ""
        while not line.startswith("PORT ") and time.monotonic() < deadline:
            line = self.child.readline()
            if not line and self.child.poll() is not None:
                break
        if not line.startswith("PORT "):
            self.child.kill()
            raise RuntimeError(f"upstream did not start: {self.child.tail()}")
        self.base = f"http://{UPSTREAM_HOST}:{int(line.split()[1])}"
        self.url = f"{self.base}{UPSTREAM_PATH}"

    def _request(self, method: str, path: str) -> Any:
        req = urllib.request.Request(f"{self.base}{path}", method=method, data=b"")
        if method == "GET":
            req = urllib.request.Request(f"{self.base}{path}")
        with urllib.request.urlopen(req, timeout=CONTROL_TIMEOUT_S) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        self._request("POST", RESET_PATH)

    def arrivals(self) -> Arrivals:
        data = self._request("GET", STATS_PATH)
        return Arrivals(data["total"], data["without_header"], data["first"], data["repeats"])

    def stop(self) -> None:
        self.child.stop()


if __name__ == "__main__":
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)
