"""The run's own database: created fresh, restarted on purpose, dumped, dropped."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

from toolrelay.errors import ConfigurationError

RESTART_TIMEOUT = 60.0  # seconds for the server to accept connections again


@dataclass
class Server:
    """Where the run's database lives, and how to restart that server."""

    admin_url: str
    embedded: Any = None  # a pgserver.PostgresServer when embedded
    scratch: Path | None = None

    @classmethod
    def open(cls, url: str | None) -> Server:
        if url:
            return cls(admin_url=url)
        scratch = Path(tempfile.mkdtemp(prefix="toolrelay-chaos-pg-"))
        scratch.chmod(0o755)  # the embedded server runs as its own user when we are root
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver

            server = pgserver.get_server(  # type: ignore[attr-defined]
                scratch / "pgdata", cleanup_mode="stop"
            )
        return cls(admin_url=str(server.get_uri()), embedded=server, scratch=scratch)

    def close(self) -> None:
        if self.embedded is not None:
            self.embedded.cleanup()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def create_database(self) -> str:
        name = f"toolrelay_chaos_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return conninfo.make_conninfo(self.admin_url, dbname=name)

    def drop_database(self, url: str) -> None:
        name = str(conninfo.conninfo_to_dict(url)["dbname"])
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    # --- restart -------------------------------------------------------------------------

    def restart_command(self) -> list[str]:
        """The command that restarts this server; ConfigurationError when we cannot."""
        if self.embedded is not None:
            return [
                str(_embedded_bin() / "pg_ctl"),
                "-D",
                str(self.embedded.pgdata),
                "-l",
                str(self.embedded.log),
                "-m",
                "fast",
                "-w",
                "restart",
            ]
        params = conninfo.conninfo_to_dict(self.admin_url)
        host = str(params.get("host") or "")
        port = int(str(params.get("port") or 5432))
        local = host in ("", "localhost", "127.0.0.1", "::1") or host.startswith("/")
        if not local or shutil.which("pg_lsclusters") is None:
            raise ConfigurationError(
                "--db-restart needs the embedded server or a local Debian/Ubuntu cluster"
                " (pg_ctlcluster); this server is neither"
            )
        listing = subprocess.run(
            ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
        ).stdout
        for line in listing.splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2] == str(port):
                # pg_ctlcluster's restart stops in "fast" mode: sessions are cut off.
                cmd = ["pg_ctlcluster", "--skip-systemctl-redirect"]
                return [*cmd, fields[0], fields[1], "restart"]
        raise ConfigurationError(f"--db-restart: no local cluster listens on port {port}")

    def restart(self) -> float:
        """Restart the server; returns the seconds until it accepted connections again."""
        command = self.restart_command()
        started = time.monotonic()
        user = getattr(self.embedded, "system_user", None) if self.embedded else None
        subprocess.run(
            command,
            check=True,
            capture_output=True,
            timeout=RESTART_TIMEOUT,
            user=user,
            cwd="/",
        )
        deadline = started + RESTART_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.admin_url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return time.monotonic() - started
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise ConfigurationError("the database did not come back after the restart")

    # --- dump ----------------------------------------------------------------------------

    def pg_dump(self, url: str) -> str:
        """A plain-text dump of the run's database, by a pg_dump not older than the server."""
        with psycopg.connect(url) as conn:
            server_major = conn.info.server_version // 10000
        for binary in self._pg_dump_candidates():
            if _major(binary) >= server_major:
                return subprocess.run(
                    [binary, "--no-owner", "-d", url],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=os.environ | {"PGCONNECT_TIMEOUT": "10"},
                ).stdout
        raise ConfigurationError(f"no pg_dump for PostgreSQL {server_major} was found")

    def _pg_dump_candidates(self) -> list[str]:
        found = [shutil.which("pg_dump"), str(_embedded_bin() / "pg_dump")]
        return [f for f in found if f and Path(f).exists()]

    def server_version(self) -> str:
        with psycopg.connect(self.admin_url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


def _embedded_bin() -> Path:
    """The embedded server's binaries (pgserver warns on import; that is noise here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


def _major(binary: str) -> int:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return 0
    match = re.search(r"(\d+)(?:\.\d+)?", out)
    return int(match.group(1)) if match else 0
