"""Pages of invocations, newest first, for every door (the HTTP API and the CLI): one cursor
format, so a cursor one of them hands out is one the other takes."""

from __future__ import annotations

import base64
from datetime import datetime
from uuid import UUID

from toolrelay.db.connect import Row
from toolrelay.errors import InvalidArgument
from toolrelay.registry.service import Registry


def encode_cursor(row: Row) -> str:
    """The position just after ``row``: its (created_at, id), opaque to the caller."""
    raw = f"{row['created_at'].isoformat()}|{row['id']}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, _, ident = raw.partition("|")
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None:
            raise ValueError("naive time")
        return when, UUID(ident)
    except ValueError:
        raise InvalidArgument(
            "cursor is not one toolrelay handed out (pass next_cursor of the previous page)"
        ) from None


def invocation_page(
    registry: Registry,
    limit: int,
    *,
    cursor: str | None = None,
    status: str | None = None,
    tool: str | None = None,
    agent: str | None = None,
    since: datetime | None = None,
) -> tuple[list[Row], str | None]:
    """Up to ``limit`` invocations after ``cursor`` (newest first) and the cursor of the next
    page (None at the end), by ``Registry.list_invocations``.

    ``since`` keeps those created at or after it: rows come newest first, so they are a
    prefix of what the query returns, and the first older row ends the listing.
    """
    before = decode_cursor(cursor) if cursor else None
    rows = registry.list_invocations(status, limit + 1, tool=tool, agent=agent, before=before)
    if since is not None:
        rows = [row for row in rows if row["created_at"] >= since]
    page = rows[:limit]
    return page, encode_cursor(page[-1]) if len(rows) > limit else None
