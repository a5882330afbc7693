"""The dispatcher's resolver: host binding, status, tampering, rewrap and key rotation."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any
from uuid import UUID

import aiohttp
import pytest

from tests.credentials.conftest import dispatcher_pool, make_keyring
from tests.credentials.helpers import (
    api_key,
    oauth_secret,
    register_tool,
    rsa_private_key,
    service_account_secret,
)
from tests.credentials.token_server import TokenServer
from toolrelay.credentials import CredentialResolver, CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.errors import (
    CredentialError,
    CredentialHostMismatch,
    CredentialMissing,
    CredentialNeedsReauth,
)

HOST = "api.example.com"


async def test_api_key_resolves_for_its_host(
    store: CredentialStore, resolver: CredentialResolver, owner_a: UUID, http: Any
) -> None:
    secret = api_key()
    cid = store.add(owner_a, "api_key", "k", secret, [HOST])
    assert await resolver.resolve(cid, HOST, 443, http) == secret
    assert await resolver.resolve(cid, "API.EXAMPLE.COM", 8080, http) == secret


async def test_host_mismatch_refused(
    store: CredentialStore, resolver: CredentialResolver, owner_a: UUID, http: Any
) -> None:
    secret = api_key()
    cid = store.add(owner_a, "api_key", "k", secret, [HOST])
    with pytest.raises(CredentialHostMismatch) as info:
        await resolver.resolve(cid, "evil.example.net", 443, http)
    assert "evil.example.net:443" in info.value.message and HOST in info.value.message
    assert secret not in info.value.message


async def test_host_port_binding(
    store: CredentialStore, resolver: CredentialResolver, owner_a: UUID, http: Any
) -> None:
    cid = store.add(owner_a, "api_key", "k", api_key(), [f"{HOST}:8443"])
    await resolver.resolve(cid, HOST, 8443, http)
    for port in (443, None):
        with pytest.raises(CredentialHostMismatch):
            await resolver.resolve(cid, HOST, port, http)


async def test_default_binding_is_first_tools_host(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    owner_a: UUID,
    http: Any,
) -> None:
    cid = store.add(owner_a, "api_key", "k", api_key())
    with pytest.raises(CredentialHostMismatch, match="none yet"):
        await resolver.resolve(cid, HOST, 443, http)  # unbound: nowhere
    register_tool(
        database, owner_a, "first", endpoint="https://first.example.org/api", credential=cid
    )
    register_tool(database, owner_a, "second", endpoint=f"https://{HOST}/api", credential=cid)
    await resolver.resolve(cid, "first.example.org", 443, http)
    with pytest.raises(CredentialHostMismatch):
        await resolver.resolve(cid, HOST, 443, http)


async def test_revoked_and_needs_reauth_refused(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    owner_a: UUID,
    http: Any,
) -> None:
    cid = store.add(owner_a, "api_key", "k", api_key(), [HOST])
    for status in ("revoked", "needs_reauth"):
        with database.as_owner(owner_a) as conn:
            conn.execute("UPDATE agents.credentials SET status = %s WHERE id = %s", (status, cid))
        with pytest.raises(CredentialNeedsReauth, match=status):
            await resolver.resolve(cid, HOST, 443, http)
    store.rotate(owner_a, cid, "fresh-value")
    assert await resolver.resolve(cid, HOST, 443, http) == "fresh-value"


async def test_missing_credential(resolver: CredentialResolver, http: Any) -> None:
    with pytest.raises(CredentialMissing):
        await resolver.resolve(uuid.uuid4(), HOST, 443, http)


async def test_last_used_at_written_at_most_once_a_minute(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    owner_a: UUID,
    http: Any,
) -> None:
    cid = store.add(owner_a, "api_key", "k", api_key(), [HOST])
    assert store.get(owner_a, cid).last_used_at is None
    await resolver.resolve(cid, HOST, 443, http)
    first = store.get(owner_a, cid).last_used_at
    assert first is not None
    with database.as_dispatcher() as conn:
        conn.execute(
            "UPDATE agents.credentials SET last_used_at = now() - interval '1 hour' WHERE id = %s",
            (cid,),
        )
    await resolver.resolve(cid, HOST, 443, http)  # within the interval: no write
    later = store.get(owner_a, cid).last_used_at
    assert later is not None and later < first


def _swap(database: Database, source: UUID, target: UUID, columns: list[str]) -> None:
    cols = ", ".join(columns)
    with database.as_dispatcher() as conn:
        conn.execute(
            f"UPDATE agents.credentials t SET ({cols}) = (SELECT {cols} FROM agents.credentials"
            " WHERE id = %s) WHERE t.id = %s",
            (source, target),
        )


async def test_ciphertext_moved_to_another_row_fails(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    owner_a: UUID,
    owner_b: UUID,
    http: Any,
) -> None:
    s1, s2, s3 = api_key(), api_key(), api_key()
    c1 = store.add(owner_a, "api_key", "one", s1, [HOST])
    c2 = store.add(owner_a, "api_key", "two", s2, [HOST])
    c3 = store.add(owner_b, "api_key", "three", s3, [HOST])
    _swap(database, c1, c2, ["key_id", "wrapped_key", "nonce", "ciphertext"])
    _swap(database, c1, c3, ["nonce", "ciphertext"])
    for cid in (c2, c3):
        with pytest.raises(CredentialError, match="does not decrypt") as info:
            await resolver.resolve(cid, HOST, 443, http)
        assert s1 not in info.value.message
    assert await resolver.resolve(c1, HOST, 443, http) == s1


async def test_rewrap_then_retire_old_key(
    isolated_db: str, token_server: TokenServer, owner_a: UUID, http: aiohttp.ClientSession
) -> None:
    token_server.sa_public_key = rsa_private_key().public_key()
    token_server.sa_audience = token_server.url
    database = Database(isolated_db)
    old, new_only = make_keyring("k-old"), make_keyring("k-new")
    both = Keyring([old.get("k-old"), new_only.get("k-new")])
    secrets_in = {
        "api_key": api_key(),
        "oauth": json.dumps(oauth_secret(token_server.url, "c", "cs", None)),
        "service_account": json.dumps(service_account_secret(token_server.url)),
    }
    ids = {
        kind: CredentialStore(database, old).add(owner_a, kind, f"rw-{kind}", text, [HOST])
        for kind, text in secrets_in.items()
    }
    async with dispatcher_pool(isolated_db) as pool:
        before = await _resolve_all(CredentialResolver(pool, old), ids, http)

        assert CredentialStore(database, both).rewrap() == 3
        assert CredentialStore(database, both).rewrap() == 0  # idempotent
        with database.as_dispatcher() as conn:
            rows = conn.execute("SELECT id, key_id FROM agents.credentials").fetchall()
        assert {r["id"]: r["key_id"] for r in rows} == {cid: "k-new" for cid in ids.values()}

        # The old key removed from the keyring: everything resolves, ids unchanged.
        after = await _resolve_all(CredentialResolver(pool, new_only), ids, http)
        assert after["api_key"] == before["api_key"] == secrets_in["api_key"]
        assert after["oauth"] == before["oauth"]
        assert after["service_account"].startswith("access-")

        # A process still holding only the old key fails closed, naming the key id only.
        with pytest.raises(CredentialError) as info:
            await CredentialResolver(pool, old).resolve(ids["api_key"], HOST, 443, http)
    message = info.value.message
    assert "'k-new' is not configured" in message
    for ring in (old, new_only):
        assert base64.b64encode(ring.newest.key).decode() not in message


async def _resolve_all(
    resolver: CredentialResolver, ids: dict[str, UUID], http: aiohttp.ClientSession
) -> dict[str, str]:
    return {kind: await resolver.resolve(cid, HOST, 443, http) for kind, cid in ids.items()}


def test_rewrap_with_unknown_key_aborts_everything(isolated_db: str, owner_a: UUID) -> None:
    database = Database(isolated_db)
    known, stranger = make_keyring("k1"), make_keyring("k-stranger")
    CredentialStore(database, known).add(owner_a, "api_key", "known", api_key())
    lost = CredentialStore(database, stranger).add(owner_a, "api_key", "lost", api_key())
    rotated = Keyring([known.get("k1"), make_keyring("k2").get("k2")])
    with pytest.raises(CredentialError) as info:
        CredentialStore(database, rotated).rewrap()
    assert f"stopped at credential {lost}, nothing changed" in info.value.message
    assert "master key 'k-stranger' is not configured" in info.value.message
    with database.as_dispatcher() as conn:
        keys = conn.execute("SELECT key_id FROM agents.credentials ORDER BY key_id").fetchall()
    assert [r["key_id"] for r in keys] == ["k-stranger", "k1"]


async def test_a_kept_plaintext_never_outlives_revocation_rotation_or_hosts(
    store: CredentialStore,
    database: Database,
    resolver: CredentialResolver,
    owner_a: UUID,
    http: Any,
) -> None:
    """The resolver keeps decrypted values for a minute; status and hosts still come from
    the row of each call, and a rotation (new sealed bytes) is decrypted anew."""
    cid = store.add(owner_a, "api_key", "k", "old-value", [HOST])
    assert await resolver.resolve(cid, HOST, 443, http) == "old-value"  # now kept
    store.rotate(owner_a, cid, "new-value")
    assert await resolver.resolve(cid, HOST, 443, http) == "new-value"
    with database.as_owner(owner_a) as conn:
        conn.execute("UPDATE agents.credentials SET status = 'revoked' WHERE id = %s", (cid,))
    with pytest.raises(CredentialNeedsReauth, match="revoked"):
        await resolver.resolve(cid, HOST, 443, http)
    with database.as_owner(owner_a) as conn:
        conn.execute("UPDATE agents.credentials SET status = 'active' WHERE id = %s", (cid,))
    store.set_hosts(owner_a, cid, ["other.example.org"])
    with pytest.raises(CredentialHostMismatch):
        await resolver.resolve(cid, HOST, 443, http)
