"""How an imported operation's credential is placed: from the document's security schemes,
or from ``--auth`` when the document declares none (``toolrelay import openapi``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from toolrelay.errors import InvalidArgument

__all__ = ["AUTH_SCHEMES", "Auth", "fitting", "parse_auth", "placeable"]

AUTH_SCHEMES: Final = "bearer, oauth, basic, header:NAME or query:NAME"
BEARER: Final = "Bearer "


@dataclass(frozen=True)
class Auth:
    method: str = "none"
    placement: str | None = None
    name: str | None = None
    prefix: str | None = None


# RFC 7617: a credential of kind basic, sent as ``Authorization: Basic base64(user:password)``
# (the dispatcher adds ``Basic `` and encodes; the tool keeps no prefix of its own).
BASIC: Final = Auth("basic", "header", "Authorization", None)


def parse_auth(text: str) -> Auth:
    """``--auth``: ``bearer`` (``Authorization: Bearer …``), ``oauth`` (the same, an OAuth
    credential), ``basic`` (``Authorization: Basic …``, a basic credential), ``header:NAME``
    or ``query:NAME`` (the key as is, in that header or query parameter)."""
    kind, _, name = text.strip().partition(":")
    kind = kind.lower()
    if kind == "bearer" and not name:
        return Auth("api_key", "header", "Authorization", BEARER)
    if kind == "oauth" and not name:
        return Auth("oauth", "header", "Authorization", BEARER)
    if kind == "basic" and not name:
        return BASIC
    if kind in ("header", "query") and name.strip():
        return Auth("api_key", kind, name.strip(), "")
    raise InvalidArgument(f"--auth {text!r}: expected {AUTH_SCHEMES}")


def placeable(scheme: Any) -> Auth | None:
    """How toolrelay places a credential for this security scheme, or None if it cannot."""
    if not isinstance(scheme, Mapping):
        raise InvalidArgument("a security scheme must be an object")
    kind = scheme.get("type")
    if kind == "apiKey":
        where, name = scheme.get("in"), scheme.get("name")
        if where in ("header", "query") and isinstance(name, str) and name:
            return Auth("api_key", where, name, "")
        return None
    if kind == "http":
        http = str(scheme.get("scheme", "")).lower()
        if http == "bearer":
            return Auth("api_key", "header", "Authorization", BEARER)
        if http == "basic":
            return BASIC
        return None
    if kind in ("oauth2", "openIdConnect"):
        return Auth("oauth", "header", "Authorization", BEARER)
    return None


def fitting(candidates: Sequence[Auth], kind: str | None) -> Auth:
    """The first candidate a credential of this kind fits, else the first candidate. An HTTP
    bearer scheme also takes an OAuth credential (its access token is a bearer token); an
    OAuth 2 scheme does not take an API key (a key for another scheme, most likely)."""
    if kind is not None:
        for auth in candidates:
            if auth.method == kind:
                return auth
        for auth in candidates:
            if auth.method == "api_key" and auth.prefix == BEARER and kind == "oauth":
                return replace(auth, method="oauth")
    return candidates[0]
