"""Secret input formats per kind, validated; the encrypted payload is their JSON.

Error messages name fields, never values.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from toolrelay.errors import CredentialError, InvalidArgument

__all__ = [
    "KINDS",
    "ApiKeySecret",
    "BasicSecret",
    "OAuthSecret",
    "ParsedSecret",
    "Secret",
    "ServiceAccountSecret",
    "basic_value",
    "decode_secret",
    "encode_secret",
    "parse_secret",
]

KINDS = ("api_key", "oauth", "service_account", "basic")


@dataclass(frozen=True)
class ApiKeySecret:
    value: str = field(repr=False)


@dataclass(frozen=True)
class OAuthSecret:
    access_token: str | None = field(repr=False)
    refresh_token: str | None = field(repr=False)
    token_url: str | None
    client_id: str | None
    client_secret: str | None = field(repr=False)
    scope: str | None


@dataclass(frozen=True)
class ServiceAccountSecret:
    private_key: str = field(repr=False)
    issuer: str
    subject: str | None
    token_url: str
    scopes: str
    audience: str
    key_id: str | None = None


@dataclass(frozen=True)
class BasicSecret:
    """HTTP basic (RFC 7617): sent as ``Basic base64(username:password)``."""

    username: str
    password: str = field(repr=False)


Secret = ApiKeySecret | OAuthSecret | ServiceAccountSecret | BasicSecret


@dataclass(frozen=True)
class ParsedSecret:
    secret: Secret
    expires_at: datetime | None = None  # the oauth access token's, stored as metadata


# token_type is accepted (a pasted token response has it) and ignored.
_OAUTH_FIELDS = {
    "access_token",
    "refresh_token",
    "expires_at",
    "expires_in",
    "token_url",
    "client_id",
    "client_secret",
    "scope",
    "token_type",
}
_SA_FIELDS = {
    "private_key",
    "issuer",
    "subject",
    "token_url",
    "scopes",
    "scope",
    "audience",
    "key_id",
}


def parse_secret(kind: str, text: str, now: datetime | None = None) -> ParsedSecret:
    """Validate the secret as given by an owner (the raw string, or JSON for token kinds)."""
    if kind == "api_key":
        return ParsedSecret(_parse_api_key(text))
    if kind == "oauth":
        return _parse_oauth(_json_object(kind, text, _OAUTH_FIELDS), now or datetime.now(UTC))
    if kind == "service_account":
        return ParsedSecret(_parse_service_account(_json_object(kind, text, _SA_FIELDS)))
    if kind == "basic":
        return ParsedSecret(_parse_basic(_json_object(kind, text, {"username", "password"})))
    raise InvalidArgument(f"unknown credential kind {kind!r}; use one of {', '.join(KINDS)}")


def encode_secret(secret: Secret) -> bytes:
    return json.dumps(asdict(secret), separators=(",", ":")).encode()


def decode_secret(kind: str, data: bytes) -> Secret:
    try:
        fields = json.loads(data)
        if kind == "api_key":
            return ApiKeySecret(**fields)
        if kind == "oauth":
            return OAuthSecret(**fields)
        if kind == "basic":
            return BasicSecret(**fields)
        return ServiceAccountSecret(**fields)
    except (ValueError, TypeError):
        raise CredentialError(f"stored {kind} secret has an unexpected shape") from None


def basic_value(secret: BasicSecret) -> str:
    """What follows ``Basic `` in the header: base64 of ``username:password`` in UTF-8."""
    return base64.b64encode(f"{secret.username}:{secret.password}".encode()).decode("ascii")


def with_tokens(secret: OAuthSecret, access_token: str, refresh_token: str | None) -> OAuthSecret:
    """The secret after a refresh; a refresh token is replaced only when the server rotated it."""
    return replace(
        secret, access_token=access_token, refresh_token=refresh_token or secret.refresh_token
    )


def _parse_api_key(text: str) -> ApiKeySecret:
    if not text:
        raise InvalidArgument("api_key: the secret is empty")
    if not text.strip():  # a rotation piped an unset variable: the old secret would be gone
        raise InvalidArgument("api_key: the secret is only spaces or tabs")
    if any(ch in text for ch in "\r\n\0"):
        raise InvalidArgument("api_key: the secret contains a line break or NUL")
    return ApiKeySecret(text)


def _parse_basic(obj: dict[str, Any]) -> BasicSecret:
    username, password = obj.get("username"), obj.get("password")
    if not isinstance(username, str) or not isinstance(password, str) or not password:
        raise InvalidArgument(
            "basic: fields 'username' and 'password' must be strings, the password not empty"
        )
    if ":" in username:  # RFC 7617: the first colon ends the user-id
        raise InvalidArgument("basic: the username must not contain ':'")
    if any(ch in username + password for ch in "\r\n\0"):
        raise InvalidArgument("basic: the username or password contains a line break or NUL")
    return BasicSecret(username, password)


def _json_object(kind: str, text: str, allowed: set[str]) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f"{kind}: the secret must be a JSON object (invalid JSON at line {exc.lineno} "
            f"column {exc.colno})"
        ) from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{kind}: the secret must be a JSON object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise InvalidArgument(
            f"{kind}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )
    return value


def _parse_oauth(obj: dict[str, Any], now: datetime) -> ParsedSecret:
    access = _opt_str("oauth", obj, "access_token")
    refresh = _opt_str("oauth", obj, "refresh_token")
    if access is None and refresh is None:
        raise InvalidArgument(
            "oauth: missing field 'access_token' (or give 'refresh_token' to obtain one)"
        )
    token_url = _opt_url("oauth", obj, "token_url")
    client_id = _opt_str("oauth", obj, "client_id")
    if refresh is not None and token_url is None:
        raise InvalidArgument("oauth: missing field 'token_url' (needed to refresh)")
    if refresh is not None and client_id is None:
        raise InvalidArgument("oauth: missing field 'client_id' (needed to refresh)")
    secret = OAuthSecret(
        access_token=access,
        refresh_token=refresh,
        token_url=token_url,
        client_id=client_id,
        client_secret=_opt_str("oauth", obj, "client_secret"),
        scope=_scope("oauth", obj, "scope") or None,
    )
    return ParsedSecret(secret, _expiry(obj, now) if access is not None else None)


def _parse_service_account(obj: dict[str, Any]) -> ServiceAccountSecret:
    private_key = _req_str("service_account", obj, "private_key")
    try:
        loaded = load_pem_private_key(private_key.encode(), password=None)
    except (ValueError, TypeError):
        loaded = None
    if not isinstance(loaded, RSAPrivateKey):
        raise InvalidArgument(
            "service_account: field 'private_key' is not an unencrypted PEM RSA private key"
        )
    if "scope" in obj and "scopes" in obj:
        raise InvalidArgument("service_account: give 'scopes' or 'scope', not both")
    token_url = _opt_url("service_account", obj, "token_url")
    if token_url is None:
        raise InvalidArgument("service_account: missing field 'token_url'")
    return ServiceAccountSecret(
        private_key=private_key,
        issuer=_req_str("service_account", obj, "issuer"),
        subject=_opt_str("service_account", obj, "subject"),
        token_url=token_url,
        scopes=_scope("service_account", obj, "scopes" if "scopes" in obj else "scope"),
        audience=_opt_str("service_account", obj, "audience") or token_url,
        key_id=_opt_str("service_account", obj, "key_id"),
    )


def _opt_str(kind: str, obj: dict[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{kind}: field {name!r} must be a non-empty string")
    return value


def _req_str(kind: str, obj: dict[str, Any], name: str) -> str:
    value = _opt_str(kind, obj, name)
    if value is None:
        raise InvalidArgument(f"{kind}: missing field {name!r}")
    return value


def _opt_url(kind: str, obj: dict[str, Any], name: str) -> str | None:
    value = _opt_str(kind, obj, name)
    if value is not None:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"{kind}: field {name!r} must be an http(s) URL")
    return value


def _scope(kind: str, obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if value is None:
        return ""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return " ".join(value)
    raise InvalidArgument(f"{kind}: field {name!r} must be a string or a list of strings")


def _expiry(obj: dict[str, Any], now: datetime) -> datetime | None:
    if "expires_at" in obj and "expires_in" in obj:
        raise InvalidArgument("oauth: give 'expires_at' or 'expires_in', not both")
    if obj.get("expires_in") is not None:
        seconds = obj["expires_in"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise InvalidArgument("oauth: field 'expires_in' must be a number of seconds")
        return now + timedelta(seconds=seconds)
    value = obj.get("expires_at")
    if value is None:
        return None  # unknown: the access token is used as it is, never refreshed early
    return parse_timestamp(value, "oauth: field 'expires_at'")


def parse_timestamp(value: object, what: str) -> datetime:
    """An ISO 8601 string or a Unix epoch (number or digits) as an aware UTC datetime."""
    if isinstance(value, str) and value.strip().replace(".", "", 1).isdigit():
        value = float(value)
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, str):
            parsed = datetime.fromisoformat(value.strip())
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        pass
    raise InvalidArgument(f"{what} must be an ISO 8601 time or a Unix epoch")
