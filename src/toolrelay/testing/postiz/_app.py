"""The aiohttp application: the API alone, or behind the self-hosted nginx front."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from ._api import API_PREFIX, STATE, add_api_routes
from ._errors import ApiError
from ._models import RecordedRequest
from ._state import PostizState

FRONT_API_PREFIX = "/api"  # nginx `location /api/` proxies to the backend and strips this
FRONT_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Postiz</title></head>
<body><div id="__next">Postiz</div></body></html>
"""

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(state: PostizState, front: bool = False) -> web.Application:
    """In front mode `/api/*` is the API without `/api`; every other path is the web app."""
    app = web.Application(middlewares=[_record_requests, _api_errors])
    prefix = FRONT_API_PREFIX if front else ""
    app[STATE] = state
    app[API_PREFIX] = prefix
    add_api_routes(app, prefix)
    if front:
        app.router.add_route("*", "/{tail:.*}", _frontend_page)
    return app


async def _frontend_page(request: web.Request) -> web.Response:
    """The Next.js frontend answers any unknown path, whatever the method, with a page."""
    return web.Response(text=FRONT_HTML, content_type="text/html")


@web.middleware
async def _record_requests(request: web.Request, handler: _Handler) -> web.StreamResponse:
    raw = await request.read()
    entry = RecordedRequest(
        method=request.method,
        path=request.path,
        query=dict(request.query),
        headers=CIMultiDict(request.headers),
        body=_parse_json(raw),
        raw_body=raw,
    )
    request.app[STATE].requests.append(entry)
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        entry.status = exc.status
        raise
    entry.status = response.status
    return response


@web.middleware
async def _api_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()


def _parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
