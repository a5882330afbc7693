"""A loopback HTTP server whose behaviour each test scripts, and that counts every request."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request, int], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class Upstream:
    """``routes[path]`` decides the answer; the handler gets the request and its hit number."""

    routes: dict[str, Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    hits: Counter[str] = field(default_factory=Counter)
    by_invocation: Counter[str] = field(default_factory=Counter)
    base_url: str = ""
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.seen.append(
            Seen(request.method, request.path, dict(request.query), dict(request.headers), body)
        )
        self.hits[request.path] += 1
        inv = request.headers.get("X-Toolrelay-Invocation")
        if inv:
            self.by_invocation[inv] += 1
        self.arrived.set()
        handler = self.routes.get(request.path, echo)
        return await handler(request, self.hits[request.path])


async def echo(request: web.Request, _hit: int) -> web.StreamResponse:
    raw = await request.read()
    return web.json_response(
        {
            "method": request.method,
            "query": dict(request.query),
            "body": json.loads(raw) if raw else None,
        }
    )


async def start_upstream() -> tuple[Upstream, web.AppRunner]:
    upstream = Upstream()
    app = web.Application(client_max_size=1024**3)
    app.router.add_route("*", "/{tail:.*}", upstream.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    upstream.base_url = f"http://127.0.0.1:{port}"
    return upstream, runner
