"""Standard Webhooks signing: the secret's form, and the three headers of a delivery.

A secret is ``whsec_`` + base64 of 32 random bytes. A delivery carries ``webhook-id`` (the
delivery's id, the same on every retry), ``webhook-timestamp`` (seconds since the epoch,
when this attempt was signed) and ``webhook-signature``: ``v1,`` + base64 of
HMAC-SHA256(secret bytes, ``id.timestamp.body``). See https://www.standardwebhooks.com/.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

from toolrelay.errors import InvalidArgument

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # the specification asks for 24 to 64


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key a ``whsec_`` secret stands for."""
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidArgument(f"a webhook secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("a webhook secret is whsec_ followed by base64") from None
    if not key:
        raise InvalidArgument("a webhook secret may not be empty")
    return key


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, msg_id, timestamp, body),
    }
