"""The owner's side of the credential store (sync): add, list, rotate, delete; and rewrap.

Owners write ciphertext but read metadata only (the grants enforce it), so every SELECT
here names its columns.
"""

from __future__ import annotations

import builtins
import logging
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from toolrelay.credentials import crypto
from toolrelay.credentials.formats import (
    KINDS,
    OAuthSecret,
    decode_secret,
    encode_secret,
    parse_secret,
)
from toolrelay.credentials.hosts import normalize_host_entry
from toolrelay.credentials.keys import Keyring
from toolrelay.db import Database, translated
from toolrelay.db.connect import Row
from toolrelay.errors import (
    ConfigurationError,
    Conflict,
    CredentialError,
    InvalidArgument,
    NotFound,
)
from toolrelay.tokens import Acting, acting_as

__all__ = ["CredentialInfo", "CredentialStore"]

log = logging.getLogger(__name__)

_INFO = "id, name, kind, allowed_hosts, status, created_at, rotated_at, last_used_at, expires_at"


@dataclass(frozen=True)
class CredentialInfo:
    """Metadata only: what an owner may see."""

    id: UUID
    name: str
    kind: str
    allowed_hosts: list[str]
    status: str
    created_at: datetime
    rotated_at: datetime | None
    last_used_at: datetime | None
    expires_at: datetime | None

    @property
    def reconnect(self) -> str | None:
        """Where a person signs in again, for an oauth credential that needs it (the page's
        Reconnect; the API's POST /v1/credentials/connect {credential}; the CLI's
        `credential connect --reconnect ID`)."""
        if self.kind == "oauth" and self.status == "needs_reauth":
            return f"/approvals/credentials#credential-{self.id}"
        return None


