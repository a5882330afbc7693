"""Bearer tokens for owners and agents, and who a presented token belongs to.

A token is ``trk_`` followed by 32 random bytes (base64url); only its SHA-256 is stored.
``Authenticator.authenticate(token)`` answers with a ``Caller`` for an API token, or for a
Supabase-style HS256 JWT when a secret is configured. Every door (the HTTP API, the MCP
server) turns a ``Caller`` into database identity the same way: ``Registry(db, caller.owner,
agent_id=caller.agent_id)``, so the SQL functions and row-level security see who acts.
"""

from __future__ import annotations

import builtins
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from uuid import UUID

import jwt
import psycopg

from toolrelay.db import Database, translate_db_error
from toolrelay.db.connect import DISPATCHER, Query, Row
from toolrelay.errors import ConfigurationError, NotFound, Unauthenticated

__all__ = [
    "JWT_SECRET_ENV",
    "TOKEN_PREFIX",
    "Acting",
    "Authenticator",
    "Caller",
    "TokenInfo",
    "TokenStore",
    "Unauthenticated",
    "acting_as",
    "as_acting",
    "hash_token",
    "insert_token",
    "new_token",
]

TOKEN_PREFIX = "trk_"
TOKEN_BYTES = 32
JWT_SECRET_ENV = "TOOLRELAY_JWT_SECRET"
JWT_MIN_SECRET_CHARS = 32
JWT_LEEWAY = 30  # seconds of clock skew tolerated on exp / nbf
JWT_ROLE = "authenticated"  # Supabase's role for signed-in users; service_role JWTs are refused
REMEMBERED_TOKENS = 10_000  # agent tokens whose caller serve remembers (the latest used)
# Checked in SQL for the agent a transaction acts as (migration 0039): raises TR006.
TOKEN_CHECK = "SELECT agents.check_token(%(token_hash)s)"
TOKEN_REFUSED = "TR006"

_AUTHENTICATE = (
    "SELECT token_id, owner, agent_id, member_id FROM agents.authenticate_token(%(hash)s)"
)
_INFO = "id, owner, agent_id, member_id, name, created_at, last_used_at, expires_at, revoked_at"


@dataclass(frozen=True)
class Caller:
    """Who is calling: an owner (the tenant itself, or one of its members), or one of the
    owner's agents. A member's role is the database's to check (migration 0025)."""

    owner: UUID
    agent_id: UUID | None = None
    token_id: UUID | None = None  # None for a JWT
    member_id: UUID | None = None
    # The token's hash when it was remembered, not looked up, for this request: only a
    # call may be made with it, its transaction checking the token first (migration 0039;
    # Authenticator.authenticate_async's ``deferred``).
    unchecked: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def is_agent(self) -> bool:
        return self.agent_id is not None

    def checked(self) -> Caller:
        """This caller once its token was checked in a transaction of its request."""
        return replace(self, unchecked=None) if self.unchecked is not None else self

    @property
    def token_check(self) -> Query | None:
        """The query a call made by this caller runs first, when its token is unchecked."""
        return None if self.unchecked is None else (TOKEN_CHECK, {"token_hash": self.unchecked})

    @property
    def kind(self) -> str:
        return "agent" if self.is_agent else "owner"

    @property
    def rate_key(self) -> str:
        """What a rate limit counts against: the token, or the JWT's subject."""
        if self.token_id is not None:
            return f"token:{self.token_id}"
        return f"jwt:{self.owner}:{self.agent_id or ''}"


@dataclass(frozen=True)
class TokenInfo:
    """A token's metadata; the token itself is never stored."""

    id: UUID
    owner: UUID
    agent_id: UUID | None
    member_id: UUID | None
    name: str | None
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None

    @property
    def kind(self) -> str:
        if self.agent_id is not None:
            return "agent"
        return "member" if self.member_id is not None else "owner"


Acting = UUID | Caller  # the tenant itself, or a caller (a member acts as that member)


def acting_as(who: Acting) -> tuple[UUID, UUID | None]:
    """(tenant, member) for a store's transaction."""
    if isinstance(who, Caller):
        return who.owner, who.member_id
    return who, None


