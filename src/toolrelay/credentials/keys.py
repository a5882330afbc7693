"""Master keys: parsing TOOLRELAY_MASTER_KEY / _FILE into a keyring, and the local demo key.

Format (env value or file content): entries ``id:base64`` separated by commas or newlines,
the newest last. A bare ``base64`` entry gets the id ``default``. Each key is 32 bytes.
Messages name key ids and sources, never key material.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from toolrelay import config
from toolrelay.errors import ConfigurationError, UnknownMasterKey

__all__ = [
    "DEFAULT_KEY_ID",
    "KEY_ENV",
    "KEY_FILE_ENV",
    "LOCAL_KEY_FILE",
    "Keyring",
    "MasterKey",
    "ensure_local_master_key",
    "generate_master_key",
    "keyring_from_env",
]

log = logging.getLogger(__name__)

KEY_ENV = "TOOLRELAY_MASTER_KEY"
KEY_FILE_ENV = "TOOLRELAY_MASTER_KEY_FILE"
DEFAULT_KEY_ID = "default"
LOCAL_KEY_FILE = "master.key"
LOCAL_KEY_ID = "local"
KEY_BYTES = 32

_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_GENERATE_HINT = (
    "generate one with: python -c 'import base64, os; "
    "print(base64.b64encode(os.urandom(32)).decode())'  (or: openssl rand -base64 32)"
)


@dataclass(frozen=True)
class MasterKey:
    id: str
    key: bytes = field(repr=False)


class Keyring:
    """Master keys by id; the last one is the newest and wraps every new data key."""

    def __init__(self, keys: Iterable[MasterKey]) -> None:
        self._keys: dict[str, MasterKey] = {}
        for key in keys:
            if key.id in self._keys:
                raise ConfigurationError(f"master key id {key.id!r} is given twice")
            if len(key.key) != KEY_BYTES:
                raise ConfigurationError(f"master key {key.id!r} must be {KEY_BYTES} bytes")
            self._keys[key.id] = key
        if not self._keys:
            raise ConfigurationError(f"no master key given; {_GENERATE_HINT}")

    @classmethod
    def parse(cls, text: str, source: str = KEY_ENV) -> Keyring:
        """Parse ``id:base64`` entries (commas or newlines; ``#`` starts a comment line)."""
        entries: list[str] = []
        for line in text.splitlines():
            if line.strip().startswith("#"):
                continue
            entries.extend(part.strip() for part in line.split(","))
        return cls(_parse_entry(entry, source) for entry in entries if entry)

    @property
    def newest(self) -> MasterKey:
        return next(reversed(self._keys.values()))

    @property
    def ids(self) -> list[str]:
        return list(self._keys)

    def get(self, key_id: str) -> MasterKey:
        """The key with this id; an unknown id fails closed, naming ids only."""
        try:
            return self._keys[key_id]
        except KeyError:
            known = ", ".join(repr(k) for k in self._keys)
            raise UnknownMasterKey(
                f"master key {key_id!r} is not configured (configured: {known}); "
                f"add it back to {KEY_ENV} or {KEY_FILE_ENV}",
                key_id,
            ) from None

    def __repr__(self) -> str:
        return f"Keyring(ids={self.ids!r})"


def _parse_entry(entry: str, source: str) -> MasterKey:
    key_id, sep, encoded = entry.partition(":")
    if not sep:
        key_id, encoded = DEFAULT_KEY_ID, entry
    key_id = key_id.strip()
    if not _KEY_ID.match(key_id):
        raise ConfigurationError(
            f"{source}: a key id must be letters, digits, '_', '.' or '-' (entry id:base64)"
        )
    try:
        raw = _b64decode(encoded.strip())
    except (binascii.Error, ValueError):
        raise ConfigurationError(f"{source}: key {key_id!r} is not valid base64") from None
    if len(raw) != KEY_BYTES:
        raise ConfigurationError(
            f"{source}: key {key_id!r} is {len(raw)} bytes, must be {KEY_BYTES}; {_GENERATE_HINT}"
        )
    return MasterKey(key_id, raw)


def _b64decode(value: str) -> bytes:
    if "-" in value or "_" in value:
        return base64.urlsafe_b64decode(value)
    return base64.b64decode(value, validate=True)


def generate_master_key(key_id: str = DEFAULT_KEY_ID) -> str:
    """A new ``id:base64`` entry."""
    if not _KEY_ID.match(key_id):
        raise ConfigurationError("a key id must be letters, digits, '_', '.' or '-'")
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()}"


def ensure_local_master_key(home: Path) -> Path:
    """The embedded demo's key file under ``home``, created (mode 0600) when missing."""
    path = home / LOCAL_KEY_FILE
    if path.exists():
        if path.stat().st_mode & 0o077:
            log.warning("master key file %s is readable by others; chmod 600 it", path)
        return path
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f".{LOCAL_KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(generate_master_key(LOCAL_KEY_ID) + "\n")
        # link() fails if another process created the file first; then we use theirs.
        try:
            os.link(tmp, path)
            log.info("created master key file %s", path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)
    return path


def keyring_from_env(embedded: bool, environ: Mapping[str, str] | None = None) -> Keyring:
    """The configured keyring; in embedded mode a local key file is created when none is set."""
    env = os.environ if environ is None else environ
    value = env.get(KEY_ENV, "").strip()
    file_value = env.get(KEY_FILE_ENV, "").strip()
    if value and file_value:
        raise ConfigurationError(f"set only one of {KEY_ENV} and {KEY_FILE_ENV}")
    if value:
        return Keyring.parse(value, KEY_ENV)
    if file_value:
        return _keyring_from_file(Path(file_value).expanduser(), KEY_FILE_ENV)
    if embedded:
        return _keyring_from_file(ensure_local_master_key(config.home()), "local key file")
    raise ConfigurationError(
        f"no master key: set {KEY_ENV} to 32 random bytes in base64 (several as "
        f"id1:base64,id2:base64, newest last) or {KEY_FILE_ENV} to a file holding them; "
        + _GENERATE_HINT
    )


def _keyring_from_file(path: Path, source: str) -> Keyring:
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise ConfigurationError(
            f"{source}: cannot read master key file {path}: {exc.strerror}"
        ) from None
    return Keyring.parse(text, f"{source} {path}")
