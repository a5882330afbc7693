"""Shared test helpers: tools bound to credentials, secret inputs of each kind."""

from __future__ import annotations

import json
import time
import uuid
from functools import cache
from typing import Any
from uuid import UUID

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from toolrelay.db import Database


def register_tool(
    db: Database,
    owner: UUID,
    key: str,
    *,
    auth_method: str = "api_key",
    endpoint: str | None = "https://api.example.com/v1/things",
    credential: UUID | None = None,
) -> dict[str, Any]:
    with db.as_owner(owner) as conn:
        row = conn.execute(
            "SELECT (t).* FROM (SELECT fn_register_tool(p_key => %s, p_name => %s,"
            " p_auth_method => %s, p_endpoint_url => %s, p_credential_ref => %s) AS t) s",
            (key, key, auth_method, endpoint, credential),
        ).fetchone()
    assert row is not None
    return row


def allowed_hosts(db: Database, owner: UUID, credential: UUID) -> list[str]:
    with db.as_owner(owner) as conn:
        row = conn.execute(
            "SELECT allowed_hosts FROM agents.credentials WHERE id = %s", (credential,)
        ).fetchone()
    assert row is not None
    return list(row["allowed_hosts"])


def api_key() -> str:
    return f"sk-live-{uuid.uuid4().hex}"


def oauth_secret(
    token_url: str,
    client_id: str,
    client_secret: str,
    refresh_token: str | None,
    *,
    expires_at: float | None = None,
    access_token: str | None = None,
) -> dict[str, Any]:
    secret: dict[str, Any] = {
        "access_token": access_token or f"access-{uuid.uuid4().hex}",
        "expires_at": time.time() + 3600 if expires_at is None else expires_at,
        "token_url": token_url,
        "client_id": client_id,
        "client_secret": client_secret,
        "scope": ["posts.write", "posts.read"],
    }
    if refresh_token is not None:
        secret["refresh_token"] = refresh_token
    return secret


@cache
def rsa_private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def rsa_pem(key: rsa.RSAPrivateKey | None = None) -> str:
    return (
        (key or rsa_private_key())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )


def service_account_secret(token_url: str, **extra: Any) -> dict[str, Any]:
    secret: dict[str, Any] = {
        "private_key": rsa_pem(),
        "issuer": "robot@example.iam",
        "token_url": token_url,
        "scopes": ["https://api.example.com/auth/posts"],
    }
    secret.update(extra)
    return secret


def dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj)
