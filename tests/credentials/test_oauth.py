"""OAuth credentials against a real token endpoint on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import aiohttp
import pytest

from tests.credentials.conftest import dispatcher_pool
from tests.credentials.helpers import oauth_secret
from tests.credentials.token_server import SplitAnswer, TokenServer
from toolrelay.credentials import CredentialResolver, CredentialStore, Keyring
from toolrelay.credentials.token_endpoint import request_token
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy, make_connector
from toolrelay.errors import CredentialError, CredentialNeedsReauth, EgressBlocked

HOST = "api.example.com"
EXPIRED = time.time() - 600


def add_oauth(
    store: CredentialStore,
    owner: UUID,
    server: TokenServer,
    *,
    expires_at: float = EXPIRED,
    access_token: str | None = None,
) -> tuple[UUID, str]:
    refresh = server.new_refresh_token()
    secret = oauth_secret(
        server.url, server.client_id, server.client_secret, refresh,
        expires_at=expires_at, access_token=access_token,
    )  # fmt: skip
    return store.add(owner, "oauth", f"oauth-{refresh[-8:]}", json.dumps(secret), [HOST]), refresh


def status_and_expiry(database: Database, cid: UUID) -> tuple[str, datetime | None]:
    with database.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT status, expires_at FROM agents.credentials WHERE id = %s", (cid,)
        ).fetchone()
    assert row is not None
    return row["status"], row["expires_at"]


def expire(database: Database, cid: UUID) -> None:
    with database.as_dispatcher() as conn:
        conn.execute(
            "UPDATE agents.credentials SET expires_at = now() - interval '1 minute' WHERE id = %s",
            (cid,),
        )


async def test_fresh_token_used_without_refresh(
    store: CredentialStore,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid, _ = add_oauth(store, owner_a, token_server, expires_at=time.time() + 3600,
                       access_token="current-access")  # fmt: skip
    assert await resolver.resolve(cid, HOST, 443, http) == "current-access"
    assert token_server.requests == []


async def test_refresh_within_skew(
    store: CredentialStore,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid, _ = add_oauth(store, owner_a, token_server, expires_at=time.time() + 30)
    token = await resolver.resolve(cid, HOST, 443, http)
    assert token == token_server.issued[-1]


async def test_refresh_on_expiry_and_rotation_persisted(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    token_server.rotate_refresh_tokens = True
    cid, first_refresh = add_oauth(store, owner_a, token_server)

    token1 = await resolver.resolve(cid, HOST, 443, http)
    assert token1 == token_server.issued[-1]
    [grant] = token_server.requests
    assert grant == {
        "grant_type": "refresh_token",
        "refresh_token": first_refresh,
        "client_id": token_server.client_id,
        "client_secret": token_server.client_secret,
        "scope": "posts.write posts.read",
    }
    status, expires_at = status_and_expiry(database, cid)
    assert status == "active" and expires_at is not None
    assert abs(expires_at - (datetime.now(UTC) + timedelta(seconds=3600))) < timedelta(seconds=30)
    assert await resolver.resolve(cid, HOST, 443, http) == token1  # persisted: no new request
    assert len(token_server.requests) == 1

    # Next refresh must use the rotated refresh token (the old one is now invalid_grant).
    expire(database, cid)
    token2 = await resolver.resolve(cid, HOST, 443, http)
    assert token2 != token1
    second = token_server.requests[1]["refresh_token"]
    assert second != first_refresh and second not in token_server.refresh_tokens
    assert status_and_expiry(database, cid)[0] == "active"


@pytest.mark.parametrize("autocommit", [True, False])
async def test_concurrent_resolutions_refresh_once(
    autocommit: bool,
    store: CredentialStore,
    cred_db: str,
    keyring: Keyring,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    token_server.delay = 0.3  # both resolvers see the expired token before either finishes
    cid, _ = add_oauth(store, owner_a, token_server)
    # Two pools and two resolvers: as two worker processes would be.
    async with (
        dispatcher_pool(cred_db, autocommit) as pool1,
        dispatcher_pool(cred_db, autocommit) as pool2,
    ):
        r1, r2 = CredentialResolver(pool1, keyring), CredentialResolver(pool2, keyring)
        tokens = await asyncio.gather(
            r1.resolve(cid, HOST, 443, http),
            r2.resolve(cid, HOST, 443, http),
            r1.resolve(cid, HOST, 443, http),
        )
    assert len(token_server.requests) == 1
    assert set(tokens) == {token_server.issued[0]}


@pytest.mark.parametrize("autocommit", [True, False])
async def test_invalid_grant_marks_needs_reauth(
    store: CredentialStore,
    database: Database,
    cred_db: str,
    keyring: Keyring,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
    autocommit: bool,
) -> None:
    async with dispatcher_pool(cred_db, autocommit=autocommit) as pool:
        await _invalid_grant_marks_needs_reauth(
            store, database, CredentialResolver(pool, keyring), token_server, owner_a, http
        )


async def _invalid_grant_marks_needs_reauth(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid, refresh = add_oauth(store, owner_a, token_server)
    token_server.refresh_tokens.discard(refresh)  # revoked at the provider
    with pytest.raises(CredentialNeedsReauth, match="invalid_grant") as info:
        await resolver.resolve(cid, HOST, 443, http)
    assert refresh not in info.value.message
    assert status_and_expiry(database, cid)[0] == "needs_reauth"  # committed
    with pytest.raises(CredentialNeedsReauth, match="needs_reauth"):
        await resolver.resolve(cid, HOST, 443, http)
    assert len(token_server.requests) == 1  # not retried: a human has to act

    # Re-authorizing (rotate with new tokens) makes it usable again, same id.
    new = oauth_secret(token_server.url, token_server.client_id, token_server.client_secret,
                       token_server.new_refresh_token(), expires_at=EXPIRED)  # fmt: skip
    store.rotate(owner_a, cid, json.dumps(new))
    assert await resolver.resolve(cid, HOST, 443, http) == token_server.issued[-1]


async def test_expired_without_refresh_token_needs_reauth(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    secret = {"access_token": "old", "expires_at": EXPIRED, "client_id": "c"}
    cid = store.add(owner_a, "oauth", "no-refresh", json.dumps(secret), [HOST])
    with pytest.raises(CredentialNeedsReauth, match="no refresh token"):
        await resolver.resolve(cid, HOST, 443, http)
    assert status_and_expiry(database, cid)[0] == "needs_reauth"


async def test_5xx_then_200_is_retried(
    store: CredentialStore,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid, _ = add_oauth(store, owner_a, token_server)
    token_server.queued = [(503, {"error": "temporarily_unavailable"}), (502, {})]
    assert await resolver.resolve(cid, HOST, 443, http) == token_server.issued[-1]
    assert len(token_server.requests) == 3


async def test_persistent_5xx_is_a_credential_error(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid, refresh = add_oauth(store, owner_a, token_server)
    token_server.queued = [(500, {})] * 3
    with pytest.raises(CredentialError, match="failed after 3 attempts: HTTP 500") as info:
        await resolver.resolve(cid, HOST, 443, http)
    assert not isinstance(info.value, CredentialNeedsReauth)
    assert status_and_expiry(database, cid)[0] == "active"  # transient: nothing changed
    assert await resolver.resolve(cid, HOST, 443, http) == token_server.issued[-1]
    assert token_server.requests[-1]["refresh_token"] == refresh


async def test_network_error_retried_then_reported(
    store: CredentialStore, resolver: CredentialResolver, owner_a: UUID, http: Any
) -> None:
    secret = oauth_secret("http://127.0.0.1:9/token", "c", "s", "r", expires_at=EXPIRED)
    cid = store.add(owner_a, "oauth", "unreachable", json.dumps(secret), [HOST])
    with pytest.raises(CredentialError, match="127.0.0.1 failed after 3 attempts: network"):
        await resolver.resolve(cid, HOST, 443, http)


async def test_other_oauth_errors_do_not_disable(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid, _ = add_oauth(store, owner_a, token_server)
    token_server.client_secret = "changed-at-provider"
    with pytest.raises(CredentialError, match=r"refused: HTTP 401 \(invalid_client\)"):
        await resolver.resolve(cid, HOST, 443, http)
    assert status_and_expiry(database, cid)[0] == "active"


async def test_egress_guard_refusal_is_not_retried(
    store: CredentialStore,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
) -> None:
    cid, _ = add_oauth(store, owner_a, token_server)
    policy = EgressPolicy.from_env({})  # 127.0.0.1 is not public: blocked
    async with aiohttp.ClientSession(connector=make_connector(policy)) as guarded:
        with pytest.raises(EgressBlocked):
            await resolver.resolve(cid, HOST, 443, guarded)
    assert token_server.requests == []


# What a token endpoint may answer that no header or datetime can take. The access token
# goes into a header: a line break there is header injection (aiohttp refuses to send it, and
# the call failed as a network error). A lifetime a datetime cannot add made the refreshed
# tokens unstorable: a refresh token the server had just rotated was lost with them.
@pytest.mark.parametrize("access", ["tok\r\nX-Injected: 1", "tok\x00", "t\u00f6k"])
async def test_an_access_token_that_is_not_printable_ascii_is_refused(
    access: str,
    store: CredentialStore,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    cid, _ = add_oauth(store, owner_a, token_server)
    token_server.queued = [(200, {"access_token": access, "token_type": "Bearer"})]
    with pytest.raises(CredentialError, match="printable ASCII"):
        await resolver.resolve(cid, HOST, 443, http)


@pytest.mark.parametrize(
    ("expires_in", "lifetime"),
    [(float("inf"), None), (float("nan"), None), (-5, None), (10**20, 365 * 24 * 3600),
     ("9" * 5000, None), (120, 120)],
)  # fmt: skip
async def test_a_lifetime_no_datetime_can_take_is_read_as_sane(
    expires_in: Any,
    lifetime: int | None,
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    token_server.rotate_refresh_tokens = True
    cid, _ = add_oauth(store, owner_a, token_server)
    token_server.expires_in = expires_in
    token = await resolver.resolve(cid, HOST, 443, http)
    assert token == token_server.issued[-1]  # refreshed and stored, the rotation kept
    _, expires_at = status_and_expiry(database, cid)
    if lifetime is None:
        assert expires_at is None
    else:
        assert expires_at is not None
        left = (expires_at - datetime.now(UTC)).total_seconds()
        assert lifetime - 60 < left <= lifetime


# A token endpoint's answer may reach the socket in more than one piece (TLS records, chunked
# transfer, a JSON serializer that streams): a response with an ID token and a rotated
# refresh token is several KiB. Reading only the first piece called a valid answer "not a
# JSON object", and the refresh token the server had just rotated was lost with it: the next
# refresh sent the old one (invalid_grant), and the credential needed re-authorization.
async def test_an_answer_arriving_in_pieces_is_read_whole_and_its_rotation_kept(
    store: CredentialStore,
    resolver: CredentialResolver,
    database: Database,
    owner_a: UUID,
    http: aiohttp.ClientSession,
) -> None:
    answer = {"access_token": "access-1", "token_type": "Bearer", "expires_in": 3600,
              "refresh_token": "refresh-rotated", "id_token": "h." + "x" * 3000 + ".s"}  # fmt: skip
    server = SplitAnswer(json.dumps(answer).encode())
    await server.start()
    try:
        secret = oauth_secret(server.url("/token"), "client-1", "client-secret", "refresh-first")
        cid = store.add(owner_a, "oauth", "split", json.dumps(secret), [HOST])
        expire(database, cid)
        assert await resolver.resolve(cid, HOST, 443, http) == "access-1"
        assert not server.cut
        expire(database, cid)
        await resolver.resolve(cid, HOST, 443, http)
        assert [f["refresh_token"] for f in server.forms] == ["refresh-first", "refresh-rotated"]
    finally:
        await server.close()


async def test_a_token_endpoint_echoing_a_secret_as_its_error_code_is_not_quoted(
    token_server: TokenServer, http: aiohttp.ClientSession
) -> None:
    """The error code an endpoint answers is quoted in the call's error, which the agent
    reads: an endpoint that answered the refresh token or the client secret as its `error`
    put them there (an audit, with a Slack-style 200 `ok: false` too)."""
    refresh = token_server.new_refresh_token()
    form = {"grant_type": "refresh_token", "refresh_token": refresh,
            "client_id": token_server.client_id, "client_secret": token_server.client_secret}  # fmt: skip
    for status, body in (
        (400, {"error": refresh}),
        (401, {"error": token_server.client_secret}),
        (200, {"ok": False, "error": refresh[:40]}),
        (400, {"error": f"bad_{refresh}"[:64]}),
    ):
        token_server.queued.append((status, body))
        with pytest.raises(CredentialError) as refused:
            await request_token(http, token_server.url, form)
        said = refused.value.message
        assert refresh[:12] not in said and token_server.client_secret[:12] not in said, said
    token_server.queued.append((400, {"error": "invalid_grant"}))
    with pytest.raises(CredentialError, match=r"\(invalid_grant\)"):
        await request_token(http, token_server.url, form)
