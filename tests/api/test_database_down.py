"""`toolrelay serve` with its database gone: 503 database_unavailable within 2 s, /healthz
says so, and both recover when the database returns (issue 13, item 3)."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import settings
from tests.api.servers import serve_app
from toolrelay.api.app import create_app
from toolrelay.db import Database, migrate
from toolrelay.tokens import TokenStore

ANSWERS_WITHIN = 2.0  # seconds


@pytest.fixture
def private_server() -> Iterator[Any]:
    """A PostgreSQL of this test's own (the pgserver wheel): stopping it disturbs no one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    scratch = Path(tempfile.mkdtemp(prefix="toolrelay-down-"))
    scratch.chmod(0o755)
    server = pgserver.get_server(scratch / "pgdata", cleanup_mode="stop")  # type: ignore[attr-defined]
    yield server
    server.cleanup()
    shutil.rmtree(scratch, ignore_errors=True)


def pg_ctl(server: Any, *args: str) -> None:
    from pgserver._commands import pg_ctl as run

    run(["-w", *args], pgdata=server.pgdata, user=server.system_user)


def start_again(server: Any) -> None:
    """Started as pgserver starts it: its socket in the data directory, no TCP."""
    pg_ctl(server, "-o", '-h ""', "-o", f"-k {server.pgdata}", "-l", str(server.log), "start")


def test_serve_answers_503_fast_while_the_database_is_down_then_recovers(
    private_server: Any,
) -> None:
    url = private_server.get_uri()
    migrate(url)
    _, token = TokenStore(Database(url)).create(uuid.uuid4())
    auth = {"Authorization": f"Bearer {token}"}
    with serve_app(create_app(settings(url, None, run_worker=False))) as api:
        assert httpx.get(f"{api}/v1/tools", headers=auth).status_code == 200
        assert httpx.get(f"{api}/healthz").json() == {"status": "ok", "database": "ok"}

        pg_ctl(private_server, "-m", "fast", "stop")
        started = time.monotonic()
        down = httpx.get(f"{api}/v1/tools", headers=auth, timeout=30)
        took = time.monotonic() - started
        assert down.status_code == 503, down.text
        assert down.json()["error"]["code"] == "database_unavailable"
        assert down.headers["Retry-After"] == "1"
        assert took < ANSWERS_WITHIN
        health = httpx.get(f"{api}/healthz", timeout=30)
        assert (health.status_code, health.json()["database"]) == (503, "unavailable")

        start_again(private_server)
        assert httpx.get(f"{api}/v1/tools", headers=auth).status_code == 200
        assert httpx.get(f"{api}/healthz").json()["database"] == "ok"
