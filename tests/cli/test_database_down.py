"""With the database unreachable or DATABASE_URL malformed, every command says so in one
line and exits 2 — no traceback, the password hidden (issue 13, item 3)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid

import pytest
from psycopg import conninfo

PASSWORD = "pw-" + uuid.uuid4().hex[:8]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toolrelay(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"DATABASE_URL": url, "TOOLRELAY_OWNER": str(uuid.uuid4())}
    return subprocess.run(
        [sys.executable, "-m", "toolrelay.cli", *args],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


COMMANDS = [
    ["migrate"],
    ["tool", "list"],
    ["credential", "list"],
    ["invocations", "list"],
    ["approve", "00000000-0000-4000-8000-000000000001"],  # fixed: test ids match across runs
    ["worker", "--drain"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_an_unreachable_database_is_one_line_and_exit_2(command: list[str]) -> None:
    port = closed_port()
    result = toolrelay(f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/x", *command)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        f"error: cannot reach the database at 127.0.0.1:{port}: connection refused"
    )
    assert "is PostgreSQL running?" in line and "postgres:***@" in line
    assert PASSWORD not in result.stderr + result.stdout


def test_a_malformed_url_is_one_line_and_exit_2() -> None:
    result = toolrelay(f"postgresql://postgres:{PASSWORD}@[bad", "tool", "list")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "DATABASE_URL is not a valid PostgreSQL connection string" in line
    assert PASSWORD not in result.stderr


def test_a_database_that_does_not_exist_is_named_in_one_line(admin_url: str) -> None:
    missing = f"toolrelay_missing_{uuid.uuid4().hex[:8]}"
    result = toolrelay(conninfo.make_conninfo(admin_url, dbname=missing), "tool", "list")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f'database "{missing}" does not exist' in line
    assert "fATAL" not in line  # the server's FATAL kept as it says it