class CredentialStore:
    """Owner operations, each one transaction run as the owner (RLS applies)."""

    def __init__(self, db: Database, keyring: Keyring | None = None) -> None:
        self._db = db
        self._keyring = keyring

    def add(
        self,
        who: Acting,
        kind: str,
        name: str,
        secret: str,
        allowed_hosts: Iterable[str] | None = None,
    ) -> UUID:
        if kind not in KINDS:
            raise InvalidArgument(
                f"unknown credential kind {kind!r}; use one of {', '.join(KINDS)}"
            )
        owner, _ = acting_as(who)
        hosts = _hosts(allowed_hosts or ())
        parsed = parse_secret(kind, secret)
        credential_id = uuid.uuid4()  # chosen here: the associated data binds it
        ident = crypto.CredentialIdentity(credential_id, owner, kind)
        env = crypto.seal(self._require_keyring(), ident, encode_secret(parsed.secret))
        with self._as_owner(who) as conn:
            conn.execute(
                "INSERT INTO agents.credentials (id, owner, name, kind, allowed_hosts, key_id,"
                " wrapped_key, nonce, ciphertext, expires_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    credential_id,
                    owner,
                    name,
                    kind,
                    hosts,
                    env.key_id,
                    env.wrapped_key,
                    env.nonce,
                    env.ciphertext,
                    parsed.expires_at,
                ),
            )
        log.info("credential %s (%s) added", credential_id, kind)
        return credential_id

    def get(self, owner: Acting, credential_id: UUID) -> CredentialInfo:
        with self._as_owner(owner) as conn:
            return CredentialInfo(**_owned(conn, credential_id, _INFO))

    def list(self, owner: Acting) -> builtins.list[CredentialInfo]:
        with self._as_owner(owner) as conn:
            rows = conn.execute(
                f"SELECT {_INFO} FROM agents.credentials WHERE owner = %s ORDER BY name",
                (acting_as(owner)[0],),
            ).fetchall()
        return [CredentialInfo(**row) for row in rows]

    def rotate(self, owner: Acting, credential_id: UUID, secret: str) -> None:
        """A new secret under the same id; the credential becomes active again."""
        keyring = self._require_keyring()
        with self._as_owner(owner) as conn:
            row = _owned(conn, credential_id, "id, owner, kind")
            parsed = parse_secret(row["kind"], secret)
            ident = crypto.CredentialIdentity(row["id"], row["owner"], row["kind"])
            env = crypto.seal(keyring, ident, encode_secret(parsed.secret))
            conn.execute(
                "UPDATE agents.credentials SET key_id = %s, wrapped_key = %s, nonce = %s,"
                " ciphertext = %s, expires_at = %s, status = 'active', rotated_at = now()"
                " WHERE id = %s",
                (
                    env.key_id,
                    env.wrapped_key,
                    env.nonce,
                    env.ciphertext,
                    parsed.expires_at,
                    credential_id,
                ),
            )
        log.info("credential %s rotated", credential_id)

    def oauth_client(self, who: Acting, credential_id: UUID) -> OAuthSecret:
        """The OAuth client an ``oauth`` credential was made with (id, secret, token URL,
        scope), for reconnecting it: found as ``who`` (theirs, or NotFound), read as the
        dispatcher (owners never read ciphertext), and never returned past this process."""
        with self._as_owner(who) as conn:
            row = _owned(conn, credential_id, "id, kind")
        if row["kind"] != "oauth":
            raise InvalidArgument(f"credential {credential_id} is {row['kind']}, not oauth")
        with translated(), self._db.as_dispatcher() as conn:
            full = conn.execute(
                "SELECT id, owner, kind, key_id, wrapped_key, nonce, ciphertext"
                " FROM agents.credentials WHERE id = %s",
                (credential_id,),
            ).fetchone()
        assert full is not None
        env = crypto.Envelope(full["key_id"], bytes(full["wrapped_key"]), bytes(full["nonce"]),
                              bytes(full["ciphertext"]))  # fmt: skip
        ident = crypto.CredentialIdentity(full["id"], full["owner"], full["kind"])
        secret = decode_secret("oauth", crypto.unseal(self._require_keyring(), ident, env))
        assert isinstance(secret, OAuthSecret)
        return secret

    def set_hosts(self, owner: Acting, credential_id: UUID, hosts: Iterable[str]) -> None:
        """Replace the hosts the credential may be sent to (empty: bind on first tool)."""
        normalized = _hosts(hosts)
        with self._as_owner(owner) as conn:
            _owned(conn, credential_id, "id")
            conn.execute(
                "UPDATE agents.credentials SET allowed_hosts = %s WHERE id = %s",
                (normalized, credential_id),
            )

    def delete(self, owner: Acting, credential_id: UUID, force: bool = False) -> builtins.list[str]:
        """Delete; refused while tools use it unless ``force``, which unbinds them.

        Returns the keys of the tools that were unbound.
        """
        with self._as_owner(owner) as conn:
            row = _owned(conn, credential_id, "id, name")
            tools = [
                r["key"]
                for r in conn.execute(
                    "SELECT key FROM agents.tools_registry WHERE credential_ref = %s ORDER BY key",
                    (credential_id,),
                )
            ]
            if tools and not force:
                raise Conflict(
                    f"credential {row['name']!r} is used by tool(s) {', '.join(tools)}; "
                    "unbind them first, or delete with force (--force) to set their "
                    "credential_ref to NULL"
                )
            if tools:
                conn.execute(
                    "UPDATE agents.tools_registry SET credential_ref = NULL"
                    " WHERE credential_ref = %s",
                    (credential_id,),
                )
            conn.execute("DELETE FROM agents.credentials WHERE id = %s", (credential_id,))
        log.info("credential %s deleted (%d tool(s) unbound)", credential_id, len(tools))
        return tools

    def rewrap(self) -> int:
        """Re-wrap every data key not under the newest master key; return how many.

        All or nothing: a data key under an unknown master key aborts the whole run.
        """
        keyring = self._require_keyring()
        newest = keyring.newest.id
        with translated(), self._db.as_dispatcher() as conn:
            rows = conn.execute(
                "SELECT id, owner, kind, key_id, wrapped_key FROM agents.credentials"
                " WHERE key_id <> %s ORDER BY id FOR UPDATE",
                (newest,),
            ).fetchall()
            for row in rows:
                ident = crypto.CredentialIdentity(row["id"], row["owner"], row["kind"])
                old = crypto.Envelope(row["key_id"], bytes(row["wrapped_key"]), b"", b"")
                try:
                    new = crypto.rewrap(keyring, ident, old)
                except CredentialError as exc:
                    raise CredentialError(
                        f"rewrap stopped at credential {row['id']}, nothing changed: {exc.message}"
                    ) from None
                conn.execute(
                    "UPDATE agents.credentials SET key_id = %s, wrapped_key = %s WHERE id = %s",
                    (new.key_id, new.wrapped_key, row["id"]),
                )
        log.info("rewrapped %d credential data key(s) under master key %r", len(rows), newest)
        return len(rows)

    def _require_keyring(self) -> Keyring:
        if self._keyring is None:
            raise ConfigurationError("this operation needs a master key; none is configured")
        return self._keyring

    @contextmanager
    def _as_owner(self, who: Acting) -> Iterator[psycopg.Connection[Row]]:
        owner, member = acting_as(who)
        with translated(), self._db.as_owner(owner, member_id=member) as conn:
            yield conn


def _owned(conn: psycopg.Connection[Row], credential_id: UUID, columns: str) -> Row:
    row = conn.execute(
        f"SELECT {columns} FROM agents.credentials WHERE id = %s", (credential_id,)
    ).fetchone()
    if row is None:  # absent or another owner's: the same answer
        raise NotFound(f"credential {credential_id} not found")
    return row


def _hosts(entries: Iterable[str]) -> builtins.list[str]:
    seen: dict[str, None] = {}
    for entry in entries:
        seen[normalize_host_entry(entry)] = None
    return builtins.list(seen)
