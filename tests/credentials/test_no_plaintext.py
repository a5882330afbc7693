"""A database dump and the logs hold no plaintext secret, of any kind, before or after use."""

from __future__ import annotations

import json
import logging
import subprocess
from uuid import UUID

import aiohttp
import pytest

from tests.credentials.conftest import dispatcher_pool
from tests.credentials.helpers import (
    api_key,
    oauth_secret,
    rsa_pem,
    rsa_private_key,
    service_account_secret,
)
from tests.credentials.token_server import TokenServer
from toolrelay.credentials import CredentialResolver, CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.errors import CredentialHostMismatch

HOST = "api.example.com"


def pg_dump(url: str) -> str:
    return subprocess.run(
        ["pg_dump", "--no-owner", "-d", url], check=True, capture_output=True, text=True
    ).stdout


def pem_body_lines() -> list[str]:
    return [line for line in rsa_pem().splitlines() if line and not line.startswith("-----")]


async def test_dump_and_logs_hold_no_plaintext(
    isolated_db: str,
    keyring: Keyring,
    token_server: TokenServer,
    owner_a: UUID,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    token_server.rotate_refresh_tokens = True
    token_server.sa_public_key = rsa_private_key().public_key()
    token_server.sa_audience = token_server.url
    token_server.queued = [(503, {})]  # a retry, so the warning path logs too
    store = CredentialStore(Database(isolated_db), keyring)

    key = api_key()
    refresh = token_server.new_refresh_token()
    oauth = oauth_secret(
        token_server.url, token_server.client_id, token_server.client_secret, refresh,
        expires_at=0,
    )  # fmt: skip
    ids = [
        store.add(owner_a, "api_key", "key", key, [HOST]),
        store.add(owner_a, "oauth", "oauth", json.dumps(oauth), [HOST]),
        store.add(owner_a, "service_account", "sa",
                  json.dumps(service_account_secret(token_server.url)), [HOST]),
    ]  # fmt: skip
    async with dispatcher_pool(isolated_db) as pool:
        resolver = CredentialResolver(pool, keyring, retry_delays=(0.01, 0.01))
        values = [await resolver.resolve(cid, HOST, 443, http) for cid in ids]
        with pytest.raises(CredentialHostMismatch):
            await resolver.resolve(ids[0], "elsewhere.example", 443, http)

    [rotated_refresh] = token_server.refresh_tokens
    assert rotated_refresh != refresh
    secrets = [key, oauth["access_token"], refresh, token_server.client_secret, *values]
    secrets += [rotated_refresh, *pem_body_lines()]
    assert values[1] in token_server.issued and values[2] in token_server.issued

    dump = pg_dump(isolated_db)
    assert all(str(cid) in dump for cid in ids)  # the rows are there, as ciphertext
    logs = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "refreshed" in logs and "retry" in logs
    for secret in secrets:
        assert secret not in dump
        assert secret.encode().hex() not in dump  # bytea is dumped as hex
        assert secret not in logs
