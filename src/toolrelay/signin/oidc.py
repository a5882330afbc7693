"""An OpenID Connect relying party: discovery, the authorization request (code flow, PKCE
S256, state, nonce), the code exchange and the ID token's validation (OpenID Connect Core
3.1.3.7), for the approvals page and ``toolrelay login`` alike.

The provider is the operator's choice (TOOLRELAY_OIDC_ISSUER) and trusted as configured, so
its calls do not go through the tool egress guard; plain http is accepted for a loopback
issuer only, and every endpoint its discovery document names must use the issuer's scheme.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote_plus, urlencode, urlsplit

import aiohttp
import jwt

from toolrelay.credentials.token_endpoint import read_whole
from toolrelay.errors import ConfigurationError, ToolrelayError

ISSUER_ENV: Final = "TOOLRELAY_OIDC_ISSUER"
CLIENT_ID_ENV: Final = "TOOLRELAY_OIDC_CLIENT_ID"
CLIENT_SECRET_ENV: Final = "TOOLRELAY_OIDC_CLIENT_SECRET"
CLI_CLIENT_ID_ENV: Final = "TOOLRELAY_OIDC_CLI_CLIENT_ID"
SCOPES_ENV: Final = "TOOLRELAY_OIDC_SCOPES"
NAME_ENV: Final = "TOOLRELAY_OIDC_NAME"

DEFAULT_SCOPES: Final = "openid email profile"
HTTP_TIMEOUT_S: Final = 10.0
MAX_RESPONSE_BYTES: Final = 1 << 20
METADATA_TTL_S: Final = 3600.0
ID_TOKEN_LEEWAY_S: Final = 60
ID_TOKEN_MAX_AGE_S: Final = 600  # an ID token issued longer ago than this is not fresh
# Never HS* (the client secret would be the key) or none.
SIGNING_ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})


class SignInError(ToolrelayError):
    """A sign-in that did not complete: the message says why (shown to the person)."""

    code = "sign_in_failed"


@dataclass(frozen=True)
class OidcSettings:
    """The provider and this deployment's clients at it, from the environment."""

    issuer: str
    client_id: str  # the approvals page's client (confidential when a secret is set)
    client_secret: str | None
    cli_client_id: str  # `toolrelay login`'s public, native client (loopback redirect)
    scopes: str = DEFAULT_SCOPES
    name: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OidcSettings | None:
        """None when TOOLRELAY_OIDC_ISSUER is unset (sign-in by token only)."""
        env = os.environ if environ is None else environ
        issuer = env.get(ISSUER_ENV, "").strip().rstrip("/")
        if not issuer:
            return None
        check_issuer(issuer)
        client_id = env.get(CLIENT_ID_ENV, "").strip()
        cli_client_id = env.get(CLI_CLIENT_ID_ENV, "").strip() or client_id
        if not client_id and not cli_client_id:
            raise ConfigurationError(
                f"{ISSUER_ENV} is set but {CLIENT_ID_ENV} is not: register toolrelay as a client"
                f" at {issuer} and set its client id"
            )
        scopes = env.get(SCOPES_ENV, "").strip() or DEFAULT_SCOPES
        if "openid" not in scopes.split():
            raise ConfigurationError(f"{SCOPES_ENV} must include 'openid', got {scopes!r}")
        return cls(
            issuer=issuer,
            client_id=client_id,
            client_secret=env.get(CLIENT_SECRET_ENV, "").strip() or None,
            cli_client_id=cli_client_id,
            scopes=scopes,
            name=env.get(NAME_ENV, "").strip() or (urlsplit(issuer).hostname or issuer),
        )


def check_issuer(issuer: str) -> None:
    parts = urlsplit(issuer)
    if parts.scheme == "https" and parts.hostname:
        pass
    elif parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS:
        pass  # a provider on this machine (tests, development)
    else:
        raise ConfigurationError(
            f"{ISSUER_ENV}={issuer!r}: must be an https URL (plain http only on loopback)"
        )
    if parts.query or parts.fragment:
        raise ConfigurationError(f"{ISSUER_ENV}={issuer!r}: no query or fragment")


