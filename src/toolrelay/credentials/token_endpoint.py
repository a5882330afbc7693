"""One OAuth token request (RFC 6749 §5): form POST, JSON answer, retries for transient failures.

Only the endpoint's host and the OAuth ``error`` code ever reach messages or logs: token
responses and request bodies carry secrets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp

from toolrelay.dispatch.egress import unwrap_egress_error
from toolrelay.errors import CredentialError

__all__ = ["TokenRejected", "TokenResponse", "read_whole", "request_token"]

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024
_ERROR_CODE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# RFC 6749 A.12: an access token is printable ASCII. It goes into a header: anything else
# (a line break above all) is refused, not sent.
_ACCESS_TOKEN = re.compile(r"[\x20-\x7e]+")
MAX_LIFETIME_S = 365 * 24 * 3600  # a longer expires_in is read as a year


@dataclass(frozen=True)
class TokenResponse:
    access_token: str = field(repr=False)
    expires_in: float | None
    refresh_token: str | None = field(repr=False)
    scope: str | None = None  # what was granted, when the server says
    id_token: str | None = field(default=None, repr=False)  # OpenID Connect


class TokenRejected(CredentialError):
    """The endpoint answered with an OAuth error (4xx); retrying will not help."""

    def __init__(self, message: str, oauth_error: str | None) -> None:
        super().__init__(message)
        self.oauth_error = oauth_error


class _Transient(Exception):
    """A failure worth retrying: network error, timeout, 5xx, 429."""


async def request_token(
    http: aiohttp.ClientSession,
    url: str,
    form: Mapping[str, str],
    *,
    retry_delays: Sequence[float] = (0.2, 0.6),
    timeout: float = 10.0,
) -> TokenResponse:
    """POST ``form`` to the token endpoint; retry transient failures after each delay."""
    where = urlsplit(url).hostname or "?"
    last = "no attempt"
    for attempt, delay in enumerate([*retry_delays, None], start=1):
        try:
            return await _once(http, url, form, where, timeout)
        except _Transient as exc:
            last = str(exc)
        if delay is None:
            break
        log.warning("token endpoint %s: %s; retry %d in %.1fs", where, last, attempt, delay)
        await asyncio.sleep(delay)
    raise CredentialError(
        f"token endpoint {where} failed after {len(retry_delays) + 1} attempts: {last}"
    )


async def _once(
    http: aiohttp.ClientSession, url: str, form: Mapping[str, str], where: str, timeout: float
) -> TokenResponse:
    try:
        async with http.post(
            url,
            data=dict(form),
            headers={"Accept": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as resp:
            body = await read_whole(resp, MAX_RESPONSE_BYTES)
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        blocked = unwrap_egress_error(exc)
        if blocked is not None:
            raise blocked from None
        raise _Transient(f"network error ({type(exc).__name__})") from None
    if status >= 500 or status == 429:
        raise _Transient(f"HTTP {status}")
    if len(body) > MAX_RESPONSE_BYTES:
        raise CredentialError(f"token endpoint {where}: response larger than 64 KiB")
    data = _json(body)
    sent = [v for k, v in form.items() if k in _SECRET_FIELDS and len(v) >= _SECRET_MIN]
    if status != 200:
        code = _oauth_error(data, sent)
        shown = f" ({code})" if code else ""
        raise TokenRejected(f"token endpoint {where} refused: HTTP {status}{shown}", code)
    return _token_response(data, where, sent)


async def read_whole(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body to its end, or its first ``limit + 1`` bytes when it is longer. Not
    ``read(n)``: that returns what has arrived so far, one piece of a larger body, and a
    token answer cut there is "not JSON" (a refresh token the server just rotated lost)."""
    try:
        return await resp.content.readexactly(limit + 1)
    except asyncio.IncompleteReadError as short:
        return short.partial  # the whole body, within the limit


def _lifetime(value: Any) -> float | None:
    """``expires_in`` as seconds a datetime can take: a positive finite number (a string of
    digits too, as some servers send), at most MAX_LIFETIME_S; None (unknown) otherwise."""
    if isinstance(value, str) and value.isdigit() and len(value) <= 12:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return min(value, MAX_LIFETIME_S)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


# What a grant sends that the call's error must never quote (an endpoint may answer one as
# its error code); shorter values are ordinary words.
_SECRET_FIELDS: Final = frozenset(
    {"refresh_token", "client_secret", "assertion", "client_assertion", "code",
     "code_verifier", "password"}
)  # fmt: skip
_SECRET_MIN: Final = 8


def _oauth_error(data: Any, sent: Sequence[str] = ()) -> str | None:
    """The answer's OAuth error code, unless it holds (or is part of) a secret the grant
    sent: the code is quoted in the call's error, which the agent reads."""
    code = data.get("error") if isinstance(data, dict) else None
    if not isinstance(code, str) or not _ERROR_CODE.match(code):
        return None
    if any(s in code or (len(code) >= _SECRET_MIN and code in s) for s in sent):
        return None
    return code


def _token_response(data: Any, where: str, sent: Sequence[str] = ()) -> TokenResponse:
    if not isinstance(data, dict):
        raise CredentialError(f"token endpoint {where}: the answer is not a JSON object")
    if data.get("ok") is False:  # Slack: errors come with HTTP 200
        code = _oauth_error(data, sent)
        raise TokenRejected(f"token endpoint {where} refused: {code or 'ok: false'}", code)
    access = data.get("access_token")
    if not isinstance(access, str) or not access:
        raise CredentialError(f"token endpoint {where}: the answer has no access_token")
    if not _ACCESS_TOKEN.fullmatch(access):
        raise CredentialError(
            f"token endpoint {where}: the access_token is not printable ASCII (RFC 6749);"
            " it was not used"
        )
    expires_in = _lifetime(data.get("expires_in"))
    refresh = data.get("refresh_token")
    scope, id_token = data.get("scope"), data.get("id_token")
    return TokenResponse(
        access,
        expires_in,
        refresh if isinstance(refresh, str) and refresh else None,
        scope if isinstance(scope, str) and scope else None,
        id_token if isinstance(id_token, str) and id_token else None,
    )
