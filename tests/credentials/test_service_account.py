"""Service accounts: a JWT bearer grant verified by a real token endpoint on 127.0.0.1."""

from __future__ import annotations

import json
from uuid import UUID

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.credentials.helpers import rsa_pem, rsa_private_key, service_account_secret
from tests.credentials.token_server import TokenServer
from toolrelay.credentials import CredentialResolver, CredentialStore
from toolrelay.credentials.service_account import JWT_BEARER
from toolrelay.errors import CredentialError

HOST = "api.example.com"


@pytest.fixture
def sa_server(token_server: TokenServer) -> TokenServer:
    token_server.sa_public_key = rsa_private_key().public_key()
    token_server.sa_audience = token_server.url
    return token_server


async def test_signed_assertion_and_cached_token(
    store: CredentialStore,
    resolver: CredentialResolver,
    sa_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    secret = service_account_secret(sa_server.url)
    cid = store.add(owner_a, "service_account", "robot", json.dumps(secret), [HOST])

    token = await resolver.resolve(cid, HOST, 443, http)
    assert token == sa_server.issued[0]
    [request] = sa_server.requests
    assert request["grant_type"] == JWT_BEARER
    [claims] = sa_server.assertions  # verified: signature, audience, expiry
    assert claims["iss"] == claims["sub"] == "robot@example.iam"
    assert claims["aud"] == sa_server.url
    assert claims["exp"] - claims["iat"] == 300
    assert claims["scope"] == "https://api.example.com/auth/posts"

    assert await resolver.resolve(cid, HOST, 443, http) == token  # cached
    assert len(sa_server.requests) == 1


async def test_subject_audience_and_key_id(
    store: CredentialStore,
    resolver: CredentialResolver,
    sa_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    sa_server.sa_audience = "https://issuer.example/"
    secret = service_account_secret(
        sa_server.url, subject="user@example.com", audience="https://issuer.example/",
        key_id="key-7", scopes="a  b",
    )  # fmt: skip
    cid = store.add(owner_a, "service_account", "delegated", json.dumps(secret), [HOST])
    await resolver.resolve(cid, HOST, 443, http)
    [claims] = sa_server.assertions
    assert (claims["sub"], claims["aud"], claims["scope"]) == (
        "user@example.com",
        "https://issuer.example/",
        "a b",
    )


async def test_wrong_key_refused_by_endpoint(
    store: CredentialStore,
    resolver: CredentialResolver,
    sa_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    secret = service_account_secret(sa_server.url, private_key=rsa_pem(other))
    cid = store.add(owner_a, "service_account", "wrong-key", json.dumps(secret), [HOST])
    with pytest.raises(CredentialError, match=r"HTTP 400 \(invalid_grant\)"):
        await resolver.resolve(cid, HOST, 443, http)
    assert sa_server.assertions == []


async def test_short_lived_token_not_reused_and_rotation_invalidates_cache(
    store: CredentialStore,
    resolver: CredentialResolver,
    sa_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid = store.add(
        owner_a, "service_account", "short", json.dumps(service_account_secret(sa_server.url)),
        [HOST],
    )  # fmt: skip
    sa_server.expires_in = 30  # inside the 60 s skew: never worth caching
    await resolver.resolve(cid, HOST, 443, http)
    await resolver.resolve(cid, HOST, 443, http)
    assert len(sa_server.requests) == 2

    sa_server.expires_in = 3600
    cached = await resolver.resolve(cid, HOST, 443, http)
    assert await resolver.resolve(cid, HOST, 443, http) == cached
    assert len(sa_server.requests) == 3
    store.rotate(owner_a, cid, json.dumps(service_account_secret(sa_server.url)))
    assert await resolver.resolve(cid, HOST, 443, http) != cached
    assert len(sa_server.requests) == 4
