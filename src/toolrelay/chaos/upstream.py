"""The servers a chaos run talks to, all on loopback, all counting what reaches them.

* ``ChaosUpstream``: the tools' endpoint. It records every request by its
  ``X-Toolrelay-Invocation`` header (method, raw target, headers and body, so the checks can
  compare it with what was approved) and misbehaves on purpose: 5xx, refusals (429, 503 with
  Retry-After), answers slower than the tool's timeout, connection resets before and after
  reading the body, truncated bodies, redirects to addresses the egress guard must refuse,
  bodies that echo the credential back. An invocation can force one behaviour with the
  query parameter ``chaos=<action>``.
* ``TokenEndpoint``: an OAuth token endpoint (refresh_token grant) that fails at times.
* ``Canary``: a TCP listener on an address the guard must never let the dispatcher reach;
  it counts connections, which must stay at zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import socket
import struct
import time
from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

INVOCATION_HEADER = "X-Toolrelay-Invocation"
IDEMPOTENCY_HEADER = "Idempotency-Key"
API_KEY_HEADER = "X-Api-Key"
API_KEY_QUERY = "api_key"

# What the upstream may do with one request, and how often (relative weights).
ACTIONS: dict[str, float] = {
    "ok": 60.0,  # 200, 201 or 202 with a JSON body naming the invocation and arrival
    "error_5xx": 7.0,  # 500, 502 or 504: a definite answer (reads retry, writes do not)
    "refuse_429": 3.0,  # 429 + Retry-After: refused unprocessed (writes may retry)
    "refuse_503": 3.0,  # 503 + Retry-After: refused unprocessed
    "error_4xx": 3.0,  # 400, 404, 409 or 422: a definite answer
    "slow": 4.0,  # answers after the tool's timeout
    "reset_before": 4.0,  # connection reset without reading the body
    "reset_after": 4.0,  # body read (the side effect happened), then reset
    "truncated": 4.0,  # status and headers, half the body, then reset
    "redirect_blocked": 4.0,  # 302 to an address the egress guard must refuse
    "redirect_self": 1.5,  # 307 to another path here (followed by reads)
    "leak": 1.5,  # echoes the credential it received in the body
    "html": 1.0,  # 200 with HTML where JSON was expected
}
# Answers after which the server did not process the request: a write may be sent again.
REFUSALS = frozenset({"refuse_429", "refuse_503"})


@dataclass
class Arrival:
    """One request as the upstream saw it and what it answered."""

    seq: int  # the n-th request for this invocation, from 1
    method: str
    path: str
    action: str
    at: float
    idempotency_key: str | None = None
    wall: float = 0.0  # time.time() at arrival: comparable with the database's timestamps
    target: str = ""  # the request target as received, raw: path and query
    headers: tuple[tuple[str, str], ...] = ()  # as received, in order, credential included
    body: bytes = b""
    auth_ok: bool | None = None  # None: the tool has no credential
    status: int | None = None  # the status line sent, if any
    complete: bool = False  # a whole response was written
    redirect_to: str | None = None

    @property
    def accepted(self) -> bool:
        """Anything but an explicit refusal may have been processed."""
        return self.action not in REFUSALS

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "action": self.action,
            "status": self.status,
            "complete": self.complete,
            "accepted": self.accepted,
            "auth_ok": self.auth_ok,
            "idempotency_key": self.idempotency_key,
            "redirect_to": _redacted(self.redirect_to),
        }


def _redacted(location: str | None) -> str | None:
    """A self-redirect repeats the query, credential included: never write that down."""
    if location is None or f"{API_KEY_QUERY}=" not in location:
        return location
    path, _, query = location.partition("?")
    parts = [
        f"{API_KEY_QUERY}=[redacted]" if p.startswith(f"{API_KEY_QUERY}=") else p
        for p in query.split("&")
    ]
    return f"{path}?{'&'.join(parts)}"


@dataclass
class CredentialCheck:
    """How the upstream recognises the credential a tool must carry."""

    kind: str  # "api_key_header", "api_key_query" or "bearer"
    values: Container[str]


class AnyOf:
    """Values valid for a credential: several live collections (issued, rotated in)."""

    def __init__(self, *parts: Container[str]) -> None:
        self.parts = parts

    def __contains__(self, value: object) -> bool:
        return any(value in part for part in self.parts)


@dataclass
class StallScript:
    """The stale-lease probe's route: the first request waits ``first`` seconds, then 200;
    the second waits ``second`` seconds, then 201; later ones get 202 at once."""

    first: float
    second: float


class Canary:
    """A TCP listener on a forbidden address; every connection is counted (and answered)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.port = 0
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> bool:
        try:
            self._server = await asyncio.start_server(self._accept, self.host, 0)
        except OSError:
            return False
        self.port = self._server.sockets[0].getsockname()[1]
        return True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(Exception):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            await writer.drain()
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class _Server:
    """An aiohttp app on 127.0.0.1 with a random port."""

    def __init__(self) -> None:
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def _serve(self, app: web.Application) -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class UpstreamStats:
    arrivals: dict[str, list[Arrival]] = field(default_factory=dict)
    without_invocation: int = 0
    actions: Counter[str] = field(default_factory=Counter)
    redirects_blocked: int = 0


