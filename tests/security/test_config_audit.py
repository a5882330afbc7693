"""The audit log of configuration keeps no secret, shows each tenant only its own rows, is
append-only for everyone (the table's owner included), shows an agent identity nothing, and
costs the agent's path nothing: a dispatcher run adds no row."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool
from tests.security.test_agent_identity import DOORS, as_agent
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry
from toolrelay.registry.audit import read_audit
from toolrelay.tokens import TokenStore, hash_token

Drain = Callable[..., Awaitable[Worker]]
SECRET = "sk_live_" + os.urandom(12).hex()
ROTATED = "sk_live_" + os.urandom(12).hex()
OAUTH = {
    "access_token": "at-" + os.urandom(8).hex(),
    "refresh_token": "rt-" + os.urandom(8).hex(),
    "token_url": "https://auth.example.com/token",
    "client_id": "cid",
    "client_secret": "cs-" + os.urandom(8).hex(),
}
SEALED_OAUTH_FIELDS = ("access_token", "refresh_token", "client_secret")


def log_text(database_url: str, owner: UUID) -> str:
    """Every row of the owner's log as text, read as the superuser (nothing filtered)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT coalesce(string_agg(row_to_json(a)::text, E'\\n'), '')"
            " FROM agents.config_audit a WHERE owner = %s",
            (owner,),
        ).fetchone()
    assert row is not None
    return str(row[0])


def count(database_url: str, owner: UUID | None = None) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM agents.config_audit WHERE %(owner)s::uuid IS NULL"
            " OR owner = %(owner)s",
            {"owner": owner},
        ).fetchone()
    assert row is not None
    return int(row[0])


def envelope(db: Database, credential: UUID) -> list[bytes]:
    with db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT wrapped_key, nonce, ciphertext FROM agents.credentials WHERE id = %s",
            (credential,),
        ).fetchone()
    assert row is not None
    return [bytes(row[column]) for column in ("wrapped_key", "nonce", "ciphertext")]


def spellings(value: bytes) -> set[str]:
    """The forms a value could take in JSON text: hex (as bytea prints it too), base64."""
    b64 = base64.b64encode(value).decode()
    url = base64.urlsafe_b64encode(value).decode()
    return {value.hex(), value.hex().upper(), b64, b64.rstrip("="), url, url.rstrip("="),
            hashlib.sha256(value).hexdigest()}  # fmt: skip


def test_no_secret_reaches_the_log(registry: Registry, db: Database, database_url: str) -> None:
    owner = registry.owner
    store = CredentialStore(db, Keyring.parse(generate_master_key()))
    api_key = store.add(owner, "api_key", "stripe", SECRET)
    sealed = envelope(db, api_key)
    store.rotate(owner, api_key, ROTATED)
    sealed += envelope(db, api_key)
    store.set_hosts(owner, api_key, ["api.stripe.com"])
    oauth = store.add(owner, "oauth", "crm", json.dumps(OAUTH))
    sealed += envelope(db, oauth)
    add_tool(registry, "stripe.charge", endpoint_url="https://api.stripe.com/v1/charges",
             auth_method="api_key", credential_ref=api_key)  # fmt: skip
    tokens = TokenStore(db)
    _, owner_token = tokens.create(owner, name="ci")
    info, _ = tokens.create(owner, registry.create_agent("bot"), name="bot")
    tokens.revoke(owner, info.id)
    assert tokens.lookup(owner_token) is not None
    registry.update_tool("stripe.charge", {"credential_ref": None, "auth_method": "none"})
    store.delete(owner, api_key)

    text = log_text(database_url, owner)
    kinds = {json.loads(line)["kind"] for line in text.splitlines()}
    assert kinds == {"credential", "tool", "agent", "token"}
    plain = [SECRET, ROTATED, owner_token, *(OAUTH[k] for k in SEALED_OAUTH_FIELDS)]
    forbidden: set[str] = set(plain)
    for raw in [*(value.encode() for value in plain), *sealed, hash_token(owner_token)]:
        forbidden |= spellings(raw)
    assert [form for form in forbidden if form in text] == []
    for column in ("ciphertext", "wrapped_key", "nonce", "key_id", "token_hash", "last_used_at"):
        assert f'"{column}"' not in text, column


def test_an_owner_reads_only_its_own_tenants_rows(
    make_registry: Callable[[], Registry], db: Database
) -> None:
    alice, bob = make_registry(), make_registry()
    alices = alice.create_agent("bot")
    bobs = bob.create_agent("bot")
    add_tool(bob, "bob.tool")
    with db.as_owner(alice.owner) as conn:
        rows = conn.execute("SELECT owner, object_id FROM agents.config_audit").fetchall()
    assert rows == [{"owner": alice.owner, "object_id": alices}]
    assert {r["object_id"] for r in read_audit(bob)} == {bobs, bob.get_tool("bob.tool")["id"]}
    assert read_audit(bob, object=str(alices)) == []  # another tenant's object: nothing
    assert [r["object_id"] for r in read_audit(alice, object="bot")] == [alices]


