"""The dispatcher keeps no cookies. One HTTP session serves every call a worker makes, for
every owner: a cookie an upstream set on one call's answer would go out with the next request
to that host, whoever makes it. Another owner's call would act in the first owner's session
at the upstream, and any call would send a header that is not in the request rendered,
approved and recorded."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]
# By name, not 127.0.0.1: aiohttp's cookie jar keeps no cookie for an IP address, and real
# upstreams are reached by name.
LOOPBACK_BY_NAME = EgressPolicy(
    allow_hosts=frozenset(),
    allow_networks=(ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("::1/128")),
)
SESSION = "sid=owner-a-session"


def by_name(upstream: Upstream) -> str:
    return upstream.base_url.replace("127.0.0.1", "localhost")


async def sets_a_session(_request: web.Request, _hit: int) -> web.Response:
    response = web.json_response({"signed_in": True})
    response.set_cookie("sid", "owner-a-session", path="/", httponly=True)
    return response


def sent_cookies(upstream: Upstream, path: str) -> list[str | None]:
    return [seen.headers.get("Cookie") for seen in upstream.seen if seen.path == path]


def read_tool(registry: Registry, key: str, url: str) -> dict[str, Any]:
    tool = add_tool(registry, key, endpoint_url=url)
    registry.create_agent("bot")
    registry.assign("bot", key)
    return tool


async def test_a_cookie_an_upstream_sets_goes_out_with_no_later_call(
    make_registry: Callable[[], Registry], upstream: Upstream, drain: Drain
) -> None:
    owner_a, owner_b = make_registry(), make_registry()
    read_tool(owner_a, "sign.in", f"{by_name(upstream)}/login")
    read_tool(owner_b, "read.data", f"{by_name(upstream)}/data")
    made: list[str] = []

    async def signs_in_then_the_other_owner_calls(request: web.Request, hit: int) -> web.Response:
        # Owner B's call is made once owner A's first answer (and its Set-Cookie) is in: the
        # claim takes turns between owners, so made before, it could go first.
        if hit == 2:
            made.append(owner_b.invoke("bot", "read.data", {"text": "b"}))
        return await sets_a_session(request, hit)

    upstream.routes["/login"] = signs_in_then_the_other_owner_calls
    first = owner_a.invoke("bot", "sign.in", {"text": "a"})
    again = owner_a.invoke("bot", "sign.in", {"text": "a"})

    # One worker, one call at a time (an owner's calls in the order made): each answer and
    # its Set-Cookie are in before the next request is built.
    await drain(egress=LOOPBACK_BY_NAME, concurrency=1)
    [other] = made

    statuses = [owner_a.get_invocation(first)["status"], owner_a.get_invocation(again)["status"],
                owner_b.get_invocation(other)["status"]]  # fmt: skip
    assert statuses == ["completed"] * 3
    assert [seen.path for seen in upstream.seen] == ["/login", "/login", "/data"]
    assert sent_cookies(upstream, "/login") == [None, None]  # not even the same tool's
    assert sent_cookies(upstream, "/data") == [None]  # nor another owner's
    # and what each attempt recorded is what went out: no Cookie there either
    for registry, inv in ((owner_a, again), (owner_b, other)):
        [attempt] = registry.get_invocation(inv)["attempts"]
        assert "cookie" not in {name.lower() for name in attempt["request_headers"]}
