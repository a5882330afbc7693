"""Retention: keep invocation history bounded without touching anything runnable."""

from __future__ import annotations

import psycopg

from toolrelay.db import Database, translate_db_error
from toolrelay.db.queries import load

PRUNE_BATCH = 10_000  # rows per statement: short transactions, no long locks


def prune(db: Database, older_than: str, batch: int = PRUNE_BATCH) -> int:
    """Delete finished invocations older than ``older_than`` (a PostgreSQL interval)."""
    query = load("dispatch")["prune"]
    total = 0
    try:
        with db.connect(autocommit=True) as conn:
            conn.execute("SET ROLE service_role")
            while True:
                deleted = conn.execute(query, {"older_than": older_than, "batch": batch}).rowcount
                total += deleted
                if deleted < batch:
                    return total
    except psycopg.errors.InvalidDatetimeFormat:
        from toolrelay.errors import InvalidArgument

        raise InvalidArgument(
            f"--older-than must be a duration like 30d, 12h or '2 weeks': {older_than!r}"
        ) from None
    except psycopg.Error as exc:
        raise translate_db_error(exc) from None
