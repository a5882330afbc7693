"""The embedded PostgreSQL (the pgserver wheel), used when DATABASE_URL is unset."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import psycopg

EMBEDDED_DATABASE = "toolrelay"


def embedded_url(home: Path) -> str:
    """Start (or reuse) the server under ``home/pgdata`` and return a URL to its database."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        # cleanup_mode=None leaves the server running for the next CLI command.
        server = pgserver.get_server(  # type: ignore[attr-defined]
            home / "pgdata", cleanup_mode=None
        )
    base = server.get_uri()
    _ensure_database(base)
    return server.get_uri(EMBEDDED_DATABASE)


def _ensure_database(base_url: str) -> None:
    with psycopg.connect(base_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (EMBEDDED_DATABASE,)
        ).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # created concurrently
                conn.execute(f'CREATE DATABASE "{EMBEDDED_DATABASE}"')
