"""The dispatcher's side: the value to place in a request, for one credential and one host.

Each call reads the row (status and host binding must be current; the dispatcher reads it
in the same statement that claims the invocation) and checks it. The decrypted secret is
kept for a minute, keyed by the credential and its exact sealed bytes (master key id,
wrapped key, nonce, ciphertext): a rotation or any rewrite of the row is a new key, and
status and host binding are checked on the row read for each call, never cached, so a
revocation (status) or a host change applies to the next claim. The plaintext stays in
this process's memory, where it is anyway while a call uses it; it is never logged.
Service-account access tokens are cached per process (the token request is the expensive
part); OAuth access tokens live encrypted in the row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

import aiohttp
import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from toolrelay.credentials import crypto
from toolrelay.credentials.formats import (
    ApiKeySecret,
    BasicSecret,
    OAuthSecret,
    Secret,
    ServiceAccountSecret,
    basic_value,
    decode_secret,
    encode_secret,
    with_tokens,
)
from toolrelay.credentials.hosts import host_allowed
from toolrelay.credentials.keys import Keyring
from toolrelay.credentials.oauth import InvalidGrant, refresh_access_token
from toolrelay.credentials.service_account import ServiceAccountTokens
from toolrelay.credentials.token_endpoint import TokenResponse
from toolrelay.errors import (
    CredentialError,
    CredentialHostMismatch,
    CredentialMissing,
    CredentialNeedsReauth,
    WrongMasterKey,
)

__all__ = ["CredentialResolver", "key_opens_nothing", "wrong_master_key"]

log = logging.getLogger(__name__)

Row = dict[str, Any]
_S = TypeVar("_S", ApiKeySecret, OAuthSecret, ServiceAccountSecret, BasicSecret)
PLAIN_TTL = 60.0  # seconds a decrypted secret is kept
PLAIN_KEPT = 256  # decrypted secrets kept at most (then all are forgotten)

_SELECT = (
    "SELECT id, owner, name, kind, status, allowed_hosts, key_id, wrapped_key, nonce,"
    " ciphertext, expires_at FROM agents.credentials WHERE id = %s"
)
# A few secrets sealed under one master key id, to try a key on (credentials/keycheck.py
# does the same at start; webhook secrets carry the kind 'webhook_secret').
_SAMPLES = (
    "(SELECT id, owner, kind, wrapped_key FROM agents.credentials WHERE key_id = %s LIMIT 4)"
    " UNION ALL (SELECT id, owner, 'webhook_secret', secret_wrapped_key"
    " FROM agents.webhook_subscriptions WHERE secret_key_id = %s LIMIT 4)"
)
# SKIP LOCKED: never wait behind a refresh or rotation just to record a use.
_TOUCH = (
    "UPDATE agents.credentials SET last_used_at = now() WHERE id IN ("
    " SELECT id FROM agents.credentials WHERE id = %s AND (last_used_at IS NULL"
    " OR last_used_at < now() - make_interval(secs => %s)) FOR UPDATE SKIP LOCKED)"
)


class CredentialResolver:
    """Resolves credentials on connections that already act as ``service_role``."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        keyring: Keyring,
        *,
        refresh_skew: float = 60.0,
        retry_delays: Sequence[float] = (0.2, 0.6),
        token_timeout: float = 10.0,
        touch_interval: float = 60.0,
    ) -> None:
        self._pool = pool
        self._keyring = keyring
        self._skew = timedelta(seconds=refresh_skew)
        self._retry_delays = tuple(retry_delays)
        self._timeout = token_timeout
        self._touch_interval = touch_interval
        self._touched: dict[UUID, float] = {}
        self._plain: dict[tuple[Any, ...], tuple[float, Secret]] = {}
        self._wrong_keys: dict[str, tuple[float, bool]] = {}  # key id: (when, wrong)
        self._sa_tokens = ServiceAccountTokens(
            skew=refresh_skew, retry_delays=self._retry_delays, timeout=token_timeout
        )

    async def resolve(
        self,
        credential_id: UUID,
        host: str,
        port: int | None,
        http: aiohttp.ClientSession,
        row: Row | None = None,
    ) -> str:
        """The secret value for a request to ``host``:``port`` (pass the effective port).

        ``row``: the credential's row (the columns of ``_SELECT``) when the caller already
        read it in the same statement that claimed the invocation; saves a round trip.
        Raises CredentialMissing, CredentialHostMismatch, CredentialNeedsReauth or
        CredentialError (undecryptable, unknown master key, token endpoint failure);
        WrongMasterKey when this process's key has the credential's key id but not its bytes.
        """
        try:
            return await self._resolve(credential_id, host, port, http, row)
        except crypto.DataKeyUnopened as exc:
            if await self._key_is_wrong(exc.key_id):
                raise wrong_master_key(exc.key_id, f"credential {credential_id}") from None
            raise

    async def _key_is_wrong(self, key_id: str) -> bool:
        """``key_opens_nothing``, kept a minute per id."""
        now = time.monotonic()
        known = self._wrong_keys.get(key_id)
        if known is not None and now - known[0] < PLAIN_TTL:
            return known[1]
        wrong = await key_opens_nothing(self._pool, self._keyring, key_id)
        self._wrong_keys[key_id] = (now, wrong)
        return wrong

    async def _resolve(
        self,
        credential_id: UUID,
        host: str,
        port: int | None,
        http: aiohttp.ClientSession,
        row: Row | None,
    ) -> str:
        if row is None:
            async with self._pool.connection() as conn:
                row = await _read_and_end(conn, credential_id)
        _check_host(row, host, port)
        _check_status(row)
        await self._touch(credential_id)
        if row["kind"] == "oauth":
            return await self._oauth_token(row, http)
        # No connection held while a service account waits for its token endpoint.
        if row["kind"] == "service_account":
            return await self._sa_tokens.token(
                row["id"],
                bytes(row["nonce"]),
                lambda: _expect(self._decrypt(row), ServiceAccountSecret),
                http,
            )
        if row["kind"] == "basic":
            return basic_value(_expect(self._decrypt(row), BasicSecret))
        return _expect(self._decrypt(row), ApiKeySecret).value

    async def refused(self, credential_id: UUID, row: Row | None = None) -> bool:
        """The upstream refused this credential's access token (HTTP 401). For an oauth
        credential with a refresh token, mark that access token expired, so that the next
        resolve refreshes it, and say the call may be sent again. Only the token the call
        read (its sealed envelope's nonce): one already refreshed by another call is kept."""
        if row is None:
            async with self._pool.connection() as conn:
                row = await _read_and_end(conn, credential_id)
        if row["kind"] != "oauth" or row["status"] != "active":
            return False
        if _expect(self._decrypt(row), OAuthSecret).refresh_token is None:
            return False  # nothing to refresh with: the call fails as the upstream said
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE agents.credentials SET expires_at = now() - interval '1 second'"
                " WHERE id = %s AND nonce = %s",
                (credential_id, bytes(row["nonce"])),
            )
        log.info("oauth credential %s: its access token was refused; refreshing", credential_id)
        return True

    async def _oauth_token(self, row: Row, http: aiohttp.ClientSession) -> str:
        secret = _expect(self._decrypt(row), OAuthSecret)
        if secret.access_token is not None and self._fresh(row["expires_at"]):
            return secret.access_token
        async with self._pool.connection() as conn:
            return await self._refresh(conn, row["id"], http)

    async def _refresh(
        self, conn: AsyncConnection[Any], credential_id: UUID, http: aiohttp.ClientSession
    ) -> str:
        """Refresh under the row lock; a waiter re-reads and uses the first one's token."""
        async with conn.transaction():
            row = await _read(conn, credential_id, lock=True)
            _check_status(row)
            secret = _expect(self._decrypt(row), OAuthSecret)
            if secret.access_token is not None and self._fresh(row["expires_at"]):
                return secret.access_token
            try:
                token = await refresh_access_token(
                    http, secret, retry_delays=self._retry_delays, timeout=self._timeout
                )
            except InvalidGrant:
                await _set_status(conn, credential_id, "needs_reauth")
                reason = "was refused by the token endpoint (invalid_grant)"
                if secret.refresh_token is None:
                    reason = "expired and has no refresh token"
            else:
                await self._store_tokens(conn, row, secret, token)
                return token.access_token
        # Outside the block: the needs_reauth status is committed before we raise.
        log.warning("oauth credential %s needs re-authorization", credential_id)
        raise CredentialNeedsReauth(
            f"oauth credential {row['name']!r} ({credential_id}) {reason}; it needs "
            f"re-authorization: rotate it with new tokens (toolrelay credential rotate {credential_id})"
        )

    async def _store_tokens(
        self, conn: AsyncConnection[Any], row: Row, secret: OAuthSecret, token: TokenResponse
    ) -> None:
        """Persist the new access token, and the refresh token when the server rotated it."""
        updated = with_tokens(secret, token.access_token, token.refresh_token)
        env = crypto.seal(self._keyring, _ident(row), encode_secret(updated))
        expires_at = None
        if token.expires_in is not None:
            expires_at = _now() + timedelta(seconds=token.expires_in)
        await conn.execute(
            "UPDATE agents.credentials SET key_id = %s, wrapped_key = %s, nonce = %s,"
            " ciphertext = %s, expires_at = %s WHERE id = %s",
            (env.key_id, env.wrapped_key, env.nonce, env.ciphertext, expires_at, row["id"]),
        )
        rotated = " and a rotated refresh token" if token.refresh_token else ""
        log.info("oauth credential %s refreshed: new access token%s", row["id"], rotated)

    def _fresh(self, expires_at: datetime | None) -> bool:
        return expires_at is None or expires_at - self._skew > _now()

    def _decrypt(self, row: Row) -> Secret:
        env = crypto.Envelope(
            row["key_id"], bytes(row["wrapped_key"]), bytes(row["nonce"]), bytes(row["ciphertext"])
        )
        key = (row["id"], row["owner"], row["kind"], env)
        now = time.monotonic()
        hit = self._plain.get(key)
        if hit is not None and now - hit[0] < PLAIN_TTL:
            return hit[1]
        secret = decode_secret(row["kind"], crypto.unseal(self._keyring, _ident(row), env))
        if len(self._plain) >= PLAIN_KEPT:
            self._plain.clear()
        self._plain[key] = (now, secret)
        return secret

    async def _touch(self, credential_id: UUID) -> None:
        """last_used_at, written at most once per interval per credential."""
        now = time.monotonic()
        last = self._touched.get(credential_id)
        if last is not None and now - last < self._touch_interval:
            return
        self._touched[credential_id] = now
        try:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(_TOUCH, (credential_id, self._touch_interval))
        except psycopg.Error as exc:  # bookkeeping only: never fail a call over it
            log.warning(
                "credential %s: last_used_at not recorded (%s)", credential_id, exc.sqlstate
            )


