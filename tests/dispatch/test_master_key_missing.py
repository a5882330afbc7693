"""A worker that lacks the master key a credential is sealed with leaves the call to a worker
that has it, instead of failing it.

A key rotation across machines (docs/operations.md) is a rolling change: once one process
has the new key, whatever it writes (an added or rotated credential, an OAuth token it
refreshed, a rewrap) is sealed with it, while workers not yet restarted have only the old
key. Each call of such a credential that one of those claimed failed for good
(credential_error), an approved write included, for a configuration the operator was in the
middle of fixing. Now the call is handed back unsent and unattempted, the worker passes the
tool over for a while, says which key it lacks, and a worker with the key sends it once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from uuid import uuid4

import pytest

from tests.dispatch.conftest import DRAIN_TIMEOUT, LOOPBACK_ONLY
from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.credentials import CredentialStore, Keyring, MasterKey
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]


async def test_a_worker_without_the_key_leaves_the_call_to_one_that_has_it(
    registry: Registry,
    db: Database,
    upstream: Upstream,
    drain: Drain,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = Keyring([MasterKey("k-old", os.urandom(32))])
    both = Keyring([old.get("k-old"), MasterKey("k-new", os.urandom(32))])  # newest last
    cred = CredentialStore(db, both).add(registry.owner, "api_key", "svc", "s3cret-" + "9" * 8)
    agent, tool = agent_with_tool(
        registry, key="keyed.get", endpoint_url=f"{upstream.base_url}/keyed",
        auth_method="api_key", credential_ref=cred,
    )  # fmt: skip
    made = registry.invoke(agent, tool["key"], {})

    # The worker not yet restarted with the new key: it drains without sending anything.
    lacking = Worker(
        database_url, WorkerSettings(concurrency=4, lease_seconds=5.0, drain=True), old,
        LOOPBACK_ONLY,
    )  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="toolrelay"):
        await asyncio.wait_for(lacking.run(), DRAIN_TIMEOUT)
    row = registry.get_invocation(made)
    assert row["status"] == "running", row["error"]
    assert row["attempts"] == [] and row["attempt"] == 0 and row["lease_owner"] is None
    assert upstream.hits["/keyed"] == 0
    said = [r for r in caplog.records if getattr(r, "action", None) == "master_key_missing"]
    assert said, [r.getMessage() for r in caplog.records]
    assert said[0].key_id == "k-new" and said[0].tool == "keyed.get"  # type: ignore[attr-defined]
    assert "s3cret" not in caplog.text

    # A worker with the key sends it, once.
    await drain(keyring=both)
    row = registry.get_invocation(made)
    assert row["status"] == "completed", row["error"]
    assert upstream.hits["/keyed"] == 1 and len(row["attempts"]) == 1


async def test_a_worker_lacking_the_key_still_sends_the_other_calls(
    registry: Registry, db: Database, upstream: Upstream, database_url: str
) -> None:
    """Passing one tool over holds nothing else back: another tool's call, queued behind
    it, is sent by the same worker in the same drain."""
    old = Keyring([MasterKey("k-old", os.urandom(32))])
    both = Keyring([old.get("k-old"), MasterKey("k-new", os.urandom(32))])
    sealed_new = CredentialStore(db, both).add(registry.owner, "api_key", "new", "v-" + "1" * 8)
    agent, keyed = agent_with_tool(
        registry, key="keyed.two", endpoint_url=f"{upstream.base_url}/keyed-two",
        auth_method="api_key", credential_ref=sealed_new,
    )  # fmt: skip
    add_tool(registry, key="plain.two", endpoint_url=f"{upstream.base_url}/plain")
    registry.assign(agent, "plain.two")
    first = [registry.invoke(agent, keyed["key"], {}) for _ in range(3)]
    plain = registry.invoke(agent, "plain.two", {})
    lacking = Worker(
        database_url, WorkerSettings(concurrency=4, lease_seconds=5.0, drain=True), old,
        LOOPBACK_ONLY,
    )  # fmt: skip
    await asyncio.wait_for(lacking.run(), DRAIN_TIMEOUT)
    assert registry.get_invocation(plain)["status"] == "completed"
    assert upstream.hits["/keyed-two"] == 0
    assert {registry.get_invocation(i)["status"] for i in first} == {"running"}


async def test_a_worker_without_any_key_leaves_the_call_too(
    registry: Registry, db: Database, upstream: Upstream, drain: Drain, database_url: str
) -> None:
    """A new machine started without TOOLRELAY_MASTER_KEY: the CLI only warns (tools
    without credentials still run), and lacking every key is lacking this one. Such a
    worker failed each credentialed call it claimed credential_error, for good, where
    docs/operations.md promises a worker lacking a key gives the call back."""
    keyring = Keyring([MasterKey("k1", os.urandom(32))])
    cred = CredentialStore(db, keyring).add(registry.owner, "api_key", "svc", "s3cret-" + "7" * 8)
    agent, keyed = agent_with_tool(
        registry, key="keyed.none", endpoint_url=f"{upstream.base_url}/keyed-none",
        auth_method="api_key", credential_ref=cred,
    )  # fmt: skip
    add_tool(registry, key="plain.none", endpoint_url=f"{upstream.base_url}/plain-none")
    registry.assign(agent, "plain.none")
    made = registry.invoke(agent, keyed["key"], {})
    plain = registry.invoke(agent, "plain.none", {})

    await drain(keyring=None)
    assert registry.get_invocation(plain)["status"] == "completed"
    row = registry.get_invocation(made)
    assert (row["status"], row["error_code"], row["attempt"]) == ("running", None, 0), row["error"]
    assert upstream.hits["/keyed-none"] == 0

    await drain(keyring=keyring)
    row = registry.get_invocation(made)
    assert row["status"] == "completed", row["error"]
    assert upstream.hits["/keyed-none"] == 1


async def test_a_worker_whose_key_has_the_id_but_other_bytes_leaves_the_call(
    registry: Registry,
    db: Database,
    upstream: Upstream,
    drain: Drain,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two machines each made a key under the same id (`openssl rand` twice), and the worker
    started before any credential existed, so its start-up check had nothing to try the key
    on. Each call it claimed failed credential_error for good, an approved write included,
    and it logged nothing. Now it finds its key is not the one that sealed what it holds
    (no credential under that id opens), hands the call back unsent and unattempted and
    says so; a worker with the right key sends it once."""
    kid = f"k-{uuid4().hex[:8]}"  # one id, one key, as in production (tests share a database)
    right = Keyring([MasterKey(kid, os.urandom(32))])
    wrong = Keyring([MasterKey(kid, os.urandom(32))])
    cred = CredentialStore(db, right).add(registry.owner, "api_key", "svc", "s3cret-" + "5" * 8)
    agent, tool = agent_with_tool(
        registry, key="keyed.wrong", endpoint_url=f"{upstream.base_url}/keyed-wrong",
        auth_method="api_key", credential_ref=cred, http_method="POST", egress_class="write",
    )  # fmt: skip
    made = registry.invoke(agent, tool["key"], {})
    registry.approve(made)

    with caplog.at_level(logging.ERROR, logger="toolrelay"):
        await drain(keyring=wrong)
    row = registry.get_invocation(made)
    assert (row["status"], row["error_code"], row["attempt"]) == ("running", None, 0), row["error"]
    assert upstream.hits["/keyed-wrong"] == 0
    said = [r for r in caplog.records if getattr(r, "action", None) == "master_key_wrong"]
    assert said, [r.getMessage() for r in caplog.records]
    assert said[0].key_id == kid and "other bytes" in said[0].getMessage()  # type: ignore[attr-defined]
    assert "s3cret" not in caplog.text

    await drain(keyring=right)
    row = registry.get_invocation(made)
    assert row["status"] == "completed", row["error"]
    assert upstream.hits["/keyed-wrong"] == 1 and len(row["attempts"]) == 1