@contextmanager
def as_acting(db: Database, who: Acting) -> Iterator[psycopg.Connection[Row]]:
    """A transaction as ``who`` (the tenant, or a member of it), database errors translated."""
    owner, member = acting_as(who)
    try:
        with db.as_owner(owner, member_id=member) as conn:
            yield conn
    except psycopg.Error as exc:
        raise translate_db_error(exc) from None


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class TokenStore:
    """Make, list and revoke tokens (as the owner), and look one up (as the dispatcher)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def create(
        self,
        owner: Acting,
        agent_id: UUID | None = None,
        name: str | None = None,
        expires_at: datetime | None = None,
        member_id: UUID | None = None,
    ) -> tuple[TokenInfo, str]:
        """A new token for the owner (or one of their agents or members); returns it once,
        in clear."""
        token = new_token()
        with self._as_owner(owner) as conn:
            made = insert_token(conn, token, agent_id, name, expires_at, member_id)
            info = _one(conn, made)
        return info, token

    def get(self, owner: Acting, token_id: UUID) -> TokenInfo:
        with self._as_owner(owner) as conn:
            return _one(conn, token_id)

    def list(self, owner: Acting) -> builtins.list[TokenInfo]:
        with self._as_owner(owner) as conn:
            rows = conn.execute(
                f"SELECT {_INFO} FROM agents.api_tokens ORDER BY created_at, id"
            ).fetchall()
        return [TokenInfo(**row) for row in rows]

    def revoke(self, owner: Acting, token_id: UUID) -> bool:
        """True when this call revoked it, False when it already was; NotFound otherwise."""
        with self._as_owner(owner) as conn:
            row = conn.execute("SELECT fn_revoke_api_token(%s) AS done", (token_id,)).fetchone()
            assert row is not None
            return bool(row["done"])

    def lookup(self, token: str) -> Caller | None:
        """The caller a live token stands for; None when unknown, revoked or expired."""
        try:
            with self._db.trips() as trips:  # one round trip, on every request
                [rows] = trips.run(DISPATCHER, [_lookup(hash_token(token))])
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None
        return _caller(rows)

    async def lookup_async(self, token: str) -> Caller | None:
        """``lookup`` from the event loop: the doors' check, without a worker thread."""
        return await self.lookup_hash_async(hash_token(token))

    async def lookup_hash_async(self, hashed: bytes) -> Caller | None:
        """``lookup_async`` of a token's hash (the one a door has already computed)."""
        try:
            [rows] = await self._db.trip(DISPATCHER, [_lookup(hashed)])
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None
        return _caller(rows)

    def _as_owner(self, who: Acting) -> AbstractContextManager[psycopg.Connection[Row]]:
        return as_acting(self._db, who)


def _lookup(hashed: bytes) -> Query:
    return _AUTHENTICATE, {"hash": hashed}


def _caller(rows: builtins.list[Row]) -> Caller | None:
    if not rows:
        return None
    row = rows[0]
    return Caller(
        owner=row["owner"],
        agent_id=row["agent_id"],
        token_id=row["token_id"],
        member_id=row["member_id"],
    )


def insert_token(
    conn: psycopg.Connection[Row],
    token: str,
    agent_id: UUID | None = None,
    name: str | None = None,
    expires_at: datetime | None = None,
    member_id: UUID | None = None,
) -> UUID:
    """Store ``token`` (its hash) in the caller's transaction; the new token's id."""
    row = conn.execute(
        "SELECT fn_create_api_token(%s, %s, %s, %s, %s) AS id",
        (hash_token(token), agent_id, name, expires_at, member_id),
    ).fetchone()
    assert row is not None
    return UUID(str(row["id"]))


