"""Fixtures for the credential store: a fresh database, keys, a service_role pool, HTTP."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from tests.credentials.token_server import TokenServer
from toolrelay.credentials import CredentialResolver, CredentialStore, Keyring, MasterKey
from toolrelay.db import Database, migrate

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def make_keyring(*ids: str) -> Keyring:
    return Keyring(MasterKey(key_id, os.urandom(32)) for key_id in ids)


def keyring_text(keyring: Keyring) -> str:
    return ",".join(f"{k}:{base64.b64encode(keyring.get(k).key).decode()}" for k in keyring.ids)


def _server() -> str:
    return os.environ.get("DATABASE_URL") or DEFAULT_SERVER


@contextmanager
def _scratch_database() -> Iterator[str]:
    """A new database on the test server, migrated, dropped afterwards."""
    name = f"toolrelay_cred_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_server(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = make_conninfo(_server(), dbname=name)
        migrate(url)
        yield url
    finally:
        with psycopg.connect(_server(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def cred_db() -> Iterator[str]:
    """The session's database, shared by tests that only touch their own owners' rows."""
    with _scratch_database() as url:
        yield url


@pytest.fixture
def isolated_db() -> Iterator[str]:
    """A database of its own, for whole-database operations (rewrap, pg_dump)."""
    with _scratch_database() as url:
        yield url


@pytest.fixture
def database(cred_db: str) -> Database:
    return Database(cred_db)


@pytest.fixture
def keyring() -> Keyring:
    # One id per test: tests share a database, where, as in production, one id names one key
    # (a worker judges its key by the other secrets sealed under its id).
    return make_keyring(f"k1-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def store(database: Database, keyring: Keyring) -> CredentialStore:
    return CredentialStore(database, keyring)


@pytest.fixture
def owner_a() -> uuid.UUID:
    return uuid.uuid4()


@pytest.fixture
def owner_b() -> uuid.UUID:
    return uuid.uuid4()


async def _as_service_role(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("SET ROLE service_role")
    if not conn.autocommit:
        await conn.commit()  # a configured connection must be left idle


@asynccontextmanager
async def dispatcher_pool(
    url: str, autocommit: bool = True
) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """What the dispatcher has: connections that already run as service_role."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=6,
        open=False,
        kwargs={"autocommit": autocommit},
        configure=_as_service_role,
    )
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(scope="session")
async def service_pool(cred_db: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with dispatcher_pool(cred_db) as pool:
        yield pool


@pytest.fixture
def resolver(service_pool: AsyncConnectionPool[Any], keyring: Keyring) -> CredentialResolver:
    return CredentialResolver(service_pool, keyring, retry_delays=(0.05, 0.1))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def token_server() -> AsyncIterator[TokenServer]:
    server = TokenServer()
    await server.start()
    yield server
    await server.close()
