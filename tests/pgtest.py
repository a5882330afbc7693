"""Fresh throwaway databases for tests: on DATABASE_URL's server, or an embedded one."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from toolrelay.db import Database, migrate


def server_url(scratch: Path) -> str:
    """The admin URL of the server tests run against."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return url
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(scratch / "pgdata", cleanup_mode="stop")
    return str(server.get_uri())


def create_database(admin_url: str, prefix: str = "toolrelay_test") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return conninfo.make_conninfo(admin_url, dbname=name)


def drop_database(admin_url: str, url: str) -> None:
    name = conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def migrated_database(admin_url: str) -> Iterator[str]:
    """A new database on ``admin_url``'s server, migrated; dropped afterwards."""
    url = create_database(admin_url)
    migrate(url)
    try:
        yield url
    finally:
        drop_database(admin_url, url)


# A test module that wants a database of its own imports these two (they override the
# session's fixtures of the same names there): `from tests.pgtest import own_database_url`.
@pytest.fixture(scope="module", name="database_url")
def own_database_url(admin_url: str) -> Iterator[str]:
    with migrated_database(admin_url) as url:
        yield url


@pytest.fixture(scope="module", name="db")
def own_db(database_url: str) -> Database:
    return Database(database_url)
