"""The keyring checked against what the database holds: a lost master key is never replaced.

Every credential, and every webhook's signing secret, names the master key id its data key
is wrapped under. A command that needs the keyring loads it here, so that a key id in use
but not configured, or configured with other bytes than the key that sealed it, refuses at
start, in one line naming the ids and where keys are read from, instead of a new local
key being generated and every stored secret silently becoming unreadable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

from toolrelay import config
from toolrelay.credentials.crypto import CredentialIdentity, opens
from toolrelay.credentials.keys import (
    KEY_ENV,
    KEY_FILE_ENV,
    LOCAL_KEY_FILE,
    Keyring,
    MasterKey,
    keyring_from_env,
)
from toolrelay.db import Database
from toolrelay.errors import ConfigurationError

__all__ = ["KeyStatus", "MissingMasterKey", "key_status", "load_keyring"]


class MissingMasterKey(ConfigurationError):
    """The database holds secrets sealed under a key id that is not configured."""


def key_source(environ: Mapping[str, str] | None = None) -> str:
    """Where master keys are read from, for messages (never the keys themselves)."""
    env = os.environ if environ is None else environ
    if env.get(KEY_ENV, "").strip():
        return KEY_ENV
    if env.get(KEY_FILE_ENV, "").strip():
        return f"{KEY_FILE_ENV} ({env[KEY_FILE_ENV].strip()})"
    return f"the local key file {config.home() / LOCAL_KEY_FILE}"


@dataclass(frozen=True)
class _Sealed:
    """What one master key id seals here, and one of its wrapped data keys to try it on."""

    credentials: int
    webhooks: int
    sample: CredentialIdentity
    wrapped_key: bytes

    def opened_by(self, master: MasterKey) -> bool:
        """Whether ``master`` is the key these secrets were sealed with (not merely its id)."""
        return opens(master, self.sample, self.wrapped_key)

    def __str__(self) -> str:
        counts = [(self.credentials, "credential"), (self.webhooks, "webhook secret")]
        return ", ".join(f"{n} {what}{'s' if n != 1 else ''}" for n, what in counts if n)


# Webhook secrets are sealed like credentials, with the kind 'webhook_secret' in the
# associated data (notify/subscriptions.py, SECRET_KIND).
_SEALED_SQL = """
WITH sealed AS (
    SELECT key_id, id, owner, kind, wrapped_key FROM agents.credentials
    UNION ALL
    SELECT secret_key_id, id, owner, 'webhook_secret', secret_wrapped_key
      FROM agents.webhook_subscriptions)
SELECT DISTINCT ON (key_id) key_id, id, owner, kind, wrapped_key,
       count(*) FILTER (WHERE kind <> 'webhook_secret') OVER (PARTITION BY key_id) AS credentials,
       count(*) FILTER (WHERE kind = 'webhook_secret') OVER (PARTITION BY key_id) AS webhooks
  FROM sealed ORDER BY key_id, id
