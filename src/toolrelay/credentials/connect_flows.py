"""Connect flows of the API and the page (migration 0034): an admin starts one, the same
member continues it in their browser, the provider's redirect finishes it; and how each
connected credential was connected, so a reconnect knows its provider.

The OAuth app's client secret waits sealed with the master key; owners read nothing of a
flow (it is the dispatcher role's), and a reconnect reads the old credential's app as the
dispatcher, in this process only.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final
from uuid import UUID

import psycopg

from toolrelay.credentials import connect as flow
from toolrelay.credentials import crypto
from toolrelay.credentials.keys import Keyring
from toolrelay.credentials.store import CredentialStore
from toolrelay.db import Database, translate_db_error, translated
from toolrelay.errors import InvalidArgument, NotFound
from toolrelay.tokens import Acting, Caller, acting_as, as_acting

FLOW_TTL_S: Final = 900  # seconds from starting a connect to the provider's answer


@dataclass(frozen=True)
class FlowRow:
    id: UUID
    owner: UUID
    member_id: UUID | None
    credential_id: UUID | None
    name: str
    provider: str
    issuer: str | None
    parameters: dict[str, str]
    scopes: list[str]
    allowed_hosts: list[str]
    client_id: str | None
    expires_at: datetime
    continued_at: datetime | None
    nonce: str | None = field(default=None, repr=False)
    code_verifier: str | None = field(default=None, repr=False)
    redirect_uri: str | None = None
    sealed: crypto.Envelope | None = field(default=None, repr=False)

    @property
    def acting(self) -> Acting:
        """Who stores the credential: whoever started the flow (their role checked again)."""
        if self.member_id is None:
            return self.owner
        return Caller(owner=self.owner, member_id=self.member_id)


def state_hash(state: str) -> bytes:
    return hashlib.sha256(b"connect-state:" + state.encode("utf-8")).digest()


def _ident(flow_id: UUID, owner: UUID) -> crypto.CredentialIdentity:
    return crypto.CredentialIdentity(flow_id, owner, "connect")


class ConnectFlows:
    def __init__(self, db: Database, keyring: Keyring | None) -> None:
        self._db = db
        self._keyring = keyring
        self._store = CredentialStore(db, keyring)

    def begin(
        self,
        who: Acting,
        provider: str,
        name: str | None = None,
        client_id: str | None = None,
        client_secret: str | None = None,
        scopes: tuple[str, ...] = (),
        issuer: str | None = None,
        parameters: dict[str, str] | None = None,
        allowed_hosts: tuple[str, ...] = (),
        credential_id: UUID | None = None,
    ) -> tuple[UUID, datetime]:
        """A new flow (an admin's; the database checks); its id and expiry."""
        chosen = flow.preset(provider)
        if credential_id is None and not client_id:
            raise InvalidArgument("give client_id: your OAuth app's client id at the provider")
        owner, _ = acting_as(who)
        flow_id = uuid.uuid4()
        sealed = None
        if client_secret:
            if self._keyring is None:
                raise InvalidArgument("this server has no master key to seal the client secret")
            sealed = crypto.seal(self._keyring, _ident(flow_id, owner), client_secret.encode())
        hosts = list(allowed_hosts or chosen.allowed_hosts)
        with translated(), as_acting(self._db, who) as conn:
            row = conn.execute(
                "SELECT fn_connect_begin(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " AS expires_at",
                (flow_id, credential_id, name or chosen.name, chosen.name, issuer,
                 json.dumps(parameters or {}), list(scopes), hosts, client_id,
                 sealed.key_id if sealed else None, sealed.wrapped_key if sealed else None,
                 sealed.nonce if sealed else None, sealed.ciphertext if sealed else None,
                 FLOW_TTL_S),
            ).fetchone()  # fmt: skip
        assert row is not None
        return flow_id, row["expires_at"]

    def get(self, flow_id: UUID) -> FlowRow:
        with translated(), self._db.as_dispatcher() as conn:
            row = conn.execute("SELECT * FROM agents.connect_flows WHERE id = %s", (flow_id,))
            found = row.fetchone()
        if found is None:
            raise NotFound(f"connect {flow_id} not found")
        return _row(found)

    def continued(self, row: FlowRow, started: flow.Started) -> None:
        with translated(), self._db.as_dispatcher() as conn:
            conn.execute(
                "SELECT agents.fn_connect_continue(%s, %s, %s, %s, %s)",
                (row.id, state_hash(started.state), started.nonce, started.code_verifier,
                 started.redirect_uri),
            )  # fmt: skip

    def consume(self, state: str) -> FlowRow:
        """The flow this state belongs to, used up; ConnectError when unknown, used, expired."""
        try:
            with self._db.as_dispatcher() as conn:
                found = conn.execute(
                    "SELECT * FROM agents.fn_connect_consume(%s)", (state_hash(state),)
                ).fetchone()
        except psycopg.Error as exc:
            error = translate_db_error(exc)
            if exc.sqlstate == "TR010":
                raise flow.ConnectError(error.message) from None
            raise error from None
        assert found is not None
        return _row(found)

    def connection(self, row: FlowRow) -> flow.Connection:
        """What the flow asks the provider for; a reconnect takes the old credential's app."""
        secret = None
        if row.sealed is not None:
            assert self._keyring is not None
            secret = crypto.unseal(self._keyring, _ident(row.id, row.owner), row.sealed).decode()
        client_id, scopes = row.client_id, tuple(row.scopes)
        if row.credential_id is not None:
            old = self._store.oauth_client(row.acting, row.credential_id)
            client_id = client_id or old.client_id
            secret = secret or old.client_secret
            scopes = scopes or flow.scopes_of([old.scope or ""])
        if not client_id:
            raise flow.ConnectError("the credential has no OAuth client id to reconnect with")
        return flow.Connection(
            flow.preset(row.provider), client_id, secret, scopes, row.issuer, row.parameters
        )

    def store(self, row: FlowRow, secret: str) -> UUID:
        """The tokens as the credential (a reconnect: the same id), as who started it."""
        if row.credential_id is not None:
            self._store.rotate(row.acting, row.credential_id, secret)
            made = row.credential_id
        else:
            made = self._store.add(row.acting, "oauth", row.name, secret, row.allowed_hosts)
        record_connection(self._db, made, row.owner, row.provider, row.issuer, row.parameters)
        return made

    def connected_with(self, who: Acting, credential_id: UUID) -> dict[str, Any] | None:
        """How ``credential_id`` was connected (provider, issuer, parameters), if it was."""
        with translated(), as_acting(self._db, who) as conn:
            return conn.execute(
                "SELECT provider, issuer, parameters FROM agents.credential_connections"
                " WHERE credential_id = %s",
                (credential_id,),
            ).fetchone()


def record_connection(
    db: Database,
    credential_id: UUID,
    owner: UUID,
    provider: str,
    issuer: str | None,
    parameters: dict[str, str],
) -> None:
    with translated(), db.as_dispatcher() as conn:
        conn.execute(
            "INSERT INTO agents.credential_connections (credential_id, owner, provider, issuer,"
            " parameters) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (credential_id) DO UPDATE"
            " SET provider = EXCLUDED.provider, issuer = EXCLUDED.issuer,"
            " parameters = EXCLUDED.parameters, connected_at = now()",
            (credential_id, owner, provider, issuer, json.dumps(parameters)),
        )


def _row(found: dict[str, Any]) -> FlowRow:
    sealed = None
    if found["secret_sealed"] is not None:
        sealed = crypto.Envelope(found["secret_key_id"], bytes(found["secret_wrapped"]),
                                 bytes(found["secret_nonce"]), bytes(found["secret_sealed"]))  # fmt: skip
    return FlowRow(
        id=found["id"], owner=found["owner"], member_id=found["member_id"],
        credential_id=found["credential_id"], name=found["name"], provider=found["provider"],
        issuer=found["issuer"], parameters=dict(found["parameters"]),
        scopes=list(found["scopes"]), allowed_hosts=list(found["allowed_hosts"]),
        client_id=found["client_id"], expires_at=found["expires_at"],
        continued_at=found["continued_at"], nonce=found["nonce"],
        code_verifier=found["code_verifier"], redirect_uri=found["redirect_uri"], sealed=sealed,
    )  # fmt: skip
