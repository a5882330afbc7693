"""/mcp skips FastAPI's route matching (McpShortcut) but not the middleware around it: the
body-size limit and the access log still apply, and every other path is routed as before."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import httpx2
import pytest

from tests.api.conftest import settings
from tests.api.servers import serve_app
from toolrelay.api import create_app
from toolrelay.credentials import Keyring

LIMIT = 4096


@pytest.fixture(scope="module")
def small_limit_url(database_url: str, mcp_keyring: Keyring) -> Iterator[str]:
    app = create_app(settings(database_url, mcp_keyring, max_body_bytes=LIMIT, run_worker=False))
    with serve_app(app) as url:
        yield url


def test_the_body_limit_applies_to_mcp(small_limit_url: str) -> None:
    big = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"x": "'
        + (b"a" * (LIMIT + 1))
        + b'"}}'
    )
    response = httpx2.post(
        f"{small_limit_url}/mcp", content=big, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413


class _Lines(logging.Handler):
    """Access lines as they are logged; ``wanted`` set once the expected one arrives."""

    def __init__(self, expected: str) -> None:
        super().__init__(logging.INFO)
        self.expected, self.wanted = expected, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == self.expected:
            self.wanted.set()


def test_mcp_requests_are_in_the_access_log(small_limit_url: str) -> None:
    access = logging.getLogger("uvicorn.access")
    lines, level = _Lines("POST /mcp 401"), access.level
    access.addHandler(lines)
    access.setLevel(logging.INFO)
    try:
        response = httpx2.post(f"{small_limit_url}/mcp", json={"jsonrpc": "2.0", "id": 1})
        assert response.status_code == 401  # no token: refused by the endpoint itself
        # The line is written once the answer has gone out: wait for it, not for a time.
        assert lines.wanted.wait(10.0)
    finally:
        access.removeHandler(lines)
        access.setLevel(level)


def test_other_paths_are_routed_as_before(small_limit_url: str) -> None:
    assert httpx2.get(f"{small_limit_url}/healthz").status_code == 200
    slash = httpx2.get(f"{small_limit_url}/mcp/")  # the router's redirect, as before
    assert (slash.status_code, slash.headers["location"]) == (307, f"{small_limit_url}/mcp")
    assert httpx2.get(f"{small_limit_url}/v1/tools").status_code == 401
