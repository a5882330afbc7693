"""Connections, with the caller's identity set per transaction (Supabase's convention)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from toolrelay import config
from toolrelay.db.embedded import embedded_url

Row = dict[str, Any]

OWNER_ROLE = "authenticated"
DISPATCHER_ROLE = "service_role"

_SET_IDENTITY = (
    "SELECT set_config('role', %s, true),"
    " set_config('request.jwt.claim.sub', %s, true),"
    " set_config('request.jwt.claims', %s, true)"
)


def resolve_database_url() -> str:
    """DATABASE_URL as given (any libpq form), else the embedded server's."""
    return config.database_url_from_env() or embedded_url(config.home())


class Database:
    """Opens connections to one database; every transaction states who is acting."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or resolve_database_url()

    def connect(self, autocommit: bool = False) -> psycopg.Connection[Row]:
        return psycopg.connect(self.url, autocommit=autocommit, row_factory=dict_row)

    @contextmanager
    def as_owner(
        self, owner: UUID | str, agent_id: UUID | str | None = None
    ) -> Iterator[psycopg.Connection[Row]]:
        """A transaction run as role ``authenticated`` for ``owner`` (and, optionally, an agent)."""
        claims: dict[str, str] = {"sub": str(owner), "role": OWNER_ROLE}
        if agent_id is not None:
            claims["agent_id"] = str(agent_id)
        with self.connect() as conn, conn.transaction():
            conn.execute(_SET_IDENTITY, (OWNER_ROLE, str(owner), json.dumps(claims)))
            yield conn

    @contextmanager
    def as_dispatcher(self) -> Iterator[psycopg.Connection[Row]]:
        """A transaction run as role ``service_role``, the only one that reads ciphertext."""
        with self.connect() as conn, conn.transaction():
            conn.execute(_SET_IDENTITY, (DISPATCHER_ROLE, "", ""))
            yield conn
