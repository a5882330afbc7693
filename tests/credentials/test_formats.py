"""Secret input validation: clear errors naming fields, never values; envelope crypto."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime

import pytest

from tests.credentials.helpers import rsa_pem
from toolrelay.credentials import crypto
from toolrelay.credentials.formats import (
    OAuthSecret,
    ServiceAccountSecret,
    decode_secret,
    encode_secret,
    parse_secret,
)
from toolrelay.credentials.hosts import host_allowed, normalize_host_entry
from toolrelay.credentials.keys import Keyring, MasterKey
from toolrelay.errors import CredentialError, InvalidArgument

SECRET = "s3cr3t-VALUE-that-must-not-leak"


def test_api_key_is_the_raw_string() -> None:
    assert parse_secret("api_key", SECRET).secret.value == SECRET  # type: ignore[union-attr]
    with pytest.raises(InvalidArgument, match="empty"):
        parse_secret("api_key", "")
    for blank in ("   ", "\t", " \t "):  # a paste that lost its value: never a secret
        with pytest.raises(InvalidArgument, match="only spaces"):
            parse_secret("api_key", blank)
    with pytest.raises(InvalidArgument, match="line break") as info:
        parse_secret("api_key", SECRET + "\nmore")
    assert SECRET not in info.value.message


def test_oauth_expires_at_iso_or_epoch() -> None:
    base = {"access_token": SECRET, "refresh_token": "r", "token_url": "https://a/t",
            "client_id": "c"}  # fmt: skip
    iso = parse_secret("oauth", json.dumps({**base, "expires_at": "2030-01-02T03:04:05Z"}))
    assert iso.expires_at == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    epoch = parse_secret("oauth", json.dumps({**base, "expires_at": 1893553445}))
    assert epoch.expires_at == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    relative = parse_secret("oauth", json.dumps({**base, "expires_in": 60}), now=now)
    assert relative.expires_at == datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    with pytest.raises(InvalidArgument, match="'expires_at' must be"):
        parse_secret("oauth", json.dumps({**base, "expires_at": "tomorrow"}))


def test_oauth_scope_list_normalized() -> None:
    parsed = parse_secret(
        "oauth", json.dumps({"access_token": SECRET, "scope": ["a", "b"], "client_id": "c"})
    )
    assert isinstance(parsed.secret, OAuthSecret) and parsed.secret.scope == "a b"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"client_secret": SECRET}, "missing field 'access_token'"),
        ({"refresh_token": SECRET, "client_id": "c"}, "missing field 'token_url'"),
        ({"refresh_token": SECRET, "token_url": "https://a/t"}, "missing field 'client_id'"),
        ({"access_token": SECRET, "token_url": "ftp://x"}, "'token_url' must be an http"),
        ({"access_token": SECRET, "acess_token": SECRET}, "unknown field(s) acess_token"),
        ({"access_token": 5}, "'access_token' must be a non-empty string"),
    ],
)
def test_oauth_errors_name_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_secret("oauth", json.dumps(fields))
    assert message in info.value.message
    assert SECRET not in info.value.message


def test_invalid_json_does_not_echo_input() -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_secret("oauth", '{"access_token": "' + SECRET)
    assert "JSON" in info.value.message and SECRET not in info.value.message


def test_service_account_defaults_and_errors() -> None:
    fields = {"private_key": rsa_pem(), "issuer": "i", "token_url": "https://a/t",
              "scopes": "x  y"}  # fmt: skip
    parsed = parse_secret("service_account", json.dumps(fields)).secret
    assert isinstance(parsed, ServiceAccountSecret)
    assert (parsed.audience, parsed.scopes, parsed.subject) == ("https://a/t", "x y", None)
    for missing in ("private_key", "issuer", "token_url"):
        broken = {k: v for k, v in fields.items() if k != missing}
        with pytest.raises(InvalidArgument, match=f"missing field '{missing}'"):
            parse_secret("service_account", json.dumps(broken))
    with pytest.raises(InvalidArgument, match="not an unencrypted PEM RSA") as info:
        parse_secret("service_account", json.dumps({**fields, "private_key": SECRET}))
    assert SECRET not in info.value.message


def test_repr_of_secrets_hides_values() -> None:
    parsed = parse_secret("oauth", json.dumps({"access_token": SECRET, "client_id": "c"}))
    assert SECRET not in repr(parsed)


def test_encode_decode_round_trip() -> None:
    parsed = parse_secret("oauth", json.dumps({"access_token": SECRET, "client_id": "c"}))
    assert decode_secret("oauth", encode_secret(parsed.secret)) == parsed.secret


def test_envelope_binds_id_owner_and_kind() -> None:
    ring = Keyring([MasterKey("k1", os.urandom(32))])
    ident = crypto.CredentialIdentity(uuid.uuid4(), uuid.uuid4(), "api_key")
    env = crypto.seal(ring, ident, b"payload")
    assert crypto.unseal(ring, ident, env) == b"payload"
    for other in (
        crypto.CredentialIdentity(uuid.uuid4(), ident.owner, ident.kind),
        crypto.CredentialIdentity(ident.id, uuid.uuid4(), ident.kind),
        crypto.CredentialIdentity(ident.id, ident.owner, "oauth"),
    ):
        with pytest.raises(CredentialError, match="does not decrypt"):
            crypto.unseal(ring, other, env)
    # A wrong master key under the same id fails the same way.
    impostor = Keyring([MasterKey("k1", os.urandom(32))])
    with pytest.raises(CredentialError, match="does not decrypt"):
        crypto.unseal(impostor, ident, env)


def test_rewrap_keeps_ciphertext() -> None:
    old = Keyring([MasterKey("k1", os.urandom(32))])
    both = Keyring([old.get("k1"), MasterKey("k2", os.urandom(32))])
    ident = crypto.CredentialIdentity(uuid.uuid4(), uuid.uuid4(), "api_key")
    env = crypto.seal(old, ident, b"payload")
    new = crypto.rewrap(both, ident, env)
    assert (new.key_id, new.ciphertext, new.nonce) == ("k2", env.ciphertext, env.nonce)
    assert crypto.unseal(Keyring([both.get("k2")]), ident, new) == b"payload"


@pytest.mark.parametrize(
    ("entry", "normal"),
    [
        ("API.Example.COM", "api.example.com"),
        ("api.example.com.", "api.example.com"),
        ("api.example.com:8443", "api.example.com:8443"),
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        ("[0:0::1]:80", "[::1]:80"),
        ("::1", "[::1]"),
        ("bücher.example", "xn--bcher-kva.example"),
    ],
)
def test_host_entries_normalized(entry: str, normal: str) -> None:
    assert normalize_host_entry(entry) == normal


@pytest.mark.parametrize(
    "entry", ["https://api.example.com", "api.example.com/x", "a b", "h:0", "h:99999", "[x]"]
)
def test_bad_host_entries(entry: str) -> None:
    with pytest.raises(InvalidArgument):
        normalize_host_entry(entry)


def test_host_matching() -> None:
    allowed = ["api.example.com", "upload.example.com:8443", "[::1]"]
    assert host_allowed(allowed, "API.example.com", 443)
    assert host_allowed(allowed, "api.example.com", None)
    assert host_allowed(allowed, "upload.example.com", 8443)
    assert not host_allowed(allowed, "upload.example.com", 443)
    assert not host_allowed(allowed, "upload.example.com", None)
    assert not host_allowed(allowed, "evil.example.com", 443)
    assert not host_allowed(allowed, "api.example.com.evil.net", 443)
    assert host_allowed(allowed, "::1", 80)
    assert not host_allowed([], "api.example.com", 443)
