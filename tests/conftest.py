"""Shared fixtures: a real PostgreSQL database, migrated, and owners acting in it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.pgtest import create_database, drop_database, server_url
from toolrelay.db import Database, migrate
from toolrelay.registry import Registry


@pytest.fixture(scope="session")
def admin_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return server_url(Path(tmp_path_factory.mktemp("embedded")))


@pytest.fixture(scope="session")
def database_url(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url)
    migrate(url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="session")
def db(database_url: str) -> Database:
    return Database(database_url)


@pytest.fixture
def make_registry(db: Database) -> Callable[[], Registry]:
    """Each call gives a registry for a brand-new owner, so tests never see each other."""
    return lambda: Registry(db, uuid.uuid4())


@pytest.fixture
def registry(make_registry: Callable[[], Registry]) -> Registry:
    return make_registry()