async def _read(conn: AsyncConnection[Any], credential_id: UUID, lock: bool = False) -> Row:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_SELECT + (" FOR UPDATE" if lock else ""), (credential_id,))
        row = await cur.fetchone()
    if row is None:
        raise CredentialMissing(f"credential {credential_id} does not exist")
    return row


async def _read_and_end(conn: AsyncConnection[Any], credential_id: UUID) -> Row:
    """Read outside any open transaction, so that a later transaction block is a real one."""
    if conn.autocommit:
        return await _read(conn, credential_id)  # one statement, one round trip
    async with conn.transaction():
        return await _read(conn, credential_id)


async def _set_status(conn: AsyncConnection[Any], credential_id: UUID, status: str) -> None:
    await conn.execute(
        "UPDATE agents.credentials SET status = %s WHERE id = %s", (status, credential_id)
    )


def _check_host(row: Row, host: str, port: int | None) -> None:
    allowed = row["allowed_hosts"] or []
    if host_allowed(allowed, host, port):
        return
    target = host if port is None else f"{host}:{port}"
    hosts = ", ".join(allowed) if allowed else "none yet (bind it to a tool or set its hosts)"
    raise CredentialHostMismatch(
        f"credential {row['name']!r} ({row['id']}) may not be sent to {target}; "
        f"allowed hosts: {hosts}"
    )


