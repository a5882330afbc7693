"""Shared fixtures: a real PostgreSQL database, migrated, and owners acting in it."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.pgtest import migrated_database, server_url
from toolrelay.db import Database
from toolrelay.registry import Registry


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    # Not under pytest's tmp: the embedded server runs as its own user and needs to reach it.
    scratch = Path(tempfile.mkdtemp(prefix="toolrelay-pg-"))
    scratch.chmod(0o755)
    yield server_url(scratch)
    shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(admin_url: str) -> Iterator[str]:
    with migrated_database(admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def db(database_url: str) -> Database:
    return Database(database_url)


@pytest.fixture(scope="module", autouse=True)
def no_runnable_call_outlives_its_module(database_url: str) -> Iterator[None]:
    """What a module's tests left runnable goes with the module: the next worker on this
    database (a test's drain, serve's own worker) would send it to upstreams long stopped
    and wait out its retries (20-60 s of the suite each time, before this)."""
    yield
    with psycopg.connect(database_url, autocommit=True) as conn:  # the server's superuser
        conn.execute("DELETE FROM agents.tool_invocations WHERE status = 'running'")


@pytest.fixture
def make_registry(db: Database) -> Callable[[], Registry]:
    """Each call gives a registry for a brand-new owner, so tests never see each other."""
    return lambda: Registry(db, uuid.uuid4())


@pytest.fixture
def registry(make_registry: Callable[[], Registry]) -> Registry:
    return make_registry()
