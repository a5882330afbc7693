"""Connecting an account: the OAuth authorization code flow with PKCE (S256) that makes an
``oauth`` credential without pasting tokens (issue 17; docs/credentials.md).

Providers are data: one JSON file each in ``providers/`` (GitHub, Google, Slack, Microsoft,
generic OpenID Connect discovery), plus any in TOOLRELAY_OAUTH_PROVIDERS_DIR; adding a
provider is a file. Every call to a provider (discovery, keys, the code exchange) goes
through the egress guard, as tool calls do: endpoints come from an owner's configuration.
The code is exchanged once (no retry: a code is single use); the tokens become the same
sealed ``oauth`` secret a pasted one is, refreshed by the dispatcher as before.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

import aiohttp
import jwt

from toolrelay.credentials.token_endpoint import TokenRejected, read_whole, request_token
from toolrelay.dispatch.egress import unwrap_egress_error
from toolrelay.errors import CredentialError, EgressBlocked, InvalidArgument, ToolrelayError

PROVIDERS_DIR: Final = Path(__file__).parent / "providers"
PROVIDERS_ENV: Final = "TOOLRELAY_OAUTH_PROVIDERS_DIR"
_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_PARAM: Final = re.compile(r"\{([a-z_]+)\}")
ID_TOKEN_LEEWAY_S: Final = 60
HTTP_TIMEOUT_S: Final = 10.0
MAX_DOC_BYTES: Final = 1 << 20


class ConnectError(ToolrelayError):
    """A connect flow that did not complete; nothing was stored. The message says why."""

    code = "connect_failed"


@dataclass(frozen=True)
class Preset:
    """A provider's endpoints and quirks, as its file says."""

    name: str
    title: str
    authorization_endpoint: str | None = None
    token_endpoint: str | None = None
    issuer: str | None = None
    discovery: bool = False
    default_scopes: tuple[str, ...] = ()
    scope_separator: str = " "
    pkce: bool = True
    authorization_params: Mapping[str, str] = field(default_factory=dict)
    parameters: Mapping[str, str] = field(default_factory=dict)  # {name} in the endpoints
    allowed_hosts: tuple[str, ...] = ()
    notes: str = ""


def _directories() -> list[Path]:
    extra = os.environ.get(PROVIDERS_ENV, "").strip()
    return [Path(extra), PROVIDERS_DIR] if extra else [PROVIDERS_DIR]  # the operator's first


def presets() -> list[str]:
    names = {p.stem for d in _directories() if d.is_dir() for p in d.glob("*.json")}
    return sorted(n for n in names if _NAME.match(n))


def preset(name: str) -> Preset:
    """The provider named ``name``; InvalidArgument listing the known ones otherwise."""
    if not _NAME.match(name):
        raise InvalidArgument(f"not a provider name: {name!r}")
    for directory in _directories():
        path = directory / f"{name}.json"
        if path.is_file():
            return _parse(name, path)
    raise InvalidArgument(f"unknown provider {name!r}; known: {', '.join(presets())}")


