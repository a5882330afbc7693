"""Webhook deliveries end to end: the trigger enqueues, the deliverer signs and sends to a
real receiver on loopback, which verifies each one with the standardwebhooks package."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from types import SimpleNamespace

import psycopg

from tests.notify.conftest import DRAIN_TIMEOUT, LOOPBACK_ONLY, PUBLIC_URL, Driver, Receiver
from tests.notify.helpers import subscribe, tool_for
from toolrelay.credentials import CredentialStore, Keyring, MasterKey
from toolrelay.dispatch.egress import make_connector
from toolrelay.dispatch.http import outbound_session
from toolrelay.dispatch.store import open_pool
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.notify.deliver import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    BACKOFF_FACTOR,
    BACKOFF_JITTER,
    DELIVERY_BATCH,
    PER_SUBSCRIPTION,
    Deliverer,
)

Drain = Callable[..., Awaitable[Worker]]


async def test_gated_call_sends_pending_approved_completed(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver, drain: Drain
) -> None:
    subscribe(owner, receiver)
    tool = tool_for(owner, receiver, gated=True)
    inv = owner.registry.invoke("bot", tool, {"text": "hi"})
    assert await deliver.once() == 1
    owner.registry.approve(inv)
    assert await deliver.once() == 1
    await drain()
    assert await deliver.once() == 1
    got = receiver.at("/hook")
    assert [r.json["type"] for r in got] == [
        "invocation.pending", "invocation.approved", "invocation.completed"]  # fmt: skip
    last = got[-1].json["data"]
    assert last["invocation_id"] == str(inv)
    assert (last["tool_key"], last["agent_name"]) == (tool, "bot")
    assert (last["status"], last["approval_status"]) == ("completed", "approved")
    assert last["link"] == f"{PUBLIC_URL}/approvals#invocation-{inv}"
    assert last["created_at"] and last["decided_at"] and last["finished_at"]
    assert got[0].json["data"]["status"] == "pending"
    # One webhook-id per delivery; each delivery is its own row, delivered.
    assert len({r.headers["webhook-id"] for r in got}) == 3
    rows = owner.webhooks.deliveries()
    assert all(r["delivered_at"] is not None and r["attempts"] == 1 for r in rows)


async def test_rejected_expired_and_failed_calls_are_announced(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver, drain: Drain, ndb: object
) -> None:
    subscribe(owner, receiver, events=("invocation.rejected", "invocation.expired",
                                       "invocation.failed"))  # fmt: skip
    gated = tool_for(owner, receiver, gated=True)
    rejected = owner.registry.invoke("bot", gated, {})
    owner.registry.reject(rejected, "not today")
    expiring = owner.registry.invoke("bot", gated, {})
    with owner.registry.db.connect(autocommit=True) as conn:  # its window closes now
        conn.execute("UPDATE agents.tool_invocations SET approval_expires_at = now()"
                     " WHERE id = %s", (expiring,))  # fmt: skip
    assert owner.registry.expire_pending() == 1
    receiver.statuses["/tool"] = [404]
    failing = tool_for(owner, receiver, gated=False, key="crm.missing")
    failed = owner.registry.invoke("bot", failing, {})
    await drain()
    assert await deliver.once() == 3
    by_type = {r.json["type"]: r.json["data"] for r in receiver.at("/hook")}
    assert by_type.keys() == {"invocation.rejected", "invocation.expired", "invocation.failed"}
    assert by_type["invocation.rejected"]["invocation_id"] == str(rejected)
    assert by_type["invocation.expired"]["approval_status"] == "expired"
    assert by_type["invocation.expired"]["invocation_id"] == str(expiring)
    assert by_type["invocation.failed"]["invocation_id"] == str(failed)
    assert by_type["invocation.failed"]["error_code"] == "http_error"
    assert by_type["invocation.failed"]["http_status"] == 404


async def test_500_then_200_is_delivered_again_after_backoff(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver
) -> None:
    receiver.statuses["/hook"] = [500, 200]
    subscribe(owner, receiver, events=("invocation.pending",))
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    assert await deliver.once() == 1
    [row] = owner.webhooks.deliveries()
    assert (row["attempts"], row["last_status"], row["delivered_at"]) == (1, 500, None)
    wait = (row["next_attempt_at"] - row["last_attempt_at"]).total_seconds()
    assert BACKOFF_BASE * (1 - BACKOFF_JITTER) - 1 <= wait <= BACKOFF_BASE + 1
    # Not due yet: a pass a moment before it finds nothing; one at its time sends it.
    assert await deliver.once(row["next_attempt_at"] - timedelta(seconds=1)) == 0
    assert await deliver.once(row["next_attempt_at"]) == 1
    [row] = owner.webhooks.deliveries()
    assert (row["attempts"], row["last_status"], row["dead"]) == (2, 200, False)
    assert row["delivered_at"] is not None
    first, second = receiver.at("/hook")
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == str(row["id"])
    assert first.body == second.body  # the same event, signed anew for each attempt


async def test_last_failed_attempt_is_a_dead_letter_and_redeliver_sends_it(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver
) -> None:
    receiver.statuses["/hook"] = [503]
    subscribe(owner, receiver, events=("invocation.pending",))
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    waits = []
    [row] = owner.webhooks.deliveries()
    now: datetime | None = None
    for _ in range(row["max_attempts"]):
        assert await deliver.once(now) == 1
        [row] = owner.webhooks.deliveries()
        waits.append((row["next_attempt_at"] - (now or row["last_attempt_at"])).total_seconds())
        now = row["next_attempt_at"]
    assert row["dead"] and row["attempts"] == row["max_attempts"] and row["last_status"] == 503
    assert now is not None
    assert await deliver.once(now + timedelta(days=365)) == 0  # dead: never claimed again
    assert [d["id"] for d in owner.webhooks.deliveries(dead=True)] == [row["id"]]
    # Exponential up to the cap (jitter aside); the last attempt schedules nothing more.
    for attempt, wait in enumerate(waits[:-1], start=1):
        expected = min(BACKOFF_CAP, BACKOFF_BASE * BACKOFF_FACTOR ** (attempt - 1))
        assert expected * (1 - BACKOFF_JITTER) - 1 <= wait <= expected + 1, (attempt, waits)
    assert len(receiver.at("/hook")) == row["max_attempts"]
    receiver.statuses["/hook"] = [200]
    again = owner.webhooks.redeliver(row["id"])
    assert (again["dead"], again["attempts"]) == (False, 0)
    assert await deliver.once() == 1
    [row] = owner.webhooks.deliveries()
    assert row["delivered_at"] is not None and not row["dead"]
    assert owner.webhooks.deliveries(dead=True) == []
    assert receiver.at("/hook")[-1].headers["webhook-id"] == str(row["id"])


async def test_private_addresses_are_refused_before_any_connection(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver
) -> None:
    hooks = [
        owner.webhooks.add(url, ["invocation.pending"])[0]["id"]
        for url in ("http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data")
    ]
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    assert await deliver.once() == 2
    # The guard refused the IP literals before the client started a request at all.
    assert (deliver.traced.requests, deliver.traced.connections) == (0, 0)
    rows = owner.webhooks.deliveries()
    assert len(rows) == 2
    for row in rows:
        assert row["last_error"].startswith("egress_blocked: egress blocked:"), row["last_error"]
        assert row["last_status"] is None and row["delivered_at"] is None
    assert any("cloud metadata" in r["last_error"] for r in rows)
    assert any("(private)" in r["last_error"] for r in rows)
    for hook in hooks:  # their retries would be due in 30 s: none for later tests to meet
        owner.webhooks.remove(hook)


async def test_slack_format_is_text_with_a_link(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver
) -> None:
    subscribe(owner, receiver, "/slack", events=("invocation.pending",), fmt="slack")
    tool = tool_for(owner, receiver, gated=True, key="ops.deploy", agent="<ops> & co")
    inv = owner.registry.invoke("<ops> & co", tool, {})
    assert await deliver.once() == 1
    [got] = receiver.at("/slack")
    assert got.headers["Content-Type"].startswith("application/json")
    assert list(got.json) == ["text"]
    text = got.json["text"]
    assert text.startswith("Call of `ops.deploy` by &lt;ops&gt; &amp; co is waiting for approval")
    assert f"<{PUBLIC_URL}/approvals#invocation-{inv}|Open it on the approvals page>" in text


async def test_no_secret_reaches_any_payload(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver, drain: Drain, ndb: object
) -> None:
    keyring = owner.webhooks._keyring
    credential_secret = "sk-live-0123456789-secret-value"
    cred = CredentialStore(owner.registry.db, keyring).add(
        owner.id, "api_key", "crm", credential_secret, []
    )
    _, webhook_secret = subscribe(owner, receiver)
    tool = tool_for(owner, receiver, gated=True, auth_method="api_key", credential_ref=str(cred),
                    auth_placement="header", auth_param_name="X-Api-Key")  # fmt: skip
    inv = owner.registry.invoke("bot", tool, {"text": "password=hunter2"})
    owner.registry.approve(inv)
    await _drain_with_keys(owner)
    while await deliver.once():
        pass
    types = [r.json["type"] for r in receiver.at("/hook")]
    assert sorted(types) == ["invocation.approved", "invocation.completed", "invocation.pending"]
    tool_requests = receiver.at("/tool")
    assert tool_requests and tool_requests[-1].headers["X-Api-Key"] == credential_secret
    stored = json.dumps([d["payload"] for d in owner.webhooks.deliveries()])
    for delivery in receiver.at("/hook"):
        sent = delivery.body.decode() + json.dumps(
            {k: v for k, v in delivery.headers.items() if k.lower() != "webhook-signature"}
        )
        for text in (sent, stored):
            assert credential_secret not in text
            assert webhook_secret not in text and webhook_secret.removeprefix("whsec_") not in text
            assert "hunter2" not in text  # the input is never part of a payload
    listed = owner.webhooks.list()[0]
    assert webhook_secret not in json.dumps(listed, default=str)
    assert {k for k in listed if k.startswith("secret")} == {"secret_rotated_at"}


async def _drain_with_keys(owner: SimpleNamespace) -> None:
    """A drain that may use credentials (its own deliverer may send some deliveries)."""
    worker = Worker(owner.registry.db.url, WorkerSettings(concurrency=4, lease_seconds=5.0,
                    drain=True), owner.webhooks._keyring, LOOPBACK_ONLY)  # fmt: skip
    await asyncio.wait_for(worker.run(), DRAIN_TIMEOUT)


async def test_another_tenant_never_receives_this_tenants_events(
    make_owner: Callable[[], SimpleNamespace], receiver: Receiver, deliver: Driver
) -> None:
    alice, bob = make_owner(), make_owner()
    subscribe(alice, receiver, "/alice")
    subscribe(bob, receiver, "/bob")
    inv = alice.registry.invoke("bot", tool_for(alice, receiver, gated=True), {})
    while await deliver.once():
        pass
    assert [r.json["data"]["invocation_id"] for r in receiver.at("/alice")] == [str(inv)]
    assert receiver.at("/bob") == []
    assert bob.webhooks.deliveries() == []
    with psycopg.connect(alice.registry.db.url) as conn:  # not only what RLS lets bob see
        rows = conn.execute(
            "SELECT s.owner FROM agents.webhook_deliveries d"
            " JOIN agents.webhook_subscriptions s ON s.id = d.subscription_id"
            " WHERE d.invocation_id = %s",
            (inv,),
        ).fetchall()
    assert rows == [(alice.id,)]


async def test_tenant_without_subscriptions_gets_no_delivery_rows(
    make_owner: Callable[[], SimpleNamespace], receiver: Receiver, drain: Drain, ndb: object
) -> None:
    quiet, other = make_owner(), make_owner()
    subscribe(other, receiver)  # someone has webhooks; this tenant does not
    disabled, _ = quiet.webhooks.add(f"{receiver.base_url}/off", ["invocation.pending"])
    quiet.webhooks.set_enabled(disabled["id"], False)
    gated = tool_for(quiet, receiver, gated=True)
    approved = quiet.registry.invoke("bot", gated, {})
    quiet.registry.approve(approved)
    quiet.registry.reject(quiet.registry.invoke("bot", gated, {}))
    quiet.registry.invoke("bot", tool_for(quiet, receiver, gated=False, key="crm.read"), {})
    await drain()
    with psycopg.connect(quiet.registry.db.url) as conn:
        count = conn.execute("SELECT count(*) FROM agents.webhook_deliveries WHERE owner = %s",
                             (quiet.id,)).fetchone()  # fmt: skip
    assert count == (0,)
    assert quiet.registry.get_invocation(approved)["status"] == "completed"


async def test_every_door_enqueues_deleted_tool_and_regated_call(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver, drain: Drain
) -> None:
    subscribe(owner, receiver, events=("invocation.pending", "invocation.failed"))
    doomed = tool_for(owner, receiver, gated=True, key="crm.doomed")
    waiting = owner.registry.invoke("bot", doomed, {})
    regated = tool_for(owner, receiver, gated=False, key="crm.regated")
    later = owner.registry.invoke("bot", regated, {})  # made ungated: no event yet
    owner.registry.update_tool(regated, {"requires_approval": True})  # gated before the claim
    with owner.registry.db.as_owner(owner.id) as conn:  # a plain DELETE, as psql would
        conn.execute("DELETE FROM agents.tools_registry WHERE key = %s", (doomed,))
    await drain()  # the claim sends the regated call back to approval
    while await deliver.once():
        pass
    seen = [(r.json["type"], r.json["data"]["invocation_id"]) for r in receiver.at("/hook")]
    assert seen == [
        ("invocation.pending", str(waiting)),
        ("invocation.failed", str(waiting)),
        ("invocation.pending", str(later)),
    ]
    failed = receiver.at("/hook")[1].json["data"]
    assert (failed["tool_key"], failed["tool_id"], failed["error_code"]) == (
        doomed, None, "tool_inactive")  # fmt: skip


async def test_a_redirect_is_not_followed(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver
) -> None:
    receiver.statuses["/moved"] = [307]
    subscribe(owner, receiver, "/moved", events=("invocation.pending",))
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    assert await deliver.once() == 1
    [row] = owner.webhooks.deliveries()
    assert (row["last_status"], row["delivered_at"]) == (307, None)
    assert "redirects are not followed" in row["last_error"]
    assert len(receiver.received) == 1 and receiver.at("/elsewhere") == []  # not followed


async def test_a_broken_row_fails_alone_and_the_batch_goes_on(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver
) -> None:
    sub, _ = subscribe(owner, receiver, events=("invocation.pending",))
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    with psycopg.connect(owner.registry.db.url, autocommit=True) as conn:  # not the trigger's
        conn.execute(
            "INSERT INTO agents.webhook_deliveries (owner, subscription_id, invocation_id,"
            " event, payload) VALUES (%s, %s, gen_random_uuid(), 'invocation.pending', '{}')",
            (owner.id, sub["id"]),
        )
    assert await deliver.once() == 2
    by_error = {r["last_error"]: r for r in owner.webhooks.deliveries()}
    assert by_error.keys() == {None, "internal error: KeyError"}
    assert by_error[None]["delivered_at"] is not None
    assert len(receiver.at("/hook")) == 1
    owner.webhooks.remove(sub["id"])  # the broken row's retry is no later test's business


async def test_a_cookie_a_receiver_sets_goes_out_with_no_later_delivery(
    make_owner: Callable[[], SimpleNamespace], receiver: Receiver, deliver: Driver
) -> None:
    """One session delivers every owner's webhooks: a receiver's Set-Cookie must not come
    back with the next delivery to that host, this owner's or another's."""
    receiver.cookies["/hook"] = ("sid", "receiver-session")
    by_name = receiver.base_url.replace("127.0.0.1", "localhost")  # no jar keeps an IP's
    first, second = make_owner(), make_owner()
    for owner, path in ((first, "/hook"), (second, "/other")):
        _, receiver.secrets[path] = owner.webhooks.add(
            f"{by_name}{path}", ["invocation.pending"], "standard"
        )
        owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    assert await deliver.once() == 2
    first.registry.invoke("bot", "crm.lookup", {})
    assert await deliver.once() == 1
    assert [r.path for r in receiver.received].count("/hook") == 2
    assert [r.headers.get("Cookie") for r in receiver.received] == [None] * 3


async def test_a_slow_receiver_does_not_hold_back_other_owners_deliveries(
    make_owner: Callable[[], SimpleNamespace], receiver: Receiver, deliver: Driver
) -> None:
    """A receiver that takes its time (up to the 15 s a delivery may take) with more
    deliveries queued than a pass claims: every pass was all of them, sent together and
    recorded together, and another owner's delivery behind them waited for each pass to
    end. Now each subscription has PER_SUBSCRIPTION deliveries in flight at most, and a
    slot that frees is filled at once, whatever the rest are waiting for."""
    slow, quick = make_owner(), make_owner()
    subscribe(slow, receiver, "/slow", events=("invocation.pending",))
    gate = receiver.held["/slow"] = asyncio.Event()
    tool = tool_for(slow, receiver, gated=True)
    queued = DELIVERY_BATCH + 8
    for _ in range(queued):
        slow.registry.invoke("bot", tool, {})
    subscribe(quick, receiver, "/quick", events=("invocation.pending",))
    quick.registry.invoke("bot", tool_for(quick, receiver, gated=True), {})
    stopping = asyncio.Event()
    running = asyncio.create_task(deliver.deliverer.run(stopping))
    try:
        await receiver.until("/quick", 1, limit=10.0)  # while the slow ones are held
        await receiver.until("/slow", PER_SUBSCRIPTION, limit=10.0)
        assert len(receiver.at("/slow")) == PER_SUBSCRIPTION  # its share, and no more
    finally:
        gate.set()
        stopping.set()
        await asyncio.wait_for(running, DRAIN_TIMEOUT)
    while await deliver.once():
        pass
    ids = [r.headers["webhook-id"] for r in receiver.at("/slow")]
    assert len(ids) == len(set(ids)) == queued  # each delivered once
    assert all(r["delivered_at"] is not None for r in slow.webhooks.deliveries())


async def test_a_deliverer_without_the_master_key_spends_no_attempt(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver, notify_url: str
) -> None:
    """A webhook secret sealed with a key this process lacks (a key rotation reaching the
    machines one by one) is this process's fault, not the receiver's: each try is recorded
    with the reason and spends no attempt, so the delivery never dies of it and is sent,
    once, by a deliverer that has the key."""
    subscribe(owner, receiver, events=("invocation.pending",))
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    [row] = owner.webhooks.deliveries()
    lacking = Keyring([MasterKey("another", os.urandom(32))])
    pool = open_pool(notify_url, max_size=2)
    await pool.open(wait=True)
    now: datetime | None = None
    async with outbound_session(make_connector(LOOPBACK_ONLY)) as session:
        without = Deliverer(pool, lacking, LOOPBACK_ONLY, session, public_url=PUBLIC_URL)
        for _ in range(row["max_attempts"] + 2):
            assert await without.deliver_once(now) >= 1  # others' rows due by then too
            [row] = owner.webhooks.deliveries()
            assert (row["attempts"], row["dead"]) == (0, False)
            assert "master key 'notify-test' is not configured" in row["last_error"]
            now = row["next_attempt_at"]
    await pool.close()
    assert receiver.at("/hook") == []
    assert await deliver.once(now) >= 1  # this process has the key
    [row] = owner.webhooks.deliveries()
    assert row["delivered_at"] is not None and row["attempts"] == 1, row
    assert len(receiver.at("/hook")) == 1


async def test_a_deliverer_whose_key_has_the_id_but_other_bytes_spends_no_attempt(
    owner: SimpleNamespace, receiver: Receiver, deliver: Driver, notify_url: str
) -> None:
    """Two machines each made a key under one id, and this one started before anything was
    sealed: every try failed "does not decrypt" and spent an attempt, so each delivery died.
    As with a key it lacks, the tries are recorded with the reason and spend nothing."""
    subscribe(owner, receiver, events=("invocation.pending",))
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    [row] = owner.webhooks.deliveries()
    impostor = Keyring([MasterKey(row_key_id(notify_url, row), os.urandom(32))])
    pool = open_pool(notify_url, max_size=2)
    await pool.open(wait=True)
    now: datetime | None = None
    async with outbound_session(make_connector(LOOPBACK_ONLY)) as session:
        wrong = Deliverer(pool, impostor, LOOPBACK_ONLY, session, public_url=PUBLIC_URL)
        for _ in range(row["max_attempts"] + 2):
            assert await wrong.deliver_once(now) >= 1
            [row] = owner.webhooks.deliveries()
            assert (row["attempts"], row["dead"]) == (0, False), row["last_error"]
            assert "other bytes" in row["last_error"]
            now = row["next_attempt_at"]
    await pool.close()
    assert receiver.at("/hook") == []
    assert await deliver.once(now) >= 1  # the right key
    [row] = owner.webhooks.deliveries()
    assert row["delivered_at"] is not None and row["attempts"] == 1, row
    assert len(receiver.at("/hook")) == 1


def row_key_id(url: str, delivery: dict[str, object]) -> str:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT secret_key_id FROM agents.webhook_subscriptions WHERE id = %s",
            (delivery["subscription_id"],),
        ).fetchone()
    assert found is not None
    return str(found[0])