def _check_status(row: Row) -> None:
    if row["status"] != "active":
        raise CredentialNeedsReauth(
            f"credential {row['name']!r} ({row['id']}) is {row['status']}; rotate it with a "
            f"new secret (toolrelay credential rotate {row['id']})"
        )


def _expect(secret: Secret, kind: type[_S]) -> _S:
    if not isinstance(secret, kind):
        raise CredentialError("stored secret does not match the credential's kind")
    return secret


async def key_opens_nothing(pool: AsyncConnectionPool[Any], keyring: Keyring, key_id: str) -> bool:
    """Whether no secret sealed under ``key_id`` opens with ``keyring``'s key of that id:
    then this process's key is wrong (the id, other bytes), not the row that did not open.
    The start-up check (keycheck.py) cannot tell while nothing is sealed yet."""
    async with pool.connection() as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(_SAMPLES, (key_id, key_id))
        samples = await cur.fetchall()
    master = keyring.get(key_id)
    return not any(crypto.opens(master, _ident(s), bytes(s["wrapped_key"])) for s in samples)


def wrong_master_key(key_id: str, what: str) -> WrongMasterKey:
    return WrongMasterKey(
        f"this process's master key {key_id!r} has the id but other bytes than the key that"
        f" sealed {what} (nothing sealed under that id opens with it): left to a process"
        " whose key opens it",
        key_id,
    )


def _ident(row: Row) -> crypto.CredentialIdentity:
    return crypto.CredentialIdentity(row["id"], row["owner"], row["kind"])


def _now() -> datetime:
    return datetime.now(UTC)
