"""For operators: ``/metrics`` (Prometheus text) and one JSON access line per request.

``/metrics`` holds the in-process worker's counters (the same ``Metrics`` that
``toolrelay worker --metrics-port`` serves) and ``toolrelay_pending_approvals``: calls waiting
for a decision whose window is still open, over all owners, read as the dispatcher at scrape
time and cached for ``PENDING_CACHE_SECONDS``. It needs no token, like ``/healthz``, but it
answers only clients on loopback unless ``TOOLRELAY_METRICS_ALLOW`` lists more networks
(comma-separated addresses or CIDRs; ``0.0.0.0/0,::/0`` for anyone): the counts cover every
owner. Behind ``--proxy-headers`` the client is the forwarded one, so a proxied request from
elsewhere is refused too.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from toolrelay import errors
from toolrelay.db import Database
from toolrelay.db.queries import load
from toolrelay.dispatch.metrics import CONTENT_TYPE, family
from toolrelay.dispatch.worker import Worker
from toolrelay.logs import ACCESS_ACTION, ACCESS_LOGGER

METRICS_ALLOW_ENV = "TOOLRELAY_METRICS_ALLOW"
PENDING_CACHE_SECONDS = 5.0
MAX_LOGGED_PATH = 1000  # characters of a request path in an access line

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
ASGIApp = Callable[..., Any]

log = logging.getLogger("toolrelay.api")
access_log = logging.getLogger(ACCESS_LOGGER)


# --- who may scrape ---------------------------------------------------------------------------


def metrics_networks(environ: Mapping[str, str] | None = None) -> tuple[IPNetwork, ...]:
    """Loopback, plus what TOOLRELAY_METRICS_ALLOW lists."""
    raw = (os.environ if environ is None else environ).get(METRICS_ALLOW_ENV, "")
    extra: list[IPNetwork] = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            extra.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise errors.ConfigurationError(
                f"{METRICS_ALLOW_ENV}: {item!r} is not an IP address or CIDR network"
            ) from None
    return (*LOOPBACK, *extra)


def client_allowed(host: str | None, networks: tuple[IPNetwork, ...]) -> bool:
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in networks)


# --- the pending-approvals gauge --------------------------------------------------------------


class PendingApprovals:
    """The count of open pending approvals, read at most every ``ttl`` seconds."""

    def __init__(self, db: Database, ttl: float = PENDING_CACHE_SECONDS) -> None:
        self.db = db
        self.ttl = ttl
        self._lock = threading.Lock()
        self._value: int | None = None
        self._read_at = float("-inf")

    def get(self) -> int | None:
        """The count, or None when the database could not be read."""
        with self._lock:
            if time.monotonic() - self._read_at < self.ttl:
                return self._value
            try:
                with self.db.as_dispatcher() as conn:
                    row = conn.execute(load("operations")["pending_approvals"]).fetchone()
                value: int | None = int(row["pending"]) if row else 0
            except (psycopg.Error, errors.ToolrelayError) as exc:
                log.warning(
                    "could not read pending approvals for /metrics",
                    extra={"action": "metrics_db_error", "error": str(exc)[:200]},
                )
                value = None
            self._value, self._read_at = value, time.monotonic()
            return value


def render(worker: Worker | None, pending: int | None) -> str:
    lines: list[str] = []
    if worker is not None:
        lines += worker.metrics.lines()
    lines += family(
        "toolrelay_database_up",
        "gauge",
        "1 if the last read of the database for /metrics succeeded.",
        [f"toolrelay_database_up {0 if pending is None else 1}"],
    )
    if pending is not None:
        lines += family(
            "toolrelay_pending_approvals",
            "gauge",
            "Invocations waiting for an approval decision, window still open, all owners.",
            [f"toolrelay_pending_approvals {pending}"],
        )
    return "\n".join(lines) + "\n"


def install(app: FastAPI, db: Database, worker: Callable[[], Worker | None]) -> None:
    """Add ``/metrics``; ``worker`` gives the in-process worker, if one runs."""
    networks = metrics_networks()
    pending = PendingApprovals(db)

    @app.get(
        "/metrics",
        tags=["health"],
        operation_id="getMetrics",
        summary="Prometheus metrics",
        include_in_schema=False,
    )
    async def metrics(request: Request) -> Response:
        client = request.client.host if request.client else None
        if not client_allowed(client, networks):
            raise errors.PermissionDenied(
                f"/metrics answers loopback clients only; list other networks in"
                f" {METRICS_ALLOW_ENV} to let them scrape it"
            )
        count = await run_in_threadpool(pending.get)
        # Rendered on the event loop, where the in-process worker updates its counters.
        return Response(render(worker(), count), headers={"Content-Type": CONTENT_TYPE})


# --- the access log ---------------------------------------------------------------------------


class AccessLog:
    """One line per HTTP request on ``uvicorn.access``: method, path (never the query
    string, which may carry tokens), status, duration. uvicorn's own line is dropped by
    ``toolrelay.logs.configure``; ``access_log=False`` silences this one as well."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not access_log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500  # if the app fails before answering, the server answers 500

        async def sending(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = str(scope.get("path", ""))[:MAX_LOGGED_PATH]  # root_path included
            client = scope.get("client")
            access_log.info(
                f"{scope.get('method')} {path} {status}",
                extra={
                    "action": ACCESS_ACTION,
                    "method": scope.get("method"),
                    "path": path,
                    "status": status,
                    "duration_ms": round((time.monotonic() - started) * 1000, 3),
                    "client": client[0] if client else None,
                },
            )
