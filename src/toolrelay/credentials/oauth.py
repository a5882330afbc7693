"""OAuth 2.0 refresh_token grant (RFC 6749 §6), client authentication in the body."""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp

from toolrelay.credentials.formats import OAuthSecret
from toolrelay.credentials.token_endpoint import TokenRejected, TokenResponse, request_token

__all__ = ["InvalidGrant", "refresh_access_token"]


class InvalidGrant(Exception):
    """The refresh token is no longer valid: a human has to authorize again."""


async def refresh_access_token(
    http: aiohttp.ClientSession,
    secret: OAuthSecret,
    *,
    retry_delays: Sequence[float],
    timeout: float,
) -> TokenResponse:
    if secret.refresh_token is None or secret.token_url is None or secret.client_id is None:
        raise InvalidGrant("no refresh token")
    form = {
        "grant_type": "refresh_token",
        "refresh_token": secret.refresh_token,
        "client_id": secret.client_id,
    }
    if secret.client_secret:
        form["client_secret"] = secret.client_secret
    if secret.scope:
        form["scope"] = secret.scope  # the scope originally granted (RFC 6749 §6 allows it)
    try:
        return await request_token(
            http, secret.token_url, form, retry_delays=retry_delays, timeout=timeout
        )
    except TokenRejected as exc:
        if exc.oauth_error == "invalid_grant":
            raise InvalidGrant(exc.message) from None
        raise
