"""The audit log of configuration (migration 0023), read as the owner, for every door.

Rows come newest first, a page at a time; a page ends at a (at, id) position, which the next
page starts after (keyset pagination, so pages stay put while rows are added). What a row
holds and what it never holds: docs/audit.md.
"""

from __future__ import annotations

import base64
from datetime import datetime
from uuid import UUID

import psycopg

from toolrelay.db import translate_db_error
from toolrelay.db.connect import Row
from toolrelay.errors import InvalidArgument
from toolrelay.registry.fields import check_limit
from toolrelay.registry.service import Registry

# The kinds the triggers of migration 0023 write; a table audited later adds its own here.
AUDIT_KINDS = (
    "agent", "assignment", "credential", "member", "policy", "policy_confirmation", "token",
    "tool", "webhook",
)  # fmt: skip
AUDIT_PAGE_MOST = 200  # rows per page at most
DEFAULT_AUDIT_LIMIT = 50

_AUDIT = """
SELECT id, at, actor, actor_member, actor_role, session_role, xact_id, kind, object_id,
       object_label, action, changes
  FROM agents.config_audit
 WHERE owner = %(owner)s
   AND (%(since)s::timestamptz IS NULL OR at >= %(since)s)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s)
   AND (%(object_id)s::uuid IS NULL OR object_id = %(object_id)s)
   AND (%(object_label)s::text IS NULL OR object_label = %(object_label)s)
   AND (%(before_at)s::timestamptz IS NULL OR (at, id) < (%(before_at)s, %(before_id)s::bigint))
 ORDER BY at DESC, id DESC
 LIMIT %(limit)s
"""


def read_audit(
    registry: Registry,
    *,
    since: datetime | None = None,
    kind: str | None = None,
    object: str | None = None,
    limit: int = DEFAULT_AUDIT_LIMIT,
    before: tuple[datetime, int] | None = None,
) -> list[Row]:
    """The owner's audit rows, newest first: changed at or after ``since``, of ``kind``,
    about ``object`` (an id, or a tool key, agent name, credential or token name as it was
    then), older than ``before`` (the (at, id) of the previous page's last row).

    Row-level security decides what is seen: an agent identity sees nothing."""
    check_limit(limit, AUDIT_PAGE_MOST + 1)
    if kind is not None and kind not in AUDIT_KINDS:
        raise InvalidArgument(f"kind {kind!r} is not one of {', '.join(AUDIT_KINDS)}")
    if since is not None and since.tzinfo is None:
        raise InvalidArgument("since must carry a time zone")
    object_id = _as_uuid(object)
    params = {
        "owner": registry.owner,
        "since": since,
        "kind": kind,
        "object_id": object_id,
        "object_label": object if object is not None and object_id is None else None,
        "before_at": before[0] if before else None,
        "before_id": before[1] if before else None,
        "limit": limit,
    }
    try:
        with registry.db.as_owner(registry.owner, registry.agent_id, registry.member_id) as conn:
            return conn.execute(_AUDIT, params).fetchall()
    except psycopg.Error as exc:
        raise translate_db_error(exc) from None


def audit_page(
    registry: Registry,
    limit: int = DEFAULT_AUDIT_LIMIT,
    *,
    cursor: str | None = None,
    since: datetime | None = None,
    kind: str | None = None,
    object: str | None = None,
) -> tuple[list[Row], str | None]:
    """Up to ``limit`` rows after ``cursor`` and the cursor of the next page (None at the
    end): the same cursors for the CLI and the HTTP API."""
    check_limit(limit, AUDIT_PAGE_MOST)
    before = decode_audit_cursor(cursor) if cursor else None
    rows = read_audit(
        registry, since=since, kind=kind, object=object, limit=limit + 1, before=before
    )
    page = rows[:limit]
    return page, encode_audit_cursor(page[-1]) if len(rows) > limit else None


def encode_audit_cursor(row: Row) -> str:
    """The position just after ``row``: its (at, id), opaque to the caller."""
    raw = f"audit|{row['at'].isoformat()}|{row['id']}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_audit_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, at, ident = raw.split("|")
        when = datetime.fromisoformat(at)
        if tag != "audit" or when.tzinfo is None:
            raise ValueError("not an audit cursor")
        return when, int(ident)
    except ValueError:
        raise InvalidArgument(
            "cursor is not one the audit log handed out (pass next_cursor of the previous page)"
        ) from None


def _as_uuid(value: str | None) -> UUID | None:
    if value is None:
        return None
    try:
        return UUID(value)
    except ValueError:
        return None