# Who tries, and how they get a transaction.
ACTORS = ("owner", "service_role", "table_owner", *(f"agent:{door}" for door in DOORS))
WRITES = {
    "update": "UPDATE agents.config_audit SET changes = '{}', actor = NULL",
    "delete": "DELETE FROM agents.config_audit",
    "truncate": "TRUNCATE agents.config_audit",
    "insert": "INSERT INTO agents.config_audit (owner, actor_role, session_role, kind, action,"
    " changes) VALUES (%(owner)s, 'authenticated', 'x', 'tool', 'delete', '{}')",
}


@contextmanager
def transaction(
    db: Database, database_url: str, actor: str, owner: UUID, bot: UUID
) -> Iterator[psycopg.Connection[Any]]:
    if actor == "owner":
        with db.as_owner(owner) as conn:
            yield conn
    elif actor == "service_role":
        with db.as_dispatcher() as conn:
            yield conn
    elif actor == "table_owner":  # the migrating role: here a superuser, stopped by triggers
        with psycopg.connect(database_url) as plain:
            yield plain
    else:
        with as_agent(db, actor.partition(":")[2], owner, bot) as conn:
            yield conn


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("actor", ACTORS)
def test_nobody_rewrites_the_log(
    registry: Registry, db: Database, database_url: str, actor: str, write: str
) -> None:
    owner = registry.owner
    bot = registry.create_agent("bot")
    before = count(database_url)
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege) as refused,
        transaction(db, database_url, actor, owner, bot) as conn,
    ):
        conn.execute(WRITES[write], {"owner": owner})
    message = str(refused.value)
    if actor == "table_owner":
        assert "agents.config_audit is" in message and "refused" in message
    else:
        assert "permission denied for table config_audit" in message
    assert count(database_url) == before


@pytest.mark.parametrize("door", DOORS)
def test_an_agent_identity_reads_nothing(registry: Registry, db: Database, door: str) -> None:
    add_tool(registry, "notes.list")
    bot = registry.create_agent("bot")
    registry.assign("bot", "notes.list")
    assert len(read_audit(registry)) == 3
    with as_agent(db, door, registry.owner, bot) as conn:
        assert conn.execute("SELECT * FROM agents.config_audit").fetchall() == []
    assert read_audit(Registry(db, registry.owner, agent_id=bot)) == []


async def test_a_dispatcher_run_adds_no_audit_rows(
    registry: Registry, db: Database, database_url: str, upstream: Upstream, drain: Drain
) -> None:
    owner = registry.owner
    keyring = Keyring.parse(generate_master_key())
    credential = CredentialStore(db, keyring).add(owner, "api_key", "upstream", SECRET)
    for key, method in (("up.read", "GET"), ("up.write", "POST")):
        add_tool(registry, key, endpoint_url=f"{upstream.base_url}/{key}", http_method=method,
                 egress_class="read_only" if method == "GET" else "write",
                 auth_method="api_key", credential_ref=credential)  # fmt: skip
    bot = registry.create_agent("bot")
    registry.assign("bot", "up.read")
    registry.assign("bot", "up.write")
    _, token = TokenStore(db).create(owner, bot, name="bot")
    before = count(database_url, owner)

    caller = TokenStore(db).lookup(token)  # the API's and MCP's check: touches last_used_at
    assert caller is not None and caller.agent_id == bot
    agent = Registry(db, owner, agent_id=bot)
    reads = [agent.invoke("bot", "up.read", {}) for _ in range(3)]
    called = agent.call("up.read", {}).invocation_id
    assert called is not None
    write = agent.invoke("bot", "up.write", {})
    registry.approve(write)
    await drain(keyring=keyring)
    calls = [*reads, called, write]
    assert {registry.get_invocation(c)["status"] for c in calls} == {"completed"}
    with db.as_dispatcher() as conn:
        used = conn.execute(
            "SELECT last_used_at FROM agents.credentials WHERE id = %s", (credential,)
        ).fetchone()
    assert used is not None and used["last_used_at"] is not None  # the worker did touch it
    assert count(database_url, owner) == before
    # Nothing on the invocation tables calls the audit trigger at all.
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        audited = conn.execute(
            "SELECT tgrelid::regclass::text AS tbl FROM pg_trigger"
            " WHERE tgfoid = 'agents.tg_config_audit'::regproc ORDER BY 1"
        ).fetchall()
    assert {r["tbl"] for r in audited} == {
        "agents.agents", "agents.api_tokens", "agents.credentials", "agents.members",
        "agents.policy_confirmations", "agents.tool_assignments", "agents.tool_policies",
        "agents.tools_registry", "agents.webhook_subscriptions",
    }  # fmt: skip
