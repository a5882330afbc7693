"""`toolrelay db status|stop|url` (issue 13, item 9): the embedded PostgreSQL every command
leaves running can be seen, reached with libpq and stopped; an external one never is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner, Result

from toolrelay.cli import context
from toolrelay.cli.db import data_dir
from toolrelay.cli.main import app

TOOLRELAY = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "toolrelay")
runner = CliRunner()


def invoke(*args: str) -> Result:
    return runner.invoke(app, list(args))


def status() -> dict[str, Any]:
    result = invoke("db", "status", "-o", "json")
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


@pytest.fixture
def embedded_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh TOOLRELAY_HOME with DATABASE_URL unset: the embedded server, as a new user
    has it. Not under pytest's tmp: as root the server runs as its own user (see
    tests/conftest.py), so the directory must be readable by others."""
    home = Path(tempfile.mkdtemp(prefix="toolrelay-db-"))
    home.chmod(0o755)
    monkeypatch.setenv("TOOLRELAY_HOME", str(home))
    for name in ("DATABASE_URL", "TOOLRELAY_OWNER", "TOOLRELAY_MASTER_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    context.database.cache_clear()
    try:
        yield home
    finally:
        invoke("db", "stop")  # also forgets this process's handle and pool
        context.database.cache_clear()
        shutil.rmtree(home, ignore_errors=True)


def test_status_url_and_stop_on_the_embedded_server(embedded_home: Path) -> None:
    before = status()
    assert (before["kind"], before["running"], before["url"]) == ("embedded", False, None)
    assert before["data_dir"] == str((embedded_home / "pgdata").resolve()) == str(data_dir())
    assert not (embedded_home / "pgdata" / "PG_VERSION").exists()  # status starts nothing

    assert invoke("tool", "list").exit_code == 0  # any command starts it, and leaves it up
    running = status()
    assert running["running"] is True and isinstance(running["pid"], int)
    assert running["version"].startswith("16") and running["size_bytes"] > 1_000_000
    assert running["started_at"].endswith("Z") and running["error"] is None
    table = invoke("db", "status").stdout
    assert "embedded" in table and "yes" in table and str(data_dir()) in table

    url = invoke("db", "url")
    assert url.exit_code == 0, url.output
    assert url.stdout.strip() == running["url"] and ":@" not in url.stdout  # no empty password
    with psycopg.connect(url.stdout.strip()) as conn:  # libpq, as psql uses it
        row = conn.execute("SELECT current_database(), current_user").fetchone()
    assert row == ("toolrelay", "postgres")

    stopped = invoke("db", "stop")
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.startswith("stopped the embedded database")
    after = status()
    assert (after["running"], after["pid"], after["url"]) == (False, None, None)
    assert after["version"] == "16"  # the data directory's, with the server down
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url.stdout.strip(), connect_timeout=3).close()
    again = invoke("db", "stop")
    assert again.exit_code == 0 and "not running" in again.stdout

    # a new process sees it stopped, and the next command (here, in this one) starts it
    seen = subprocess.run([TOOLRELAY, "db", "status", "-o", "json"], capture_output=True,
                          text=True, env={**os.environ}, timeout=60)  # fmt: skip
    assert seen.returncode == 0 and json.loads(seen.stdout)["running"] is False
    made = invoke("agent", "create", "after-restart")
    assert made.exit_code == 0, made.output
    assert status()["running"] is True
    assert "after-restart" in invoke("agent", "list").stdout  # nothing was lost
    assert invoke("db", "url").stdout.strip() == url.stdout.strip()


def test_url_starts_a_stopped_server(embedded_home: Path) -> None:
    url = invoke("db", "url")
    assert url.exit_code == 0, url.output
    assert status()["running"] is True
    with psycopg.connect(url.stdout.strip()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_an_external_database_is_shown_never_stopped(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    shown = status()
    assert (shown["kind"], shown["running"], shown["data_dir"]) == ("external", True, None)
    assert shown["version"] and shown["size_bytes"] > 0 and shown["error"] is None
    refused = invoke("db", "stop")
    assert refused.exit_code == 1
    assert "is not toolrelay's embedded one" in refused.stderr
    assert refused.stderr.count("\n") == 1

    secret = f"pw-{uuid.uuid4().hex}"
    down = f"postgresql://someone:{secret}@127.0.0.1:1/nowhere"  # nothing listens on port 1
    monkeypatch.setenv("DATABASE_URL", down)
    url = invoke("db", "url")
    assert url.exit_code == 0
    [shown_url] = url.stdout.splitlines()
    assert shown_url.startswith("postgresql://someone:") and shown_url.endswith(
        "@127.0.0.1:1/nowhere"
    )
    assert "password hidden" in url.stderr
    unreachable = status()
    assert unreachable["running"] is False and "127.0.0.1:1" in unreachable["error"]
    refused = invoke("db", "stop")
    assert refused.exit_code == 1
    for result in (url, refused, invoke("db", "status"), invoke("db", "status", "-o", "json")):
        assert secret not in result.output