def _one(conn: psycopg.Connection[Row], token_id: UUID) -> TokenInfo:
    row = conn.execute(
        f"SELECT {_INFO} FROM agents.api_tokens WHERE id = %s", (token_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"token {token_id} not found")
    return TokenInfo(**row)


class Authenticator:
    """Turns a presented bearer token into a Caller, or raises Unauthenticated."""

    def __init__(self, db: Database, jwt_secret: str | None = None) -> None:
        if jwt_secret is not None and len(jwt_secret) < JWT_MIN_SECRET_CHARS:
            raise ConfigurationError(
                f"{JWT_SECRET_ENV} must be at least {JWT_MIN_SECRET_CHARS} characters"
            )
        self.tokens = TokenStore(db)
        self._jwt_secret = jwt_secret
        # hash -> the caller a lookup answered: used only where the token is checked again
        # in the call's transaction, so a revoked token is refused as before (``deferred``)
        self._remembered: OrderedDict[bytes, Caller] = OrderedDict()

    def authenticate(self, token: str) -> Caller:
        token = token.strip()
        if token.startswith(TOKEN_PREFIX):
            return _known(self.tokens.lookup(token))
        return self._not_ours(token)

    async def authenticate_async(self, token: str, *, deferred: bool = False) -> Caller:
        """``authenticate`` from the event loop (the HTTP doors). ``deferred``: the request
        only makes a call, which can check the token in its own transaction: an agent token
        looked up before (by this Authenticator, within the last ``REMEMBERED_TOKENS``) is
        answered without a round trip, ``unchecked`` (migration 0039)."""
        token = token.strip()
        if not token.startswith(TOKEN_PREFIX):
            return self._not_ours(token)
        hashed = hash_token(token)
        if deferred:
            remembered = self._remembered.get(hashed)
            if remembered is not None:
                self._remembered.move_to_end(hashed)
                return replace(remembered, unchecked=hashed)
        return await self._looked_up(hashed)

    async def looked_up(self, caller: Caller) -> Caller:
        """``caller`` with its token looked up now if it was unchecked (before anything but
        the call is done as it); raises Unauthenticated as a lookup does."""
        return caller if caller.unchecked is None else await self._looked_up(caller.unchecked)

    def forget(self, caller: Caller) -> None:
        """After an unchecked caller's check failed: its token is looked up again."""
        if caller.unchecked is not None:
            self._remembered.pop(caller.unchecked, None)

    async def _looked_up(self, hashed: bytes) -> Caller:
        found = await self.tokens.lookup_hash_async(hashed)
        if found is None:
            self._remembered.pop(hashed, None)
        caller = _known(found)
        if caller.is_agent:
            self._remembered[hashed] = caller
            self._remembered.move_to_end(hashed)
            if len(self._remembered) > REMEMBERED_TOKENS:
                self._remembered.popitem(last=False)
        return caller

    def _not_ours(self, token: str) -> Caller:
        if token.count(".") == 2:
            return self._from_jwt(token)
        raise Unauthenticated(f"not a toolrelay token ({TOKEN_PREFIX}…) or a JWT")

    def _from_jwt(self, token: str) -> Caller:
        if self._jwt_secret is None:
            raise Unauthenticated(f"JWTs are not accepted here ({JWT_SECRET_ENV} is not set)")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._jwt_secret,
                algorithms=["HS256"],
                options={"require": ["sub", "exp"], "verify_aud": False},
                leeway=JWT_LEEWAY,
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"invalid JWT: {exc}") from None
        if claims.get("role", JWT_ROLE) != JWT_ROLE:
            raise Unauthenticated(f"a JWT must have role {JWT_ROLE!r}")
        audience = claims.get("aud", JWT_ROLE)
        if JWT_ROLE not in (audience if isinstance(audience, list) else [audience]):
            raise Unauthenticated(f"a JWT's audience must be {JWT_ROLE!r}")
        return Caller(owner=_claim_uuid(claims, "sub"), agent_id=_optional_uuid(claims))


def _known(caller: Caller | None) -> Caller:
    if caller is None:
        raise Unauthenticated("the token is unknown, revoked or expired")
    return caller


def _claim_uuid(claims: dict[str, Any], name: str) -> UUID:
    try:
        return UUID(str(claims[name]))
    except (KeyError, ValueError):
        raise Unauthenticated(f"the JWT's {name!r} claim is not a uuid") from None


def _optional_uuid(claims: dict[str, Any]) -> UUID | None:
    if claims.get("agent_id") in (None, ""):
        return None
    return _claim_uuid(claims, "agent_id")
