"""A tenant's members and their roles (issue 16; migration 0025, docs/approvals.md).

Roles are checked by the database on every change, whichever door it comes through; this
module only calls the functions that do it (fn_add_member, fn_set_member_role,
fn_remove_member) and reads ``agents.members`` as the caller.
"""

from __future__ import annotations

import builtins
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from uuid import UUID

import psycopg

from toolrelay.db import Database
from toolrelay.db.connect import Row
from toolrelay.errors import InvalidArgument, NotFound
from toolrelay.tokens import Acting, as_acting, insert_token, new_token

__all__ = ["ROLES", "Member", "Members"]

ROLES: Final = ("admin", "approver", "viewer")
_COLUMNS: Final = "id, name, email, role, created_at, removed_at"


@dataclass(frozen=True)
class Member:
    id: UUID
    name: str
    email: str | None
    role: str
    created_at: datetime
    removed_at: datetime | None


class Members:
    """List, add, change and remove a tenant's members, as ``who`` (the tenant or a member)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def list(self, who: Acting, include_removed: bool = False) -> builtins.list[Member]:
        removed = "" if include_removed else "WHERE removed_at IS NULL"
        with self._as(who) as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM agents.members {removed} ORDER BY created_at, id"
            ).fetchall()
        return [Member(**row) for row in rows]

    def get(self, who: Acting, member_id: UUID) -> Member:
        with self._as(who) as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM agents.members WHERE id = %s", (member_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"member {member_id} not found")
        return Member(**row)

    def add(self, who: Acting, name: str, role: str, email: str | None = None) -> Member:
        return self._add(who, name, role, email, token=None)

    def invite(
        self, who: Acting, name: str, role: str, email: str | None = None
    ) -> tuple[Member, str]:
        """A new member and a token for them (shown once, as every token), in one
        transaction: no member without its token."""
        token = new_token()
        return self._add(who, name, role, email, token), token

    def _add(
        self, who: Acting, name: str, role: str, email: str | None, token: str | None
    ) -> Member:
        _check_role(role)
        with self._as(who) as conn:
            row = conn.execute(
                "SELECT fn_add_member(%s, %s, %s) AS id", (name, role, email)
            ).fetchone()
            assert row is not None
            if token is not None:
                insert_token(conn, token, name=name, member_id=row["id"])
            added = conn.execute(
                f"SELECT {_COLUMNS} FROM agents.members WHERE id = %s", (row["id"],)
            ).fetchone()
        assert added is not None
        return Member(**added)

    def set_role(self, who: Acting, member_id: UUID, role: str) -> Member:
        return self.change(who, member_id, role=role)

    def change(
        self,
        who: Acting,
        member_id: UUID,
        role: str | None = None,
        email: str | None = None,
        set_email: bool = False,
    ) -> Member:
        """A new role and/or email (None with ``set_email``: none) in one transaction. A new
        email unbinds the member's sign-in: the next verified sign-in with it binds anew."""
        if role is not None:
            _check_role(role)
        with self._as(who) as conn:
            if role is not None:
                conn.execute("SELECT fn_set_member_role(%s, %s)", (member_id, role))
            if set_email:
                conn.execute("SELECT fn_set_member_email(%s, %s)", (member_id, email))
        return self.get(who, member_id)

    def remove(self, who: Acting, member_id: UUID) -> bool:
        """True when this call removed the member (and revoked its tokens), False when it
        already was removed; NotFound otherwise."""
        with self._as(who) as conn:
            row = conn.execute("SELECT fn_remove_member(%s) AS done", (member_id,)).fetchone()
        assert row is not None
        return bool(row["done"])

    def role_of(self, who: Acting) -> str | None:
        """The caller's role now ('admin', 'approver', 'viewer'); None: not a member."""
        with self._as(who) as conn:
            row = conn.execute("SELECT agents.caller_member_role() AS role").fetchone()
        assert row is not None
        return row["role"] if row["role"] in ROLES else None

    def _as(self, who: Acting) -> AbstractContextManager[psycopg.Connection[Row]]:
        return as_acting(self._db, who)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise InvalidArgument(f"role must be one of {', '.join(ROLES)}, got {role!r}")
