"""The FastAPI application: /v1 (owners and agents), /approvals, /metrics, and the in-process
worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, RedirectResponse

from toolrelay import __version__
from toolrelay.api import (
    agent_routes,
    approvals,
    approvals_history,
    connect_routes,
    errors,
    operations,
    owner_routes,
    signin_routes,
)
from toolrelay.api.audit_routes import router as audit_router
from toolrelay.api.context import ApiContext, ApiSettings
from toolrelay.api.limits import BodySizeLimit
from toolrelay.api.member_routes import router as member_router
from toolrelay.api.policy_routes import router as policy_router
from toolrelay.api.webhook_routes import router as webhook_router
from toolrelay.dispatch.outcomes import nothing_held
from toolrelay.dispatch.worker import Worker
from toolrelay.mcp.http import mount_mcp

log = logging.getLogger("toolrelay.api")

WORKER_STOP_TIMEOUT = 15.0  # seconds; the worker itself gives in-flight calls 10 s

# Relative: the schema describes whichever address served it (behind a proxy or not), and
# generated clients take the base URL as an argument. There is no public-URL setting.
SERVERS = [{"url": "/", "description": "The server that served this document"}]

HEALTH_BODY = {
    "type": "object",
    "properties": {"status": {"type": "string"}, "database": {"type": "string"}},
    "required": ["status", "database"],
}
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": description, "content": {"application/json": {"schema": HEALTH_BODY}}}
    for status, description in ((200, "Up, the database reachable"), (503, "The database is not"))
}

DESCRIPTION = """
The toolrelay HTTP API. Owners manage tools, credentials, agents and assignments, and decide
on pending invocations; agents list their tools and invoke them. Authenticate with
`Authorization: Bearer <token>`. Errors are `{"error": {"code", "message"}}`; see docs/api.md.
"""


async def _close(context: ApiContext) -> None:
    await context.outcomes.close()
    await context.db.aclose()  # the pool of the loop ending (db/aio.py)


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    context = ApiContext.build(settings)

    running: list[Worker] = []  # the in-process worker, while it runs: /metrics reports it

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if not settings.run_worker:
            try:
                yield
            finally:
                await _close(context)
            return
        worker = Worker(context.db.url, settings.worker, settings.keyring, settings.egress)
        worker.on_outcomes = context.outcomes.hand  # the hand-off: same process, same loop
        context.outcomes.holding = worker.holds  # its NOTIFY may come before the hand-off
        running[:] = [worker]
        context.handoff.worker = worker  # calls made here go to it directly
        task = asyncio.create_task(worker.run(), name="toolrelay-worker")
        task.add_done_callback(_report_worker_exit)  # the worker logs its own start line
        try:
            yield
        finally:
            # cancelled requests' calls, handed over still
            await context.handoff.made_all(WORKER_STOP_TIMEOUT)
            context.handoff.worker = None
            context.outcomes.holding = nothing_held
            worker.stop()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), WORKER_STOP_TIMEOUT)
            if not task.done():
                task.cancel()
            await _close(context)

    app = FastAPI(
        title="toolrelay",
        version=__version__,
        description=DESCRIPTION,
        openapi_url="/openapi.json",
        docs_url=None,  # Swagger UI and ReDoc load third-party scripts; the schema is enough
        redoc_url=None,
        lifespan=lifespan,
        servers=SERVERS,
    )
    app.state.toolrelay = context
    errors.install(app)
    app.include_router(agent_routes.router)  # first: agents skip the 30 below (bench/routing.py)
    app.include_router(owner_routes.router)
    app.include_router(approvals.router)
    app.include_router(signin_routes.router)  # OpenID Connect sign-in (docs/approvals.md)
    app.include_router(connect_routes.router)  # /v1/credentials/connect, /v1/oauth/callback
    app.include_router(connect_routes.pages)  # /approvals/connect, /approvals/credentials
    app.include_router(approvals_history.router)  # /approvals/history, /approvals/calls/{id}
    app.include_router(webhook_router)  # /v1/webhooks (docs/notifications.md)
    app.include_router(audit_router)  # /v1/audit (docs/audit.md)
    app.include_router(member_router)  # /v1/members (docs/approvals.md)
    app.include_router(policy_router)  # /v1/policies (docs/approvals.md)
    mount_mcp(app)  # MCP over streamable HTTP at /mcp (docs/mcp.md); its middleware first
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(operations.AccessLog)  # outermost: one JSON line per request
    # Prometheus text; no token, loopback only unless TOOLRELAY_METRICS_ALLOW (docs/operations.md)
    operations.install(app, context.db, lambda: running[0] if running else None)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/approvals", status_code=307)

    @app.get(
        "/healthz",
        tags=["health"],
        operation_id="getHealth",
        summary="Health, the database's included",
        responses=HEALTH_RESPONSES,
    )
    def healthz() -> JSONResponse:
        # 503 while the database is unreachable: a load balancer sends nobody here then.
        up = context.db.ping()
        return JSONResponse(
            {"status": "ok" if up else "degraded", "database": "ok" if up else "unavailable"},
            status_code=200 if up else 503,
        )

    return app


def _report_worker_exit(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error(
            "in-process worker stopped with an error",
            exc_info=exc,
            extra={"action": "worker_crash"},
        )
