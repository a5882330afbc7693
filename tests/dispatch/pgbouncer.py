"""Start PgBouncer in transaction-pooling mode in front of a test database."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import conninfo

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
START_TIMEOUT = 10.0  # seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def available() -> bool:
    return Path(PGBOUNCER).exists()


@contextmanager
def pgbouncer(database_url: str, pool_size: int = 2) -> Iterator[str]:
    """Yield a URL that reaches ``database_url``'s database through PgBouncer."""
    target = conninfo.conninfo_to_dict(database_url)
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="toolrelay-pgbouncer-"))
    scratch.chmod(0o777)
    backend = " ".join(
        f"{k}={target[k]}" for k in ("host", "port", "dbname", "user") if target.get(k)
    )
    (scratch / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"toolrelay = {backend}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\n"
        f"unix_socket_dir = {scratch}\n"
        "auth_type = any\npool_mode = transaction\n"
        f"default_pool_size = {pool_size}\nmax_client_conn = 200\n"
        f"logfile = {scratch}/pgbouncer.log\npidfile = {scratch}/pgbouncer.pid\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    proc = subprocess.Popen(
        [PGBOUNCER, "-u", _run_as(target.get("host")), str(scratch / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"postgresql://{target.get('user') or 'postgres'}@127.0.0.1:{port}/toolrelay"
    try:
        _wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=START_TIMEOUT)
        shutil.rmtree(scratch, ignore_errors=True)


def _run_as(host: str | None) -> str:
    """The account PgBouncer drops to (it refuses to run as root).

    The server's own account when it is reached by a socket directory (the embedded
    server's is private to the account that runs it); else ``postgres``.
    """
    if host and host.startswith("/") and Path(host).is_dir():
        return Path(host).owner()
    return "postgres"


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            with psycopg.connect(url, connect_timeout=1) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.OperationalError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
