"""Each fuzz module gets a database of its own: the thousands of calls and registrations
other tests leave in the session's database made every hypothesis example here ten times
slower (2 s a test alone, 20 s after tests/dispatch), and nothing here depends on them."""

from __future__ import annotations

from tests.pgtest import own_database_url, own_db  # noqa: F401 (fixtures)