class ChaosUpstream(_Server):
    """The tools' endpoint: ``/api/<tool key>``, ``/final/<tool key>`` and ``/stall``."""

    def __init__(
        self,
        seed: int,
        timeout_seconds: float,
        blocked_targets: Sequence[str],
        weights: dict[str, float] | None = None,
        stall: StallScript | None = None,
    ) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.timeout_seconds = timeout_seconds
        self.blocked_targets = list(blocked_targets)
        self.weights = dict(weights or ACTIONS)
        self.stall = stall or StallScript(first=1.0, second=3.0)
        self.credentials: dict[str, CredentialCheck] = {}  # by tool key
        self.stats = UpstreamStats()
        self.arrived = asyncio.Event()

    async def start(self) -> None:
        app = web.Application(client_max_size=1024**2)
        app.router.add_route("*", "/stall", self._stall)
        app.router.add_route("*", "/final/{tool}", self._final)
        app.router.add_route("*", "/api/{tool}", self._api)
        app.router.add_route("*", "/api/{tool}/{variant}", self._api)  # endpoint path changes
        await self._serve(app)

    def seen(self, invocation_id: str) -> list[Arrival]:
        return self.stats.arrivals.get(invocation_id, [])

    # --- handlers ------------------------------------------------------------------------

    async def _arrive(self, request: web.Request, action: str) -> Arrival | None:
        inv = request.headers.get(INVOCATION_HEADER)
        if not inv:
            self.stats.without_invocation += 1
            return None
        history = self.stats.arrivals.setdefault(inv, [])
        arrival = Arrival(
            seq=len(history) + 1,
            method=request.method,
            path=request.path,
            action=action,
            at=time.monotonic(),
            idempotency_key=request.headers.get(IDEMPOTENCY_HEADER),
            wall=time.time(),
            target=request.raw_path,
            headers=tuple(
                (k.decode("latin-1"), v.decode("utf-8", "replace")) for k, v in request.raw_headers
            ),
        )
        history.append(arrival)
        # Read before any action, reset_before included: the body is part of the record,
        # and reading it changes nothing the dispatcher can see (it sent it either way).
        if request.can_read_body:
            arrival.body = await request.read()
        self.stats.actions[action] += 1
        self.arrived.set()
        return arrival

    def _check_auth(self, request: web.Request, tool: str, arrival: Arrival) -> None:
        check = self.credentials.get(tool)
        if check is None:
            return
        if check.kind == "api_key_header":
            got = request.headers.get(API_KEY_HEADER)
        elif check.kind == "api_key_query":
            got = request.query.get(API_KEY_QUERY)
        else:
            header = request.headers.get("Authorization", "")
            got = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        arrival.auth_ok = got is not None and got in check.values

    def _pick(self, request: web.Request) -> str:
        forced = request.query.get("chaos")
        if forced in self.weights:
            return forced
        names = list(self.weights)
        return self.rng.choices(names, weights=[self.weights[n] for n in names])[0]

    async def _api(self, request: web.Request) -> web.StreamResponse:
        action = self._pick(request)
        tool = request.match_info["tool"]
        arrival = await self._arrive(request, action)
        if arrival is None:
            return web.json_response({"error": "no invocation header"}, status=400)
        self._check_auth(request, tool, arrival)
        if action == "reset_before":
            return _reset(request)
        return await self._act(request, tool, arrival)

    async def _final(self, request: web.Request) -> web.StreamResponse:
        arrival = await self._arrive(request, "ok")
        if arrival is None:
            return web.json_response({"error": "no invocation header"}, status=400)
        self._check_auth(request, request.match_info["tool"], arrival)
        return await _answer(request, arrival, self.rng.choice((200, 201, 202)))

    async def _stall(self, request: web.Request) -> web.StreamResponse:
        arrival = await self._arrive(request, "stall")
        if arrival is None:
            return web.json_response({"error": "no invocation header"}, status=400)
        if arrival.seq == 1:
            await asyncio.sleep(self.stall.first)
            return await _answer(request, arrival, 200)
        if arrival.seq == 2:
            await asyncio.sleep(self.stall.second)
            return await _answer(request, arrival, 201)
        return await _answer(request, arrival, 202)

    async def _act(self, request: web.Request, tool: str, arrival: Arrival) -> web.StreamResponse:
        action = arrival.action
        rng = self.rng
        if action == "ok":
            return await _answer(request, arrival, rng.choice((200, 201, 202)))
        if action == "error_5xx":
            return await _answer(request, arrival, rng.choice((500, 502, 504)))
        if action == "error_4xx":
            return await _answer(request, arrival, rng.choice((400, 404, 409, 422)))
        if action == "refuse_429":
            return await _answer(request, arrival, 429, headers={"Retry-After": "0"})
        if action == "refuse_503":
            return await _answer(request, arrival, 503, headers={"Retry-After": "0"})
        if action == "slow":
            await asyncio.sleep(self.timeout_seconds + rng.uniform(0.6, 1.2))
            return await _answer(request, arrival, 200)
        if action == "reset_after":
            return _reset(request)
        if action == "truncated":
            return await _truncated(request, arrival)
        if action == "redirect_blocked":
            target = rng.choice(self.blocked_targets)
            arrival.redirect_to = target
            self.stats.redirects_blocked += 1
            return await _answer(request, arrival, 302, headers={"Location": target})
        if action == "redirect_self":
            location = f"/final/{tool}?{request.query_string}"
            arrival.redirect_to = location
            return await _answer(request, arrival, 307, headers={"Location": location})
        if action == "leak":
            echoed = {
                "authorization": request.headers.get("Authorization"),
                "api_key": request.headers.get(API_KEY_HEADER) or request.query.get(API_KEY_QUERY),
            }
            return await _answer(request, arrival, rng.choice((200, 500)), extra={"echo": echoed})
        if action == "html":
            return await _answer(
                request, arrival, 200, body=b"<!doctype html><p>not json</p>", content="text/html"
            )
        raise AssertionError(f"unknown action {action}")


