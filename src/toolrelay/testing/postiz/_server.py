"""Starting and stopping the server in-process, on a free port by default."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web

from ._api import PUBLIC
from ._app import FRONT_API_PREFIX, make_app
from ._models import Organization, default_organizations
from ._ratelimit import DEFAULT_RATE_LIMIT, DEFAULT_RATE_WINDOW_SECONDS, RateLimiter
from ._state import PostizState


@dataclass
class RunningPostiz:
    """A started server. `api_base_url` is where `/public/v1/...` lives."""

    base_url: str
    api_base_url: str
    front: bool
    state: PostizState
    _runner: web.AppRunner

    @property
    def public_url(self) -> str:
        """`api_base_url` + `/public/v1`: prefix of every endpoint path in the contract."""
        return self.api_base_url + PUBLIC

    @property
    def organizations(self) -> list[Organization]:
        return self.state.organizations

    def org(self, name: str) -> Organization:
        return self.state.org(name)

    def describe(self) -> dict[str, Any]:
        """What a demo needs to talk to the server; includes the API keys."""
        limiter = self.state.limiter
        return {
            "base_url": self.base_url,
            "api_base_url": self.api_base_url,
            "public_url": self.public_url,
            "front": self.front,
            "rate_limit": limiter.limit,
            "rate_window_seconds": limiter.window_seconds,
            "organizations": [o.to_json() for o in self.organizations],
        }

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> RunningPostiz:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def start_postiz(
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    front: bool = False,
    rate_limit: int = DEFAULT_RATE_LIMIT,
    rate_window_seconds: float = DEFAULT_RATE_WINDOW_SECONDS,
    organizations: list[Organization] | None = None,
) -> RunningPostiz:
    """Starts serving; `port=0` picks a free port. Seeds Acme and Globex when not given orgs."""
    limiter = RateLimiter(rate_limit, rate_window_seconds)
    orgs = default_organizations() if organizations is None else organizations
    state = PostizState(orgs, limiter=limiter)
    runner = web.AppRunner(make_app(state, front=front), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    base_url = f"http://{_url_host(host)}:{runner.addresses[0][1]}"
    api_base_url = base_url + FRONT_API_PREFIX if front else base_url
    return RunningPostiz(base_url, api_base_url, front, state, runner)


@asynccontextmanager
async def postiz_server(**options: Any) -> AsyncIterator[RunningPostiz]:
    """`async with postiz_server(front=True) as srv:`; options are start_postiz's."""
    server = await start_postiz(**options)
    try:
        yield server
    finally:
        await server.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
