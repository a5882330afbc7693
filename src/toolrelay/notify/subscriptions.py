"""The owner's side of webhooks (sync): subscribe, list, remove, rotate the secret, read
deliveries, redeliver. One implementation for the CLI and the HTTP API.

The signing secret is generated here, returned once (by ``add`` and ``rotate_secret``) and
stored sealed like a credential's secret: a data key per subscription wrapped by the master
key, bound to the subscription's id and owner (``toolrelay.credentials.crypto``). Owners
can write the sealed columns but not read them (the grants), so it is never shown again.

The URL is sealed too (migration 0057): a Slack incoming webhook's path is its credential,
and any receiver's URL may carry a token. Its own data key is wrapped under the same master
key as the secret (``secret_key_id`` names both), and the plain ``url`` column keeps only
``shown_url``: scheme, host and port. Rows from before 0057 keep their full URL there until
``rewrap_secrets`` (``toolrelay webhook rewrap``) seals it.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
from yarl import URL

from toolrelay.credentials import Keyring
from toolrelay.credentials.crypto import CredentialIdentity, Envelope, rewrap, seal, unseal
from toolrelay.db import Database, translate_db_error
from toolrelay.db.connect import Row
from toolrelay.db.queries import load
from toolrelay.errors import (
    ConfigurationError,
    CredentialError,
    InvalidArgument,
    NotFound,
    UnknownMasterKey,
)
from toolrelay.notify.signing import new_secret
from toolrelay.tokens import Acting, Caller, acting_as

EVENTS = (
    "invocation.pending",
    "invocation.approved",
    "invocation.rejected",
    "invocation.completed",
    "invocation.failed",
    "invocation.expired",
)
FORMATS = ("standard", "slack")
SECRET_KIND = "webhook_secret"  # in the sealed secret's associated data
URL_KIND = "webhook_url"  # in the sealed URL's
HIDDEN = "…"  # stands for a sealed URL's path and query in the shown form
MAX_URL_LENGTH = 2048
DEFAULT_LIMIT = 50  # deliveries listed
MAX_LIMIT = 1000


def secret_identity(subscription_id: UUID, owner: UUID) -> CredentialIdentity:
    return CredentialIdentity(subscription_id, owner, SECRET_KIND)


def seal_secret(keyring: Keyring, subscription_id: UUID, owner: UUID, secret: str) -> Row:
    env = seal(keyring, secret_identity(subscription_id, owner), secret.encode())
    return {"key_id": env.key_id, "wrapped_key": env.wrapped_key, "nonce": env.nonce,
            "ciphertext": env.ciphertext}  # fmt: skip


def url_identity(subscription_id: UUID, owner: UUID) -> CredentialIdentity:
    return CredentialIdentity(subscription_id, owner, URL_KIND)


def seal_url(keyring: Keyring, subscription_id: UUID, owner: UUID, url: str) -> Row:
    """The sealed URL's columns (its data key wrapped by ``keyring``'s newest key, as the
    secret's must be) and its shown form in ``url``."""
    env = seal(keyring, url_identity(subscription_id, owner), url.encode())
    return {"url": shown_url(url), "url_wrapped_key": env.wrapped_key, "url_nonce": env.nonce,
            "url_ciphertext": env.ciphertext}  # fmt: skip


def shown_url(url: str) -> str:
    """What is safe to show of a webhook URL: ``scheme://host[:port]/``, with ``…`` for a
    path or query, which may be the credential (a Slack incoming webhook's path is)."""
    try:
        parsed = URL(url)
        origin = str(parsed.origin())
    except (ValueError, TypeError):
        return HIDDEN
    rest = parsed.raw_path not in ("", "/") or bool(parsed.raw_query_string)
    return f"{origin}/{HIDDEN if rest else ''}"


def delivery_url(keyring: Keyring, row: Row) -> str:
    """Where a claimed delivery goes: its sealed URL, or (a row from before migration 0057,
    not rewrapped since) the plain one."""
    if row["url_ciphertext"] is None:
        return str(row["url"])
    env = Envelope(
        row["secret_key_id"],
        bytes(row["url_wrapped_key"]),
        bytes(row["url_nonce"]),
        bytes(row["url_ciphertext"]),
    )
    return unseal(keyring, url_identity(row["subscription_id"], row["owner"]), env).decode()


