"""The agents' door is the first the router tries (issue 14, the agent's round trip).

FastAPI's router tries the routes in order, each a regular expression: with the owners' 30
routes first, finding an agent's POST /v1/agent/invocations cost ~47 µs against ~5 µs with
the agents' routes first (``python -m bench.routing``; bench/RESULTS.md, session 15). /mcp has its own shortcut
(mcp/http.py, McpShortcut) and never reaches the router.
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.routing import Match

from tests.api.conftest import settings
from toolrelay.api import create_app
from toolrelay.credentials import Keyring

AGENT_REQUESTS = [
    ("POST", "/v1/agent/invocations"),
    ("GET", "/v1/agent/invocations/6f1c0f9e-5d7a-4c1e-9d0b-2a1e3c4b5d6f"),
    ("GET", "/v1/agent/tools"),
]


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "",
            "headers": [], "query_string": b""}  # fmt: skip


@pytest.mark.parametrize(("method", "path"), AGENT_REQUESTS)
def test_agent_requests_are_matched_before_any_other_routes(
    database_url: str, keyring: Keyring, method: str, path: str
) -> None:
    app = create_app(settings(database_url, keyring, run_worker=False))
    before: list[str] = []  # the paths tried first (FastAPI's own /openapi.json is one)
    for route in app.router.routes:
        match, _ = route.matches(_scope(method, path))
        if match == Match.FULL:
            break
        before.append(getattr(route, "path", None) or f"a group of {len(_routes(route))} routes")
    else:
        pytest.fail(f"no route matches {method} {path}")
    assert before == ["/openapi.json"], f"{method} {path} was matched after {before}"


def _routes(route: Any) -> list[Any]:
    router = getattr(route, "original_router", None)
    return list(getattr(router, "routes", []))


def test_owner_routes_still_match(database_url: str, keyring: Keyring) -> None:
    """The owners' routes, now tried after the agents', are all still reached: none of the
    agents' patterns takes an owner's path."""
    app = create_app(settings(database_url, keyring, run_worker=False))
    for method, path in [("GET", "/v1/agents"), ("POST", "/v1/invocations/x/approve"),
                         ("GET", "/v1/tools/weather.get"), ("GET", "/v1/me")]:  # fmt: skip
        matched = [r for r in app.router.routes if r.matches(_scope(method, path))[0] == Match.FULL]
        assert matched, f"no route matches {method} {path}"
        assert _prefix(matched[0]) == "/v1", (method, path, _prefix(matched[0]))  # the owners'


def _prefix(route: Any) -> str | None:
    return getattr(getattr(route, "original_router", None), "prefix", None)