def _parse(name: str, path: Path) -> Preset:
    try:
        raw = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"provider file {path}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise InvalidArgument(f"provider file {path}: not a JSON object")
    known = set(Preset.__dataclass_fields__) - {"name"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidArgument(f"provider file {path}: unknown field(s) {', '.join(unknown)}")
    values: dict[str, Any] = dict(raw)
    for key in ("default_scopes", "allowed_hosts"):
        values[key] = tuple(values.get(key, ()))
    made = Preset(name=name, **values)
    if not made.discovery and not (made.authorization_endpoint and made.token_endpoint):
        raise InvalidArgument(
            f"provider file {path}: give authorization_endpoint and token_endpoint, or"
            " discovery: true"
        )
    return made


@dataclass(frozen=True)
class Endpoints:
    authorization: str
    token: str
    issuer: str | None  # set when ID tokens can be checked
    jwks_uri: str | None = None


@dataclass(frozen=True)
class Connection:
    """What one connect asks for. ``client_secret`` is the owner's app secret."""

    preset: Preset
    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    scopes: tuple[str, ...] = ()
    issuer: str | None = None  # for discovery
    parameters: Mapping[str, str] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        return self.preset.scope_separator.join(self.scopes or self.preset.default_scopes)

    @property
    def wants_id_token(self) -> bool:
        return "openid" in (self.scopes or self.preset.default_scopes)


@dataclass(frozen=True)
class Started:
    url: str
    state: str
    nonce: str
    code_verifier: str = field(repr=False)
    redirect_uri: str = ""
    endpoints: Endpoints | None = None


def _fill(template: str, connection: Connection) -> str:
    values = {**connection.preset.parameters, **connection.parameters}

    def one(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise InvalidArgument(f"provider {connection.preset.name} needs --param {key}=...")
        value = values[key]
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", value):
            raise InvalidArgument(f"--param {key}: not a plain value: {value!r}")
        return value

    return _PARAM.sub(one, template)


async def endpoints(http: aiohttp.ClientSession, connection: Connection) -> Endpoints:
    """The provider's endpoints: from its file, or its discovery document."""
    chosen = connection.preset
    if not chosen.discovery:
        assert chosen.authorization_endpoint and chosen.token_endpoint
        return Endpoints(
            _fill(chosen.authorization_endpoint, connection),
            _fill(chosen.token_endpoint, connection),
            chosen.issuer,
        )
    issuer = (connection.issuer or chosen.issuer or "").rstrip("/")
    if not issuer.startswith(("https://", "http://")):
        raise InvalidArgument(f"provider {chosen.name} needs --issuer (an https URL)")
    doc = await _get_json(http, f"{issuer}/.well-known/openid-configuration", "discovery")
    if not isinstance(doc, dict) or doc.get("issuer") != issuer:
        raise ConnectError(f"the discovery document at {issuer} names another issuer")
    found = {k: doc.get(k) for k in ("authorization_endpoint", "token_endpoint", "jwks_uri")}
    if not all(
        isinstance(v, str) and v.startswith(("https://", "http://")) for v in found.values()
    ):
        raise ConnectError(f"the discovery document at {issuer} lacks an endpoint")
    return Endpoints(
        str(found["authorization_endpoint"]), str(found["token_endpoint"]), issuer,
        str(found["jwks_uri"]),
    )  # fmt: skip


def challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


async def start(http: aiohttp.ClientSession, connection: Connection, redirect_uri: str) -> Started:
    found = await endpoints(http, connection)
    state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    verifier = secrets.token_urlsafe(48)
    params: dict[str, str] = {
        **connection.preset.authorization_params,
        "response_type": "code",
        "client_id": connection.client_id,
        "redirect_uri": redirect_uri,
        "scope": connection.scope,
        "state": state,
    }
    if connection.wants_id_token:
        params["nonce"] = nonce
    if connection.preset.pkce:
        params.update(code_challenge=challenge(verifier), code_challenge_method="S256")
    separator = "&" if "?" in found.authorization else "?"
    url = f"{found.authorization}{separator}{urlencode(params)}"
    return Started(url, state, nonce, verifier, redirect_uri, found)


async def exchange(
    http: aiohttp.ClientSession,
    connection: Connection,
    started: Started,
    code: str,
) -> str:
    """Exchange ``code`` once; the ``oauth`` secret (JSON) to store. ConnectError saying why
    otherwise (the provider's OAuth error code, never its body)."""
    found = started.endpoints or await endpoints(http, connection)
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": started.redirect_uri,
        "client_id": connection.client_id,
    }
    if connection.client_secret:
        form["client_secret"] = connection.client_secret
    if connection.preset.pkce:
        form["code_verifier"] = started.code_verifier
    try:
        tokens = await request_token(http, found.token, form, retry_delays=())
    except TokenRejected as exc:
        raise ConnectError(
            f"the provider refused the code: {exc.oauth_error or exc.message}"
        ) from None
    except (CredentialError, EgressBlocked) as exc:
        raise ConnectError(exc.message) from None
    if tokens.id_token is not None and connection.wants_id_token and found.issuer:
        await _check_id_token(http, found, connection.client_id, tokens.id_token, started.nonce)
    secret: dict[str, Any] = {
        "access_token": tokens.access_token,
        "token_url": found.token,
        "client_id": connection.client_id,
    }
    if tokens.refresh_token:
        secret["refresh_token"] = tokens.refresh_token
    if connection.client_secret:
        secret["client_secret"] = connection.client_secret
    if tokens.expires_in is not None:
        secret["expires_in"] = tokens.expires_in
    granted = tokens.scope or connection.scope
    if granted:
        secret["scope"] = granted.replace(",", " ")
    return json.dumps(secret)


async def _check_id_token(
    http: aiohttp.ClientSession, found: Endpoints, client_id: str, token: str, nonce: str
) -> None:
    """OIDC Core 3.1.3.7 for the ID token a connect brings: signature, iss, aud, exp, nonce."""
    jwks_uri = found.jwks_uri
    if jwks_uri is None:
        assert found.issuer is not None
        doc = await _get_json(http, f"{found.issuer}/.well-known/openid-configuration", "discovery")
        jwks_uri = doc.get("jwks_uri") if isinstance(doc, dict) else None
        if not isinstance(jwks_uri, str):
            raise ConnectError("the provider's discovery document has no jwks_uri")
    try:
        header = jwt.get_unverified_header(token)
        keys = jwt.PyJWKSet.from_dict(await _get_json(http, jwks_uri, "signing keys"))
        alg = header.get("alg")
        if alg in (None, "none") or str(alg).startswith("HS"):
            raise ConnectError(f"the ID token is signed with {alg!r}, which is not accepted")
        key = next((k for k in keys.keys if k.key_id == header.get("kid")), None)
        if key is None:
            raise ConnectError("the ID token is signed with a key the provider does not list")
        claims = jwt.decode(
            token, key, algorithms=[str(alg)], audience=client_id, issuer=found.issuer,
            leeway=ID_TOKEN_LEEWAY_S, options={"require": ["iss", "aud", "exp", "iat"]},
        )  # fmt: skip
    except jwt.PyJWTError as exc:
        raise ConnectError(f"the ID token is not valid: {exc}") from None
    if not isinstance(claims.get("nonce"), str) or not secrets.compare_digest(
        claims["nonce"], nonce
    ):
        raise ConnectError("the ID token's nonce does not match this connect (a replay?)")


async def _get_json(http: aiohttp.ClientSession, url: str, what: str) -> Any:
    where = urlsplit(url).hostname or "?"
    try:
        async with http.get(
            url, allow_redirects=False, headers={"Accept": "application/json"},
            timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S),
        ) as response:  # fmt: skip
            body = await read_whole(response, MAX_DOC_BYTES)
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        blocked = unwrap_egress_error(exc)
        if blocked is not None:
            raise ConnectError(f"the provider's {what} at {where}: {blocked.message}") from None
        raise ConnectError(f"the provider's {what} at {where} could not be reached") from None
    if status != 200 or len(body) > MAX_DOC_BYTES:
        raise ConnectError(f"the provider's {what} at {where} answered HTTP {status}")
    try:
        return json.loads(body)
    except ValueError:
        raise ConnectError(f"the provider's {what} at {where} is not JSON") from None


def scopes_of(values: Sequence[str]) -> tuple[str, ...]:
    """--scope values, each possibly several separated by spaces or commas."""
    return tuple(s for v in values for s in re.split(r"[\s,]+", v) if s)
