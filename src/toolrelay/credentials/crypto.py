"""Envelope encryption: a fresh AES-256-GCM data key per secret, wrapped by a master key.

Stored per credential: ``key_id`` (the master key), ``wrapped_key`` (nonce || GCM output of
the data key), ``nonce`` and ``ciphertext`` (the secret under the data key). Both layers
authenticate the credential's id, owner and kind, so ciphertext moved to another row fails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from uuid import UUID

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from toolrelay.credentials.keys import Keyring, MasterKey
from toolrelay.errors import CredentialError

__all__ = ["CredentialIdentity", "Envelope", "opens", "rewrap", "seal", "unseal"]

_NONCE_BYTES = 12
_DATA_KEY_BITS = 256
_FORMAT = b"toolrelay.credential.v1"


@dataclass(frozen=True)
class CredentialIdentity:
    """What the associated data binds a ciphertext to."""

    id: UUID
    owner: UUID
    kind: str

    def aad(self, layer: str, key_id: str = "") -> bytes:
        parts = [_FORMAT, layer.encode(), str(self.id).encode(), str(self.owner).encode()]
        parts += [self.kind.encode(), key_id.encode()]
        return b"|".join(parts)


@dataclass(frozen=True)
class Envelope:
    key_id: str
    wrapped_key: bytes = field(repr=False)
    nonce: bytes = field(repr=False)
    ciphertext: bytes = field(repr=False)


def seal(keyring: Keyring, ident: CredentialIdentity, plaintext: bytes) -> Envelope:
    """Encrypt under a new data key wrapped by the newest master key."""
    data_key = AESGCM.generate_key(bit_length=_DATA_KEY_BITS)
    nonce = os.urandom(_NONCE_BYTES)
    ciphertext = AESGCM(data_key).encrypt(nonce, plaintext, ident.aad("data"))
    master = keyring.newest
    return Envelope(master.id, _wrap(master, ident, data_key), nonce, ciphertext)


def unseal(keyring: Keyring, ident: CredentialIdentity, envelope: Envelope) -> bytes:
    data_key = _unwrap(keyring, ident, envelope)
    try:
        return AESGCM(data_key).decrypt(envelope.nonce, envelope.ciphertext, ident.aad("data"))
    except InvalidTag:
        raise _undecryptable(ident, envelope.key_id) from None


def rewrap(keyring: Keyring, ident: CredentialIdentity, envelope: Envelope) -> Envelope:
    """The same data key and ciphertext, wrapped by the newest master key."""
    data_key = _unwrap(keyring, ident, envelope)
    master = keyring.newest
    return Envelope(master.id, _wrap(master, ident, data_key), envelope.nonce, envelope.ciphertext)


def opens(master: MasterKey, ident: CredentialIdentity, wrapped_key: bytes) -> bool:
    """Whether ``master`` unwraps this data key: the key it was wrapped under, not merely
    one with the same id."""
    try:
        _unwrap_with(master, ident, wrapped_key)
    except (InvalidTag, ValueError):
        return False
    return True


def _wrap(master: MasterKey, ident: CredentialIdentity, data_key: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + AESGCM(master.key).encrypt(nonce, data_key, ident.aad("key", master.id))


class DataKeyUnopened(CredentialError):
    """The configured master key of this id does not unwrap the data key: this row was
    altered (or moved from another credential), or the key has the id but other bytes."""

    def __init__(self, message: str, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


def _unwrap(keyring: Keyring, ident: CredentialIdentity, envelope: Envelope) -> bytes:
    try:
        return _unwrap_with(keyring.get(envelope.key_id), ident, envelope.wrapped_key)
    except (InvalidTag, ValueError):
        raise DataKeyUnopened(
            _undecryptable(ident, envelope.key_id).message, envelope.key_id
        ) from None


def _unwrap_with(master: MasterKey, ident: CredentialIdentity, wrapped_key: bytes) -> bytes:
    nonce, wrapped = wrapped_key[:_NONCE_BYTES], wrapped_key[_NONCE_BYTES:]
    return AESGCM(master.key).decrypt(nonce, wrapped, ident.aad("key", master.id))


def _undecryptable(ident: CredentialIdentity, key_id: str) -> CredentialError:
    return CredentialError(
        f"credential {ident.id} does not decrypt with master key {key_id!r}: the stored "
        "ciphertext was altered or moved from another credential, or the key is wrong"
    )