@dataclass(frozen=True)
class Metadata:
    """The parts of the provider's discovery document that a sign-in uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    algorithms: frozenset[str]
    token_auth_methods: frozenset[str]
    iss_parameter: bool  # RFC 9207: the authorization response names its issuer
    userinfo_endpoint: str | None = None

    @classmethod
    def parse(cls, doc: Any, issuer: str) -> Metadata:
        if not isinstance(doc, dict):
            raise SignInError("the provider's discovery document is not a JSON object")
        if doc.get("issuer") != issuer:
            raise SignInError(
                f"the provider's discovery document names issuer {doc.get('issuer')!r},"
                f" not {issuer!r}"
            )
        scheme = urlsplit(issuer).scheme
        urls: dict[str, str] = {}
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            value = doc.get(key)
            if not isinstance(value, str) or urlsplit(value).scheme != scheme:
                raise SignInError(f"the provider's {key} is missing or not a {scheme} URL")
            urls[key] = value
        offered = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
        algorithms = frozenset(a for a in offered if a in SIGNING_ALGORITHMS)
        if not algorithms:
            raise SignInError(f"the provider signs ID tokens only with {offered!r}")
        methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        userinfo = doc.get("userinfo_endpoint")
        if userinfo is not None and (
            not isinstance(userinfo, str) or urlsplit(userinfo).scheme != scheme
        ):
            raise SignInError(f"the provider's userinfo_endpoint is not a {scheme} URL")
        return cls(
            userinfo_endpoint=userinfo,
            issuer=issuer,
            algorithms=algorithms,
            token_auth_methods=frozenset(m for m in methods if isinstance(m, str)),
            iss_parameter=doc.get("authorization_response_iss_parameter_supported") is True,
            **urls,
        )


@dataclass(frozen=True)
class Started:
    """What to keep of an authorization request until its callback."""

    url: str  # where to send the person
    state: str
    nonce: str
    code_verifier: str
    redirect_uri: str


@dataclass(frozen=True)
class Identity:
    """Who the provider says signed in (from a validated ID token)."""

    issuer: str
    subject: str
    email: str | None
    email_verified: bool
    name: str | None


def pkce_challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class OidcClient:
    """One client id at the provider; discovery and keys cached per process."""

    def __init__(self, settings: OidcSettings, client_id: str, secret: str | None) -> None:
        if not client_id:
            raise ConfigurationError(f"{CLIENT_ID_ENV} is not set")
        self.settings = settings
        self.client_id = client_id
        self._secret = secret
        self._metadata: tuple[float, Metadata] | None = None
        self._keys: dict[str, dict[str, Any]] = {}  # kid -> the JWK, as the provider lists it
        self._lock = asyncio.Lock()

    @classmethod
    def for_page(cls, settings: OidcSettings) -> OidcClient:
        return cls(settings, settings.client_id, settings.client_secret)

    @classmethod
    def for_cli(cls, settings: OidcSettings) -> OidcClient:
        secret = settings.client_secret if settings.cli_client_id == settings.client_id else None
        return cls(settings, settings.cli_client_id, secret)

    # --- the provider's documents ----------------------------------------------------------

    async def metadata(self) -> Metadata:
        now = time.monotonic()
        if self._metadata is not None and now - self._metadata[0] < METADATA_TTL_S:
            return self._metadata[1]
        url = f"{self.settings.issuer}/.well-known/openid-configuration"
        doc = await _get_json(url, "discovery document")
        meta = Metadata.parse(doc, self.settings.issuer)
        self._metadata = (now, meta)
        return meta

    async def _key(self, meta: Metadata, kid: str | None) -> dict[str, Any]:
        found = self._pick(kid)
        if found is None:  # unknown kid: the provider may have rotated its keys
            async with self._lock:
                doc = await _get_json(meta.jwks_uri, "signing keys (JWKS)")
                self._keys = key_set(doc)
            found = self._pick(kid)
        if found is None:
            raise SignInError(
                f"the ID token is signed with a key the provider does not list ({kid})"
            )
        return found

    def _pick(self, kid: str | None) -> dict[str, Any] | None:
        if kid is not None:
            return self._keys.get(kid)
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    # --- the flow ----------------------------------------------------------------------------

    async def start(self, redirect_uri: str) -> Started:
        meta = await self.metadata()
        state = secrets.token_urlsafe(32)
        nonce = secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(48)  # 64 characters, RFC 7636's 43..128
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.client_id,
                "redirect_uri": redirect_uri,
                "scope": self.settings.scopes,
                "state": state,
                "nonce": nonce,
                "code_challenge": pkce_challenge(verifier),
                "code_challenge_method": "S256",
            }
        )
        separator = "&" if "?" in meta.authorization_endpoint else "?"
        url = f"{meta.authorization_endpoint}{separator}{query}"
        return Started(url, state, nonce, verifier, redirect_uri)

    def check_response_issuer(self, meta: Metadata, iss: str | None) -> None:
        """RFC 9207: a response naming another issuer (a mix-up) is refused."""
        if iss is not None and iss != meta.issuer:
            raise SignInError(f"the response came from issuer {iss!r}, not {meta.issuer!r}")
        if iss is None and meta.iss_parameter:
            raise SignInError("the provider's response did not name its issuer (RFC 9207)")

    async def finish(self, code: str, redirect_uri: str, verifier: str, nonce: str) -> Identity:
        """Exchange ``code`` once and validate the ID token it brings."""
        meta = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        }
        headers: dict[str, str] = {}
        if self._secret is None:
            form["client_id"] = self.client_id
        elif "client_secret_basic" in meta.token_auth_methods:
            # RFC 6749 2.3.1: id and secret form-encoded, then HTTP basic
            pair = f"{quote_plus(self.client_id)}:{quote_plus(self._secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form.update(client_id=self.client_id, client_secret=self._secret)
        tokens = await _post_form(meta.token_endpoint, form, headers)
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise SignInError("the provider's token response has no ID token")
        who = await self.verify_id_token(id_token, nonce)
        access = tokens.get("access_token")
        if who.email is None and meta.userinfo_endpoint and isinstance(access, str):
            # Many providers put the scope's claims in userinfo only (OIDC Core 5.4).
            info = await fetch_json(
                "GET", meta.userinfo_endpoint, "userinfo endpoint",
                headers={"Authorization": f"Bearer {access}"},
            )  # fmt: skip
            who = merge_userinfo(who, info)
        return who

    async def verify_id_token(self, id_token: str, nonce: str) -> Identity:
        meta = await self.metadata()
        try:
            header = jwt.get_unverified_header(id_token)
        except jwt.PyJWTError as exc:
            raise SignInError(f"the ID token is malformed: {exc}") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in meta.algorithms:
            raise SignInError(f"the ID token is signed with {alg!r}, which is not accepted")
        jwk = await self._key(meta, header.get("kid"))
        try:
            # A JWK's "alg" is optional (RFC 7517 4.4): without one, the key is for the
            # header's algorithm if its type fits (an RSA key is not assumed RS256 only).
            key = jwt.PyJWK(jwk, algorithm=jwk.get("alg") or alg)
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key,
                algorithms=[alg],
                audience=self.client_id,
                issuer=meta.issuer,
                leeway=ID_TOKEN_LEEWAY_S,
                options={"require": ["iss", "sub", "aud", "exp", "iat"]},
            )
        except jwt.PyJWTError as exc:
            raise SignInError(f"the ID token is not valid: {exc}") from None
        audience = claims["aud"]
        if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != self.client_id:
            raise SignInError("the ID token was issued to another client (azp)")
        if not isinstance(claims.get("nonce"), str) or not secrets.compare_digest(
            claims["nonce"].encode(), nonce.encode()
        ):
            raise SignInError("the ID token's nonce does not match this sign-in (a replay?)")
        if claims["iat"] < time.time() - ID_TOKEN_MAX_AGE_S - ID_TOKEN_LEEWAY_S:
            raise SignInError("the ID token is too old")
        email = claims.get("email")
        name = claims.get("name")
        return Identity(
            issuer=meta.issuer,
            subject=str(claims["sub"]),
            email=email if isinstance(email, str) and email else None,
            email_verified=claims.get("email_verified") is True,
            name=name if isinstance(name, str) and name else None,
        )


def merge_userinfo(who: Identity, info: Any) -> Identity:
    """The ID token's identity with the email and name userinfo adds; userinfo about
    another subject is refused (OIDC Core 5.3.2)."""
    if not isinstance(info, dict) or info.get("sub") != who.subject:
        raise SignInError("the provider's userinfo is about another subject")
    email = info.get("email")
    name = info.get("name")
    return Identity(
        issuer=who.issuer,
        subject=who.subject,
        email=email if isinstance(email, str) and email else None,
        email_verified=info.get("email_verified") is True,
        name=who.name or (name if isinstance(name, str) and name else None),
    )


def key_set(doc: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise SignInError("the provider's JWKS is not a key set")
    keys: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(doc["keys"]):
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        try:
            jwt.PyJWK(entry)
        except (jwt.PyJWTError, NotImplementedError, TypeError):  # "alg": "none", a list
            continue  # a key type this library does not know is not one we can use
        keys[str(entry.get("kid", f"#{index}"))] = entry
    return keys


async def _get_json(url: str, what: str) -> Any:
    return await fetch_json("GET", url, what)


async def _post_form(url: str, form: dict[str, str], headers: dict[str, str]) -> Any:
    doc = await fetch_json("POST", url, "token endpoint", data=form, headers=headers)
    if not isinstance(doc, dict):
        raise SignInError("the provider's token response is not a JSON object")
    return doc


async def fetch_json(
    method: str, url: str, what: str, headers: dict[str, str] | None = None, **kwargs: Any
) -> Any:
    timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
    sent = {"Accept": "application/json", **(headers or {})}
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.request(method, url, allow_redirects=False, headers=sent, **kwargs) as response,
        ):
            body = await read_whole(response, MAX_RESPONSE_BYTES)
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SignInError(
            f"the provider's {what} could not be reached: {type(exc).__name__}"
        ) from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise SignInError(f"the provider's {what} answered with more than 1 MiB")
    try:
        doc = json.loads(body)
    except ValueError:
        raise SignInError(f"the provider's {what} answered HTTP {status}, not JSON") from None
    if status != 200:
        error = doc.get("error") if isinstance(doc, dict) else None
        detail = doc.get("error_description") if isinstance(doc, dict) else None
        said = ": ".join(str(x) for x in (error, detail) if x) or f"HTTP {status}"
        raise SignInError(f"the provider's {what} refused: {said[:300]}")
    return doc