def unseal_secret(keyring: Keyring, row: Row) -> str:
    """A claimed delivery's secret (the dispatcher's columns ``secret_*``)."""
    env = Envelope(
        row["secret_key_id"],
        bytes(row["secret_wrapped_key"]),
        bytes(row["secret_nonce"]),
        bytes(row["secret_ciphertext"]),
    )
    ident = secret_identity(row["subscription_id"], row["owner"])
    return unseal(keyring, ident, env).decode()


def check_url(url: str) -> str:
    url = url.strip()
    try:
        parsed = URL(url)
    except (ValueError, TypeError):
        # Not quoted: the URL may be the credential (a Slack webhook's path).
        raise InvalidArgument("not a URL (a port above 65535, a bracket left open?)") from None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise InvalidArgument("a webhook URL is http:// or https:// with a host")
    if parsed.user or parsed.password:
        raise InvalidArgument("a webhook URL may not carry a user or password")
    if parsed.fragment or len(url) > MAX_URL_LENGTH or any(c.isspace() for c in url):
        raise InvalidArgument(
            f"a webhook URL has no fragment, no spaces and at most {MAX_URL_LENGTH} characters"
        )
    return url


def check_events(events: Iterable[str]) -> list[str]:
    chosen: list[str] = []
    for event in events:
        for name in (part.strip() for part in event.split(",")):
            if not name:
                continue
            full = name if name.startswith("invocation.") else f"invocation.{name}"
            if full not in EVENTS:
                raise InvalidArgument(f"unknown event {name!r}; events: {', '.join(EVENTS)}")
            if full not in chosen:
                chosen.append(full)
    if not chosen:
        raise InvalidArgument(f"name at least one event: {', '.join(EVENTS)}")
    return chosen


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise InvalidArgument(f"unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    return fmt


def as_uuid(value: UUID | str, what: str) -> UUID:
    try:
        return value if isinstance(value, UUID) else UUID(str(value))
    except ValueError:
        raise InvalidArgument(f"not a {what} id (uuid): {str(value)[:80]!r}") from None


class Webhooks:
    """A tenant's webhooks; every operation is one transaction run as the tenant, or as the
    member acting (whose role the database checks: changing webhooks needs admin)."""

    def __init__(self, db: Database, who: Acting | str, keyring: Keyring | None = None) -> None:
        self._db = db
        owner, self.member = acting_as(who if isinstance(who, Caller) else as_uuid(who, "owner"))
        self.owner = owner
        self._keyring = keyring
        self._q = load("webhooks")

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Row]]:
        try:
            with self._db.as_owner(self.owner, member_id=self.member) as conn:
                yield conn
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None

    def _keys(self) -> Keyring:
        if self._keyring is None:
            raise ConfigurationError(
                "no master key: webhook secrets are sealed like credentials; set"
                " TOOLRELAY_MASTER_KEY (or TOOLRELAY_MASTER_KEY_FILE)"
            )
        return self._keyring

    def add(self, url: str, events: Sequence[str], fmt: str = "standard") -> tuple[Row, str]:
        """A new subscription and its secret (shown this once). The URL is stored sealed;
        the row returned (and every later one) shows ``shown_url`` of it."""
        sid = uuid.uuid4()
        params: dict[str, Any] = {
            "id": sid,
            "owner": self.owner,
            "format": check_format(fmt),
            "events": check_events(events),
        }
        full = check_url(url)
        keys, secret = self._keys(), new_secret()
        params |= seal_secret(keys, sid, self.owner, secret)  # both under keys.newest
        params |= seal_url(keys, sid, self.owner, full)
        with self._tx() as conn:
            row = conn.execute(self._q["add"], params).fetchone()
        assert row is not None
        return _shown(row), secret

    def list(self) -> builtins.list[Row]:
        with self._tx() as conn:
            return [_shown(row) for row in conn.execute(self._q["list"]).fetchall()]

    def get(self, subscription_id: UUID | str) -> Row:
        with self._tx() as conn:
            row = conn.execute(self._q["get"], {"id": self._id(subscription_id)}).fetchone()
        if row is None:
            raise NotFound(f"webhook {subscription_id} not found")
        return _shown(row)

    def remove(self, subscription_id: UUID | str) -> None:
        """Delete it with its deliveries (dead letters included)."""
        with self._tx() as conn:
            row = conn.execute(self._q["remove"], {"id": self._id(subscription_id)}).fetchone()
        if row is None:
            raise NotFound(f"webhook {subscription_id} not found")

    def set_enabled(self, subscription_id: UUID | str, enabled: bool) -> Row:
        params = {"id": self._id(subscription_id), "enabled": enabled}
        with self._tx() as conn:
            row = conn.execute(self._q["set_enabled"], params).fetchone()
        if row is None:
            raise NotFound(f"webhook {subscription_id} not found")
        return _shown(row)

    def rotate_secret(self, subscription_id: UUID | str) -> tuple[Row, str]:
        """A new secret, effective for every attempt from now on (shown this once). It is
        sealed under the master key the subscription's URL is wrapped under (the row's
        ``secret_key_id``, which names both); ``rewrap_secrets`` moves both to the newest."""
        sid = self._id(subscription_id)
        keys, secret = self._keys(), new_secret()
        with self._tx() as conn:
            current = conn.execute(self._q["key_of"], {"id": sid}).fetchone()
            if current is None:
                raise NotFound(f"webhook {subscription_id} not found")
            key_id = current["secret_key_id"]
            try:
                master = keys.get(key_id)
            except UnknownMasterKey as exc:
                raise UnknownMasterKey(
                    f"webhook {sid} is sealed under master key {key_id!r}, which is not"
                    f" configured here ({exc.message}); run `toolrelay webhook rewrap` where"
                    " it is, or configure it",
                    key_id,
                ) from None
            params = {"id": sid} | seal_secret(Keyring([master]), sid, self.owner, secret)
            row = conn.execute(self._q["rotate"], params).fetchone()
        assert row is not None
        return _shown(row), secret

    def deliveries(
        self,
        dead: bool = False,
        subscription_id: UUID | str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> builtins.list[Row]:
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        params = {
            "dead": dead,
            "subscription": None if subscription_id is None else self._id(subscription_id),
            "limit": limit,
        }
        with self._tx() as conn:
            return conn.execute(self._q["deliveries"], params).fetchall()

    def delivery(self, delivery_id: UUID | str) -> Row:
        with self._tx() as conn:
            row = conn.execute(
                self._q["delivery"], {"id": as_uuid(delivery_id, "delivery")}
            ).fetchone()
        if row is None:
            raise NotFound(f"webhook delivery {delivery_id} not found")
        return row

    def redeliver(self, delivery_id: UUID | str) -> Row:
        """Due again now, attempts from zero, the same webhook-id."""
        did = as_uuid(delivery_id, "delivery")
        with self._tx() as conn:
            conn.execute(self._q["redeliver"], {"id": did})
        return self.delivery(did)

    @staticmethod
    def _id(value: UUID | str) -> UUID:
        return as_uuid(value, "webhook")


def _shown(row: Row) -> Row:
    """The row as an owner sees it: a URL from before migration 0057, not sealed yet, is
    shown like a sealed one."""
    return row | {"url": shown_url(str(row["url"]))}


def rewrap_secrets(db: Database, keyring: Keyring) -> int:
    """Re-wrap every webhook secret's data key, and its URL's, not under the newest master
    key (as ``toolrelay credential rewrap`` does for credentials), and seal every URL stored
    in plain text (rows from before migration 0057); return how many rows changed. All or
    nothing."""
    newest = keyring.newest.id
    q = load("webhooks")
    try:
        with db.as_dispatcher() as conn:
            rows = conn.execute(q["to_rewrap"], {"newest": newest}).fetchall()
            for row in rows:
                try:
                    params = _rewrapped(keyring, row)
                except CredentialError as exc:
                    raise CredentialError(
                        f"rewrap stopped at webhook {row['id']}, nothing changed: {exc.message}"
                    ) from None
                conn.execute(q["rewrapped"], params)
    except psycopg.Error as exc:
        raise translate_db_error(exc) from None
    return len(rows)


def _rewrapped(keyring: Keyring, row: Row) -> Row:
    """A row's sealed columns under ``keyring``'s newest key, its URL sealed if it was not."""
    sid, owner, key_id = row["id"], row["owner"], row["secret_key_id"]
    old = Envelope(key_id, bytes(row["secret_wrapped_key"]), b"", b"")
    new = rewrap(keyring, secret_identity(sid, owner), old)
    params: Row = {"id": sid, "key_id": new.key_id, "wrapped_key": new.wrapped_key}
    if row["url_ciphertext"] is None:  # from before migration 0057
        return params | seal_url(keyring, sid, owner, str(row["url"]))
    url = rewrap(keyring, url_identity(sid, owner),
                 Envelope(key_id, bytes(row["url_wrapped_key"]), b"", b""))  # fmt: skip
    return params | {"url": row["url"], "url_wrapped_key": url.wrapped_key,
                     "url_nonce": bytes(row["url_nonce"]),
                     "url_ciphertext": bytes(row["url_ciphertext"])}  # fmt: skip
