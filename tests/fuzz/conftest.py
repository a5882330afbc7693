"""Each fuzz module gets a database of its own: the thousands of calls and registrations
other tests leave in the session's database made every hypothesis example here ten times
slower (2 s a test alone, 20 s after tests/dispatch), and nothing here depends on them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pgtest import migrated_database
from toolrelay.db import Database


@pytest.fixture(scope="module")
def database_url(admin_url: str) -> Iterator[str]:
    with migrated_database(admin_url) as url:
        yield url


@pytest.fixture(scope="module")
def db(database_url: str) -> Database:
    return Database(database_url)
