"""Service accounts: the JWT bearer grant (RFC 7523 §2.1) and a per-process token cache."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import aiohttp
import jwt

from toolrelay.credentials.formats import ServiceAccountSecret
from toolrelay.credentials.token_endpoint import request_token

__all__ = ["ASSERTION_LIFETIME", "JWT_BEARER", "ServiceAccountTokens", "build_assertion"]

log = logging.getLogger(__name__)

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ASSERTION_LIFETIME = 300
DEFAULT_TOKEN_LIFETIME = 300.0  # when the server does not say (expires_in is optional)


def build_assertion(secret: ServiceAccountSecret, now: float) -> str:
    claims: dict[str, Any] = {
        "iss": secret.issuer,
        "sub": secret.subject or secret.issuer,
        "aud": secret.audience,
        "iat": int(now),
        "exp": int(now) + ASSERTION_LIFETIME,
        "jti": str(uuid.uuid4()),
    }
    if secret.scopes:
        claims["scope"] = secret.scopes
    headers = {"kid": secret.key_id} if secret.key_id else None
    return jwt.encode(claims, secret.private_key, algorithm="RS256", headers=headers)


@dataclass
class _Cached:
    version: bytes  # the ciphertext nonce: a new secret invalidates the token
    token: str = field(repr=False)
    expires_at: float


class ServiceAccountTokens:
    """Access tokens per credential, reused until ``skew`` seconds before they expire."""

    def __init__(
        self,
        *,
        skew: float,
        retry_delays: Sequence[float],
        timeout: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._skew = skew
        self._retry_delays = retry_delays
        self._timeout = timeout
        self._clock = clock
        self._cache: dict[UUID, _Cached] = {}
        self._locks: dict[UUID, asyncio.Lock] = {}

    async def token(
        self,
        credential_id: UUID,
        version: bytes,
        load: Callable[[], ServiceAccountSecret],
        http: aiohttp.ClientSession,
    ) -> str:
        cached = self._fresh(credential_id, version)
        if cached is not None:
            return cached
        # One grant at a time per credential in this process; waiters reuse its token.
        async with self._locks.setdefault(credential_id, asyncio.Lock()):
            cached = self._fresh(credential_id, version)
            if cached is not None:
                return cached
            return await self._grant(credential_id, version, load(), http)

    def _fresh(self, credential_id: UUID, version: bytes) -> str | None:
        cached = self._cache.get(credential_id)
        if cached and cached.version == version and cached.expires_at - self._skew > self._clock():
            return cached.token
        return None

    async def _grant(
        self,
        credential_id: UUID,
        version: bytes,
        secret: ServiceAccountSecret,
        http: aiohttp.ClientSession,
    ) -> str:
        now = self._clock()
        form = {"grant_type": JWT_BEARER, "assertion": build_assertion(secret, now)}
        response = await request_token(
            http, secret.token_url, form, retry_delays=self._retry_delays, timeout=self._timeout
        )
        lifetime = (
            response.expires_in if response.expires_in is not None else DEFAULT_TOKEN_LIFETIME
        )
        self._cache[credential_id] = _Cached(version, response.access_token, now + lifetime)
        log.info("service account credential %s: new access token for %ds", credential_id, lifetime)
        return response.access_token
