"""The credential store (#461): envelope-encrypted secrets, owner API and dispatcher resolver."""

from toolrelay.credentials.formats import KINDS
from toolrelay.credentials.keycheck import MissingMasterKey, key_status, load_keyring
from toolrelay.credentials.keys import (
    Keyring,
    MasterKey,
    ensure_local_master_key,
    generate_master_key,
    keyring_from_env,
)
from toolrelay.credentials.resolve import CredentialResolver
from toolrelay.credentials.store import CredentialInfo, CredentialStore

__all__ = [
    "KINDS",
    "CredentialInfo",
    "CredentialResolver",
    "CredentialStore",
    "Keyring",
    "MasterKey",
    "MissingMasterKey",
    "ensure_local_master_key",
    "generate_master_key",
    "key_status",
    "keyring_from_env",
    "load_keyring",
]