"""


def _sealed(db: Database) -> dict[str, _Sealed]:
    """Per master key id in use (all owners: the dispatcher's view)."""
    with db.as_dispatcher() as conn:
        rows = conn.execute(_SEALED_SQL).fetchall()
    return {
        row["key_id"]: _Sealed(
            int(row["credentials"]),
            int(row["webhooks"]),
            CredentialIdentity(UUID(str(row["id"])), UUID(str(row["owner"])), row["kind"]),
            bytes(row["wrapped_key"]),
        )
        for row in rows
    }


def _missing(usage: Mapping[str, _Sealed], configured: list[str]) -> str:
    return ", ".join(
        f"{key_id!r} ({sealed})" for key_id, sealed in usage.items() if key_id not in configured
    )


def load_keyring(db: Database, embedded: bool, environ: Mapping[str, str] | None = None) -> Keyring:
    """The configured keyring, refused when the database uses a key id it lacks.

    In embedded mode a local key is generated only while no credential is sealed at all.
    """
    env = os.environ if environ is None else environ
    usage = _sealed(db)
    local = config.home() / LOCAL_KEY_FILE
    configured = bool(env.get(KEY_ENV, "").strip() or env.get(KEY_FILE_ENV, "").strip())
    if not embedded and not configured and usage:
        # Nothing can be replaced here (no key is generated with DATABASE_URL): a worker
        # without keys may still run tools that need none, so this is a warning for it.
        raise ConfigurationError(
            f"no master key configured, but {_missing(usage, [])} sealed in this database;"
            f" set {KEY_ENV} or {KEY_FILE_ENV} to the keys they were sealed with"
        )
    if embedded and not configured and not local.exists() and usage:
        raise MissingMasterKey(
            f"master key missing: {_missing(usage, [])} sealed in this database, but"
            f" {local} does not exist; restore it from your backup (docs/operations.md,"
            " Backups) — no new key was generated, so nothing was lost"
        )
    try:
        keyring = keyring_from_env(embedded=embedded, environ=env)
    except ConfigurationError as exc:
        if not usage or isinstance(exc, MissingMasterKey):
            raise
        # Keys set but unusable (cut short, both variables set): a process that went on
        # without them would fail every call needing a secret, so refuse as for a missing one.
        raise MissingMasterKey(
            f"{exc.message}; {_missing(usage, [])} sealed in this database cannot be read"
            " until it is fixed"
        ) from None
    missing = _missing(usage, keyring.ids)
    if missing:
        raise MissingMasterKey(
            f"master key(s) not configured: {missing} sealed in this database; keys are read"
            f" from {key_source(env)} (configured: {', '.join(map(repr, keyring.ids))});"
            " add the missing key(s) back, newest last"
        )
    # The right id is not the right key: every bare key is 'default', every embedded one
    # 'local'. Another installation's key would fail every call that needs a secret and
    # seal new ones under a key the rest of the fleet lacks.
    wrong = ", ".join(
        f"{key_id!r} ({sealed})"
        for key_id, sealed in usage.items()
        if not sealed.opened_by(keyring.get(key_id))
    )
    if wrong:
        raise MissingMasterKey(
            f"master key(s) {wrong} sealed in this database do not open with the key of that"
            f" id read from {key_source(env)}: it is not the key they were sealed with (the"
            " same id with other bytes: another installation's key, or a new one); set the"
            " key they were sealed with — nothing was changed"
        )
    return keyring


@dataclass(frozen=True)
class KeyStatus:
    key_id: str
    configured: bool
    newest: bool
    credentials: int
    webhook_secrets: int
    # Whether the configured key of this id opens what it seals here: False for another
    # installation's key under the same id; None when not configured or sealing nothing.
    opens: bool | None

    @property
    def unreadable(self) -> bool:
        """Secrets under this id that this configuration cannot read (worker and serve refuse
        to start on it, load_keyring)."""
        return bool(self.credentials or self.webhook_secrets) and not self.opens


def key_status(db: Database, environ: Mapping[str, str] | None = None) -> list[KeyStatus]:
    """Each key id configured or in use, without generating anything: what it seals, and
    whether the configured key of that id opens it (the checks load_keyring makes)."""
    env = os.environ if environ is None else environ
    usage = _sealed(db)
    local = config.home() / LOCAL_KEY_FILE
    keyring: Keyring | None = None
    if env.get(KEY_ENV, "").strip() or env.get(KEY_FILE_ENV, "").strip():
        keyring = keyring_from_env(embedded=False, environ=env)
    elif local.exists():
        keyring = Keyring.parse(local.read_text("utf-8"), str(local))
    ids = keyring.ids if keyring is not None else []
    newest = ids[-1] if ids else None
    statuses = []
    for key_id in dict.fromkeys([*ids, *usage]):
        sealed = usage.get(key_id)
        readable = None
        if keyring is not None and key_id in ids and sealed is not None:
            readable = sealed.opened_by(keyring.get(key_id))
        statuses.append(KeyStatus(
            key_id, key_id in ids, key_id == newest, sealed.credentials if sealed else 0,
            sealed.webhooks if sealed else 0, readable,
        ))  # fmt: skip
    return statuses
