"""The other doors: the CLI, /v1/webhooks, row-level security, and the worker's own loop."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from types import SimpleNamespace

import aiohttp
import psycopg
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.notify.conftest import LOOPBACK_ONLY, Receiver
from tests.notify.helpers import subscribe, tool_for
from toolrelay.api import ApiSettings, create_app
from toolrelay.api.approvals import COOKIE
from toolrelay.cli import context
from toolrelay.cli.main import app as cli_app
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.dispatch.egress import make_connector
from toolrelay.dispatch.store import open_pool
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.notify import Deliverer
from toolrelay.notify.payloads import link
from toolrelay.notify.subscriptions import rewrap_secrets
from toolrelay.registry.members import Members
from toolrelay.tokens import TokenStore

ARRIVAL_TIMEOUT = 30.0  # seconds


def test_cli_prints_the_secret_once_and_never_again(
    owner: SimpleNamespace, keyring: Keyring, notify_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    master = ",".join(f"{k}:{base64.b64encode(keyring.get(k).key).decode()}" for k in keyring.ids)
    monkeypatch.setenv("DATABASE_URL", notify_url)
    monkeypatch.setenv("TOOLRELAY_OWNER", str(owner.id))
    monkeypatch.setenv("TOOLRELAY_MASTER_KEY", master)
    context.database.cache_clear()
    runner = CliRunner()

    def run(*args: str, stdin: str | None = None) -> tuple[str, str]:
        result = runner.invoke(cli_app, ["webhook", *args], input=stdin)
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
        return result.stdout, result.stderr

    try:  # the URL on stdin, never in argv (test_sealed_url.py)
        out, err = run("add", "--events", "pending,approved", "--format", "slack",
                       stdin="https://hooks.example.com/x\n")  # fmt: skip
        secret = out.strip()
        assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
        [hook] = json.loads(run("list", "-o", "json")[0])["items"]
        assert hook["id"] in err and (hook["format"], hook["enabled"]) == ("slack", True)
        assert hook["events"] == ["invocation.pending", "invocation.approved"]
        rotated = run("rotate-secret", hook["id"])[0].strip()
        assert rotated.startswith("whsec_") and rotated != secret
        listed = run("list", "-o", "json")[0] + run("deliveries", "-o", "json")[0]
        assert secret not in listed and rotated not in listed
        assert json.loads(run("deliveries", "--dead", "-o", "json")[0]) == {"items": []}
        run("disable", hook["id"])
        assert json.loads(run("list", "-o", "json")[0])["items"][0]["enabled"] is False
        run("remove", hook["id"])
        assert json.loads(run("list", "-o", "json")[0]) == {"items": []}
        bad = runner.invoke(cli_app, ["webhook", "add", "--events", "pending"], input="ftp://x")
        assert bad.exit_code == 1 and "http:// or https://" in bad.stderr
        bad = runner.invoke(cli_app, ["webhook", "add", "-e", "sent"], input="https://x.example")
        assert bad.exit_code == 1 and "unknown event 'sent'" in bad.stderr
    finally:
        context.database.cache_clear()


def test_api_manages_webhooks_for_owners_only(
    make_owner: Callable[[], SimpleNamespace], keyring: Keyring, notify_url: str, ndb: object
) -> None:
    alice, bob = make_owner(), make_owner()
    tokens = TokenStore(alice.registry.db)
    alice.registry.create_agent("bot")
    agent = alice.registry.get_agent("bot")["id"]
    auth = {who: {"Authorization": f"Bearer {tokens.create(o, a)[1]}"}
            for who, o, a in (("alice", alice.id, None), ("bob", bob.id, None),
                              ("agent", alice.id, agent))}  # fmt: skip
    viewer = Members(alice.registry.db).add(alice.id, "Vic", "viewer")
    auth["viewer"] = {"Authorization": f"Bearer {tokens.create(alice.id, member_id=viewer.id)[1]}"}
    app = create_app(ApiSettings(database_url=notify_url, keyring=keyring, run_worker=False))
    with TestClient(app) as client:
        made = client.post("/v1/webhooks", headers=auth["alice"],
                           json={"url": "https://hooks.example.com/a",
                                 "events": ["invocation.failed"]})  # fmt: skip
        assert made.status_code == 201, made.text
        hook = made.json()
        assert hook["secret"].startswith("whsec_") and hook["format"] == "standard"
        listed = client.get("/v1/webhooks", headers=auth["alice"]).json()["items"]
        assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
        assert client.get("/v1/webhooks", headers=auth["bob"]).json() == {"items": []}
        assert client.get(f"/v1/webhooks/{hook['id']}", headers=auth["bob"]).status_code == 404
        assert client.get("/v1/webhooks", headers=auth["agent"]).status_code == 403
        # A member acts with its role: only an admin reads or changes them (a webhook's URL
        # can be its credential: migration 0027).
        assert client.get("/v1/webhooks", headers=auth["viewer"]).json() == {"items": []}
        for method, path in (("post", f"/v1/webhooks/{hook['id']}/rotate-secret"),
                             ("delete", f"/v1/webhooks/{hook['id']}")):  # fmt: skip
            assert client.request(method, path, headers=auth["viewer"]).status_code in (403, 404)
        refused = client.post("/v1/webhooks", headers=auth["viewer"],
                              json={"url": "https://hooks.example.com/v"})  # fmt: skip
        assert refused.status_code == 403 and "admin" in refused.text
        rotated = client.post(f"/v1/webhooks/{hook['id']}/rotate-secret", headers=auth["alice"])
        assert rotated.status_code == 200 and rotated.json()["secret"] != hook["secret"]
        patched = client.patch(f"/v1/webhooks/{hook['id']}", headers=auth["alice"],
                               json={"enabled": False})  # fmt: skip
        assert patched.json()["enabled"] is False
        got = client.get("/v1/webhooks/deliveries?dead=true", headers=auth["alice"])
        assert got.status_code == 200 and got.json() == {"items": []}
        missing = client.post(f"/v1/webhooks/deliveries/{hook['id']}/redeliver",
                              headers=auth["alice"])  # fmt: skip
        assert missing.status_code == 404
        bad = client.post(
            "/v1/webhooks",
            headers=auth["alice"],
            json={"url": "https://x.example", "events": ["invocation.sent"]},
        )
        assert bad.status_code == 422
        assert client.delete(f"/v1/webhooks/{hook['id']}", headers=auth["bob"]).status_code == 404
        assert client.delete(f"/v1/webhooks/{hook['id']}", headers=auth["alice"]).status_code == 204
        assert client.get("/v1/webhooks", headers=auth["alice"]).json() == {"items": []}


async def test_rls_owner_sees_its_own_agent_sees_none_secrets_unreadable(
    make_owner: Callable[[], SimpleNamespace], receiver: Receiver, notify_url: str
) -> None:
    alice, bob = make_owner(), make_owner()
    subscribe(alice, receiver)
    alice.registry.invoke("bot", tool_for(alice, receiver, gated=True), {})
    agent = alice.registry.get_agent("bot")["id"]

    def as_caller(conn: psycopg.Connection[tuple[object, ...]], owner: object,
                  agent_id: object = None) -> None:  # fmt: skip
        claims = {"sub": str(owner), "role": "authenticated"}
        if agent_id:
            claims["agent_id"] = str(agent_id)
        conn.execute(
            "SELECT set_config('role', 'authenticated', true),"
            " set_config('request.jwt.claims', %s, true)",
            (json.dumps(claims),),
        )

    def count(owner: object, table: str, agent_id: object = None) -> int:
        with psycopg.connect(notify_url) as conn:
            as_caller(conn, owner, agent_id)
            row = conn.execute(f"SELECT count(*) FROM agents.{table}").fetchone()
            assert row is not None
            return int(str(row[0]))

    assert count(alice.id, "webhook_subscriptions") == 1
    assert count(alice.id, "webhook_deliveries") == 1
    assert count(bob.id, "webhook_subscriptions") == count(bob.id, "webhook_deliveries") == 0
    assert count(alice.id, "webhook_subscriptions", agent) == 0
    assert count(alice.id, "webhook_deliveries", agent) == 0
    for statement in (
        "SELECT secret_ciphertext FROM agents.webhook_subscriptions",
        "SELECT secret_wrapped_key FROM agents.webhook_subscriptions",
        "SELECT url_ciphertext FROM agents.webhook_subscriptions",
        "INSERT INTO agents.webhook_deliveries (owner, subscription_id, invocation_id, event,"
        " payload) SELECT owner, id, gen_random_uuid(), 'invocation.failed', '{}'"
        " FROM agents.webhook_subscriptions",
        "UPDATE agents.webhook_deliveries SET dead = true",
    ):
        with psycopg.connect(notify_url) as conn:
            as_caller(conn, alice.id)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with psycopg.connect(notify_url) as conn:  # an agent cannot subscribe either
        as_caller(conn, alice.id, agent)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="agent identity"):
            conn.execute("DELETE FROM agents.webhook_subscriptions")


async def test_the_worker_delivers_in_its_own_loop(
    owner: SimpleNamespace,
    receiver: Receiver,
    keyring: Keyring,
    notify_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLRELAY_PUBLIC_URL", "https://relay.example.com/")
    subscribe(owner, receiver, events=("invocation.completed",))
    inv = owner.registry.invoke("bot", tool_for(owner, receiver, gated=False), {})
    worker = Worker(notify_url, WorkerSettings(concurrency=4, lease_seconds=5.0), keyring,
                    LOOPBACK_ONLY)  # fmt: skip
    task = asyncio.create_task(worker.run())
    try:
        while not receiver.at("/hook"):
            receiver.arrived.clear()
            await asyncio.wait_for(receiver.arrived.wait(), ARRIVAL_TIMEOUT)
    finally:
        worker.stop()
        await asyncio.wait_for(task, ARRIVAL_TIMEOUT)
    [got] = receiver.at("/hook")
    assert got.json["data"]["invocation_id"] == str(inv)
    assert got.json["data"]["link"] == f"https://relay.example.com/approvals#invocation-{inv}"
    metrics = worker.metrics.render()
    assert 'toolrelay_webhook_attempts_total{result="delivered"} 1' in metrics
    assert 'toolrelay_webhook_deliveries{state="pending"}' in metrics


async def test_rewrap_moves_webhook_secrets_to_the_newest_master_key(
    owner: SimpleNamespace, receiver: Receiver, keyring: Keyring, notify_url: str
) -> None:
    """Last in this module: every subscription here ends up under the new key."""
    _, secret = subscribe(owner, receiver, events=("invocation.pending",))
    new_key = MasterKey("notify-next", os.urandom(32))
    both = Keyring([*(keyring.get(k) for k in keyring.ids), new_key])
    assert rewrap_secrets(owner.registry.db, both) >= 1
    assert rewrap_secrets(owner.registry.db, both) == 0
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    pool = open_pool(notify_url, max_size=1)
    await pool.open(wait=True)
    try:
        async with aiohttp.ClientSession(connector=make_connector(LOOPBACK_ONLY)) as session:
            # Only the new key: the old one may be removed, the secret is the same.
            only_new = Deliverer(pool, Keyring([new_key]), LOOPBACK_ONLY, session)
            while await only_new.deliver_once():
                pass
    finally:
        await pool.close()
    [got] = receiver.at("/hook")  # verified with the secret printed at creation
    assert got.json["type"] == "invocation.pending" and receiver.secrets["/hook"] == secret


def test_the_link_opens_the_call_on_the_approvals_page(
    owner: SimpleNamespace, receiver: Receiver, keyring: Keyring, notify_url: str
) -> None:
    inv = owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    url = link("https://relay.example.com", str(inv))
    assert url == f"https://relay.example.com/approvals#invocation-{inv}"
    token = TokenStore(owner.registry.db).create(owner.id)[1]
    app = create_app(ApiSettings(database_url=notify_url, keyring=keyring, run_worker=False))
    with TestClient(app) as client:
        client.cookies.set(COOKIE, token)
        page = client.get("/approvals")
    assert page.status_code == 200
    assert f'id="{url.partition("#")[2]}"' in page.text  # the fragment names the call's card