async def test_a_credential_altered_in_the_database_still_fails(
    registry: Registry, db: Database, upstream: Upstream, drain: Drain
) -> None:
    """The right key opens the other credentials sealed under its id: this one's wrapped
    key was moved from another credential, so the call fails, as before, naming it."""
    keyring = Keyring([MasterKey(f"k-{uuid4().hex[:8]}", os.urandom(32))])
    store = CredentialStore(db, keyring)
    moved = store.add(registry.owner, "api_key", "moved", "a-" + "1" * 8)
    other = store.add(registry.owner, "api_key", "other", "b-" + "2" * 8)
    with db.as_dispatcher() as conn:
        conn.execute(
            "UPDATE agents.credentials SET wrapped_key = (SELECT wrapped_key FROM"
            " agents.credentials WHERE id = %s) WHERE id = %s",
            (other, moved),
        )
    agent, tool = agent_with_tool(
        registry, key="keyed.moved", endpoint_url=f"{upstream.base_url}/keyed-moved",
        auth_method="api_key", credential_ref=moved,
    )  # fmt: skip
    made = registry.invoke(agent, tool["key"], {})
    await drain(keyring=keyring)
    row = registry.get_invocation(made)
    assert (row["status"], row["error_code"]) == ("failed", "credential_error"), row
    assert "does not decrypt" in row["error"]
    assert upstream.hits["/keyed-moved"] == 0
