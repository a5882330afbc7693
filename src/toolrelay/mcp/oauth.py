"""MCP authorization: /mcp as an OAuth 2.1 protected resource (MCP's authorization spec).

An MCP client gets an access token from one of the authorization servers named in
TOOLRELAY_MCP_AUTHORIZATION_SERVERS (it finds them in the RFC 9728 metadata http.py serves)
and presents it as a bearer token. ``ResourceServer.validate`` checks it as a JWT:

- its ``iss`` is one of the configured issuers, exactly; that server's metadata is read from
  ``/.well-known/oauth-authorization-server`` (RFC 8414), else
  ``/.well-known/openid-configuration``, and must name the same issuer; its ``jwks_uri``
  holds the keys;
- signed with an asymmetric algorithm (RS*, PS*, ES*, EdDSA), never ``none`` or HS* (a
  shared secret would let anyone holding it mint tokens), by a key in that JWKS (an unknown
  ``kid`` refetches the JWKS, at most once per ``jwks_refetch_s``);
- ``aud`` contains this resource, ``<base>/mcp`` (RFC 8707: a token the server issued for
  another resource is not one for us, whoever presents it);
- ``exp`` present and not past, ``nbf``/``iat`` not in the future (30 s of leeway), ``sub``
  present; ``typ`` absent, ``JWT`` or RFC 9068's ``at+jwt``.

Who acts: the agent an admin bound to the token's (issuer, subject) (``OAuthBindings``,
migration 0033). A pair is bound to at most one agent in the whole database.

Metadata and keys are cached per process (an hour; the keys refetched sooner for a kid the
cache lacks; keys held keep verifying while the server cannot be reached). A server whose
documents cannot be read is 503 (AuthorizationServerUnavailable), not the client's fault.
toolrelay's own ``trk_`` tokens never come here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import unicodedata
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit
from uuid import UUID

import jwt
import psycopg
from yarl import URL

from toolrelay.db import Database, translate_db_error
from toolrelay.db.connect import DISPATCHER, Row
from toolrelay.errors import ConfigurationError, Conflict, InvalidArgument, NotFound
from toolrelay.signin.oidc import (
    LOOPBACK_HOSTS,
    SIGNING_ALGORITHMS,
    SignInError,
    fetch_json,
    key_set,
)
from toolrelay.tokens import TOKEN_PREFIX, Acting, Unauthenticated, as_acting

__all__ = [
    "AUTHORIZATION_SERVERS_ENV",
    "AuthorizationServerUnavailable",
    "Binding",
    "Granted",
    "OAuthBindings",
    "ResourceServer",
    "authorization_servers",
    "check_binding",
    "metadata_urls",
]

log = logging.getLogger("toolrelay.mcp")

AUTHORIZATION_SERVERS_ENV: Final = "TOOLRELAY_MCP_AUTHORIZATION_SERVERS"
LEEWAY_S: Final = 30  # seconds of clock skew tolerated on exp, nbf and iat
METADATA_TTL_S: Final = 3600.0  # metadata and keys are read again after this
JWKS_REFETCH_S: Final = 10.0  # an unknown kid refetches the keys at most this often
ACCESS_TOKEN_TYPES: Final = frozenset({"at+jwt", "application/at+jwt", "jwt"})  # RFC 9068 2.1
MAX_ISSUER_CHARS: Final = 2000
MAX_SUBJECT_CHARS: Final = 1000
# The database's agents_oauth_issuer_check, said the same way here first.
_ISSUER_RE: Final = re.compile(r"https?://[^/?#\s\x00-\x1f\x7f]+(/[^?#\s\x00-\x1f\x7f]*)?")


def authorization_servers(environ: Mapping[str, str] | None = None) -> list[str]:
    """TOOLRELAY_MCP_AUTHORIZATION_SERVERS: issuer URLs, comma-separated (none: empty)."""
    raw = (os.environ if environ is None else environ).get(AUTHORIZATION_SERVERS_ENV, "")
    issuers = [part.strip() for part in raw.split(",") if part.strip()]
    for issuer in issuers:
        url = URL(issuer)
        if url.scheme not in ("https", "http") or not url.host or url.query_string:
            raise ConfigurationError(
                f"{AUTHORIZATION_SERVERS_ENV}: {issuer!r} is not an issuer URL (https://host[/path])"
            )
        # Its metadata names the keys that sign agents' tokens: over plain http, anyone on
        # the path could name their own.
        if url.scheme == "http" and url.host not in LOOPBACK_HOSTS:
            raise ConfigurationError(
                f"{AUTHORIZATION_SERVERS_ENV}: {issuer!r} must be an https URL (plain http"
                " only on loopback)"
            )
    return issuers


class AuthorizationServerUnavailable(ConfigurationError):
    """The authorization server's metadata or keys could not be read: a token from it
    cannot be checked now (HTTP 503, not the client's fault)."""

    code = "authorization_server_unavailable"


@dataclass(frozen=True)
class Granted:
    """What a validated access token says: who, at which server, for which client."""

    issuer: str
    subject: str
    client_id: str | None
    expires_at: int


@dataclass
class _Server:
    """One authorization server's documents, as last read."""

    jwks_uri: str | None = None
    metadata_at: float = float("-inf")
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys_at: float = float("-inf")
    verifiers: dict[tuple[str, str], jwt.PyJWK] = field(default_factory=dict)  # (kid, alg)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def metadata_urls(issuer: str) -> list[str]:
    """Where an issuer's metadata may be, in order: RFC 8414's well-known URI (inserted
    before the issuer's path), then OpenID Connect discovery (inserted, then appended), as
    the MCP authorization spec lists them."""
    parts = urlsplit(issuer)
    origin = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if not path:
        return [f"{origin}/.well-known/oauth-authorization-server",
                f"{origin}/.well-known/openid-configuration"]  # fmt: skip
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}/.well-known/openid-configuration{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


def _jwks_uri(doc: Any, issuer: str) -> str:
    """The metadata's jwks_uri, once the document is known to be the issuer's own."""
    if not isinstance(doc, dict):
        raise SignInError("the metadata is not a JSON object")
    if doc.get("issuer") != issuer:  # RFC 8414 3.3: a document for another issuer is not used
        raise SignInError(f"the metadata names issuer {doc.get('issuer')!r}, not {issuer!r}")
    uri = doc.get("jwks_uri")
    if not isinstance(uri, str) or urlsplit(uri).scheme != urlsplit(issuer).scheme:
        raise SignInError(
            f"the metadata's jwks_uri is missing or not a {urlsplit(issuer).scheme} URL"
        )
    return uri


class ResourceServer:
    """Validates access tokens from the configured authorization servers (see the module)."""

    def __init__(
        self,
        issuers: list[str],
        *,
        jwks_refetch_s: float = JWKS_REFETCH_S,
        metadata_ttl_s: float = METADATA_TTL_S,
    ) -> None:
        self.issuers = tuple(issuers)
        self._servers = {issuer: _Server() for issuer in issuers}
        self._jwks_refetch_s = jwks_refetch_s
        self._metadata_ttl_s = metadata_ttl_s

    def handles(self, token: str) -> bool:
        """Whether ``token`` is for this door rather than toolrelay's own: a JWT that is not
        HMAC-signed (those are TOOLRELAY_JWT_SECRET's), or any JWT naming one of our issuers.
        Decided from the unverified token, to choose the check only; ``validate`` decides."""
        if token.startswith(TOKEN_PREFIX) or token.count(".") != 2:
            return False
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return False
        alg = header.get("alg")
        if not (isinstance(alg, str) and alg.upper().startswith("HS")):
            return True
        return _unverified_issuer(token) in self.issuers

    async def validate(self, token: str, resource: str) -> Granted:
        """The grant ``token`` carries for ``resource``, or Unauthenticated saying why not."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"the access token is malformed: {exc}") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in SIGNING_ALGORITHMS:
            raise Unauthenticated(
                f"the access token is signed with {alg!r}: only asymmetric algorithms"
                " (RS*, PS*, ES*, EdDSA) are accepted, never none or HS*"
            )
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES):
            raise Unauthenticated(f"the token's type is {typ!r}, not an access token (at+jwt)")
        issuer = _unverified_issuer(token)
        if issuer not in self._servers:
            raise Unauthenticated(
                f"the access token's issuer {issuer!r} is not an authorization server of this"
                " toolrelay (TOOLRELAY_MCP_AUTHORIZATION_SERVERS)"
            )
        kid = header.get("kid")
        key = await self._verifier(issuer, kid if isinstance(kid, str) else None, alg)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=resource,
                issuer=issuer,
                leeway=LEEWAY_S,
                options={"require": ["iss", "sub", "aud", "exp"]},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthenticated("the access token has expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthenticated(
                f"the access token is not for this resource ({resource}): ask the authorization"
                " server for a token with resource={resource} (RFC 8707)"
            ) from None
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"the access token is not valid: {exc}") from None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("the access token's sub is not a string")
        client = claims.get("client_id")
        return Granted(
            issuer=issuer,
            subject=subject,
            client_id=client if isinstance(client, str) else None,
            expires_at=int(claims["exp"]),
        )

    async def _verifier(self, issuer: str, kid: str | None, alg: str) -> jwt.PyJWK:
        """The listed key for ``kid``, ready to verify ``alg``: made once per key and
        algorithm (loading an RSA key costs more than checking a signature with it)."""
        name, jwk = await self._key(issuer, kid)
        verifiers = self._servers[issuer].verifiers
        made = verifiers.get((name, alg))
        if made is not None:
            return made
        if jwk.get("alg") not in (None, alg):
            raise Unauthenticated(f"the access token's key is for {jwk['alg']}, not {alg}")
        try:
            made = jwt.PyJWK(jwk, algorithm=alg)
        except (jwt.PyJWTError, NotImplementedError, TypeError, ValueError):
            raise Unauthenticated(f"the access token's key cannot verify {alg}") from None
        verifiers[(name, alg)] = made
        return made

    async def _key(self, issuer: str, kid: str | None) -> tuple[str, dict[str, Any]]:
        server = self._servers[issuer]
        fresh = time.monotonic() - server.keys_at < self._metadata_ttl_s
        found = _pick(server.keys, kid) if fresh else None
        if found is None:
            async with server.lock:
                # Another request may have fetched them meanwhile; else at most once per
                # jwks_refetch_s for kids the keys lack (tokens naming random kids cost us
                # no more than that), and whenever they are older than the metadata TTL.
                found = _pick(server.keys, kid)
                age = time.monotonic() - server.keys_at
                if age >= self._metadata_ttl_s or (found is None and age >= self._jwks_refetch_s):
                    try:
                        await self._fetch_keys(issuer, server)
                    except AuthorizationServerUnavailable as exc:
                        if found is None:
                            raise
                        # Keys we hold still verify: an outage at the server does not end
                        # every agent's access; asked again jwks_refetch_s from now.
                        server.keys_at = (
                            time.monotonic() - self._metadata_ttl_s + self._jwks_refetch_s
                        )
                        log.warning("keeping %s's signing keys: %s", issuer, exc.message,
                                    extra={"action": "mcp_oauth_keys"})  # fmt: skip
                    else:
                        found = _pick(server.keys, kid)
        if found is None:
            raise Unauthenticated(
                f"the access token is signed with a key {issuer} does not list (kid {kid!r})"
            )
        return found

    async def _fetch_keys(self, issuer: str, server: _Server) -> None:
        jwks_uri = await self._jwks_uri(issuer, server)
        try:
            keys = key_set(await fetch_json("GET", jwks_uri, "signing keys (JWKS)"))
        except SignInError as exc:
            raise _unavailable(issuer, exc) from None
        server.keys, server.verifiers, server.keys_at = keys, {}, time.monotonic()

    async def _jwks_uri(self, issuer: str, server: _Server) -> str:
        if (
            server.jwks_uri is not None
            and time.monotonic() - server.metadata_at < self._metadata_ttl_s
        ):
            return server.jwks_uri
        problems: list[str] = []
        for url in metadata_urls(issuer):
            try:
                server.jwks_uri = _jwks_uri(await fetch_json("GET", url, "metadata"), issuer)
            except SignInError as exc:
                problems.append(f"{url}: {exc.message}")
                continue
            server.metadata_at = time.monotonic()
            return server.jwks_uri
        raise AuthorizationServerUnavailable(
            f"the authorization server {issuer} has no usable metadata: {'; '.join(problems)}"
        )


def _pick(keys: dict[str, dict[str, Any]], kid: str | None) -> tuple[str, dict[str, Any]] | None:
    """(its name in ``keys``, the JWK) for ``kid``; without one, the only key listed."""
    if kid is not None:
        return (kid, keys[kid]) if kid in keys else None
    return next(iter(keys.items())) if len(keys) == 1 else None


def _unavailable(issuer: str, exc: SignInError) -> AuthorizationServerUnavailable:
    said = exc.message.replace("the provider's ", "")
    return AuthorizationServerUnavailable(f"the authorization server {issuer}: {said}")


def _unverified_issuer(token: str) -> str | None:
    """The ``iss`` a token claims, before anything is checked (it chooses the keys only)."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    issuer = claims.get("iss")
    return issuer if isinstance(issuer, str) else None


# --- bindings: (issuer, subject) -> agent ------------------------------------------------


@dataclass(frozen=True)
class Binding:
    """The agent a validated token acts as, and whether it may act now."""

    owner: UUID
    agent_id: UUID
    active: bool


def check_binding(issuer: str, subject: str) -> None:
    """The database's rules for a binding, said first here, naming the value."""
    if len(issuer) > MAX_ISSUER_CHARS or not _ISSUER_RE.fullmatch(issuer) or _has_control(issuer):
        raise InvalidArgument(
            f"issuer {issuer[:200]!r} is not an issuer URL: it must be http(s)://host[/path]"
            " without query or fragment, exactly as the access tokens' iss says it"
        )
    if not subject or len(subject) > MAX_SUBJECT_CHARS or _has_control(subject):
        raise InvalidArgument(
            f"subject {subject[:200]!r} is not a subject: 1 to {MAX_SUBJECT_CHARS} characters,"
            " no control characters (the access tokens' sub)"
        )


def _has_control(text: str) -> bool:
    """Control characters, and the line and paragraph separators (the database's [[:cntrl:]]
    counts those too)."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


class OAuthBindings:
    """Bind an agent to an identity at an authorization server (an admin), and find the
    agent a validated token acts as (the dispatcher role, before anyone is known)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def bind(self, who: Acting, agent_id: UUID, issuer: str, subject: str) -> bool:
        """True when this changed the binding. Conflict when another agent holds the pair."""
        check_binding(issuer, subject)
        return self._set(who, agent_id, issuer, subject)

    def unbind(self, who: Acting, agent_id: UUID) -> bool:
        """True when the agent was bound."""
        return self._set(who, agent_id, None, None)

    def get(self, who: Acting, agent_id: UUID) -> tuple[str | None, str | None]:
        """The agent's (issuer, subject), (None, None) when unbound."""
        with self._as(who) as conn:
            row = conn.execute(
                "SELECT oauth_issuer, oauth_subject FROM agents.agents WHERE id = %s", (agent_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"agent {agent_id} not found")
        return row["oauth_issuer"], row["oauth_subject"]

    def lookup(self, issuer: str, subject: str) -> Binding | None:
        """The agent bound to (issuer, subject); None when none is. One round trip."""
        query = (
            "SELECT owner, agent_id, active FROM agents.oauth_agent(%(issuer)s, %(subject)s)",
            {"issuer": issuer, "subject": subject},
        )
        try:
            with self._db.trips() as trips:
                [rows] = trips.run(DISPATCHER, [query])
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None
        if not rows:
            return None
        row = rows[0]
        return Binding(owner=row["owner"], agent_id=row["agent_id"], active=row["active"])

    def _set(self, who: Acting, agent_id: UUID, issuer: str | None, subject: str | None) -> bool:
        try:
            with as_acting(self._db, who) as conn:
                row = conn.execute(
                    "SELECT fn_set_agent_oauth(%s, %s, %s) AS changed", (agent_id, issuer, subject)
                ).fetchone()
        except Conflict:
            raise Conflict(
                f"{subject!r} at {issuer} is already bound to another agent: an identity acts as"
                " one agent only (unbind it there first)"
            ) from None
        except InvalidArgument as exc:
            if "agents_oauth_" not in exc.message:
                raise
            raise InvalidArgument(  # a rule check_binding did not see (plain SQL's words)
                "the issuer must be an http(s) URL of at most 2000 characters and the subject"
                " 1 to 1000 characters without control characters"
            ) from None
        assert row is not None
        return bool(row["changed"])

    def _as(self, who: Acting) -> AbstractContextManager[psycopg.Connection[Row]]:
        return as_acting(self._db, who)