async def _answer(
    request: web.Request,
    arrival: Arrival,
    status: int,
    *,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
    body: bytes | None = None,
    content: str = "application/json",
) -> web.StreamResponse:
    """Write a whole response; ``arrival.complete`` says whether that succeeded."""
    if body is None:
        payload = {"invocation": request.headers.get(INVOCATION_HEADER), "seq": arrival.seq}
        body = json.dumps(payload | {"status": status} | (extra or {})).encode()
    response = web.StreamResponse(status=status, headers=headers)
    response.content_type = content
    response.content_length = len(body)
    arrival.status = status
    try:
        await response.prepare(request)
        await response.write(body)
        await response.write_eof()
    except (ConnectionError, RuntimeError, OSError):
        return response
    arrival.complete = True
    return response


async def _truncated(request: web.Request, arrival: Arrival) -> web.StreamResponse:
    body = json.dumps({"invocation": request.headers.get(INVOCATION_HEADER), "pad": "x" * 200})
    response = web.StreamResponse(status=200)
    response.content_type = "application/json"
    response.content_length = len(body)
    arrival.status = 200
    with contextlib.suppress(ConnectionError, RuntimeError, OSError):
        await response.prepare(request)
        await response.write(body[: len(body) // 2].encode())
        await asyncio.sleep(0.05)  # let the half body leave before the reset
    _abort(request)
    return response


def _reset(request: web.Request) -> web.StreamResponse:
    _abort(request)
    return web.Response(status=500)  # never delivered: the connection is gone


def _abort(request: web.Request) -> None:
    """Close with a TCP reset (SO_LINGER 0) rather than an orderly FIN."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class TokenEndpoint(_Server):
    """OAuth 2.0 refresh_token grant on ``/token``; fails a share of requests on purpose.

    Access tokens live ``expires_in`` seconds; the resolver refreshes a minute early, so a
    token of 70 s is refreshed about every 10 s. Refresh tokens are not rotated: a rotation
    whose answer is lost would (rightly) end in needs_reauth and stop the OAuth tools.
    """

    def __init__(
        self, seed: int, failure_rate: float = 0.25, expires_in: int = 70, fail_first: int = 2
    ) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.failure_rate = failure_rate
        self.fail_first = fail_first  # the first requests fail for sure: retries are exercised
        self.expires_in = expires_in
        self.client_id = "chaos-client"
        self.client_secret = f"cs-{secrets.token_hex(16)}"
        self.refresh_token = f"rt-{secrets.token_hex(16)}"
        self.issued: list[str] = []
        self.requests = 0
        self.failures: Counter[str] = Counter()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/token", self._token)
        await self._serve(app)

    @property
    def url(self) -> str:
        return f"{self.base_url}/token"

    async def _token(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.requests <= self.fail_first or self.rng.random() < self.failure_rate:
            failure = self.rng.choice(("500", "503", "429", "reset"))
            self.failures[failure] += 1
            if failure == "reset":
                return _reset(request)
            return web.json_response({"error": "temporarily_unavailable"}, status=int(failure))
        form = await request.post()
        if (form.get("client_id"), form.get("client_secret")) != (
            self.client_id,
            self.client_secret,
        ):
            return web.json_response({"error": "invalid_client"}, status=401)
        if form.get("refresh_token") != self.refresh_token:
            return web.json_response({"error": "invalid_grant"}, status=400)
        token = f"at-{secrets.token_hex(16)}"
        self.issued.append(token)
        return web.json_response(
            {"access_token": token, "token_type": "Bearer", "expires_in": self.expires_in}
        )
