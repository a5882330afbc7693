"""A webhook's URL is sealed at rest like its signing secret (migration 0057).

A Slack incoming webhook's path is its credential (and a signed receiver's URL may carry a
token in its path or query). It used to be taken from argv by `toolrelay webhook add` (ps
and shell history keep it), stored in plain text in webhook_subscriptions.url (pg_dump held
it) and returned by every listing. Now: read from stdin, sealed under the secret's master
key, shown as scheme://host[:port]/…, and still delivered to in full."""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import aiohttp
import psycopg
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tests.notify.conftest import LOOPBACK_ONLY, Driver, Receiver
from tests.notify.helpers import tool_for
from toolrelay.api import ApiSettings, create_app
from toolrelay.cli import context
from toolrelay.cli.main import app as cli_app
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.dispatch.egress import make_connector
from toolrelay.dispatch.store import open_pool
from toolrelay.notify import Deliverer, Webhooks, subscriptions
from toolrelay.notify import deliver as delivering
from toolrelay.notify.subscriptions import rewrap_secrets, seal_secret
from toolrelay.tokens import TokenStore


def slack_path() -> tuple[str, str]:
    """An incoming webhook's path (its credential) and the token in it, unique per test."""
    token = secrets.token_hex(12)
    return (
        f"/services/T{secrets.token_hex(4).upper()}/B{secrets.token_hex(4).upper()}/{token}",
        token,
    )


def plaintext_holding(url: str, needle: str) -> list[str]:
    """Every place pg_dump would show ``needle``: each text, jsonb and array column of the
    webhook tables (and the audit log), read as the superuser; and pg_dump itself."""
    found: list[str] = []
    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT table_schema, table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'agents' AND table_name IN"
            " ('webhook_subscriptions', 'webhook_deliveries', 'config_audit')"
            " AND data_type IN ('text', 'jsonb', 'json', 'ARRAY', 'character varying')"
        ).fetchall()
        assert len(columns) >= 6, columns
        for schema, table, column in columns:
            hit = conn.execute(
                f'SELECT count(*) FROM "{schema}"."{table}" WHERE strpos("{column}"::text, %s) > 0',
                (needle,),
            ).fetchone()
            if hit and hit[0]:
                found.append(f"{table}.{column}")
    if shutil.which("pg_dump"):
        dump = subprocess.run(["pg_dump", "--data-only", "--no-owner", url],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert dump.returncode == 0, dump.stderr
        if needle in dump.stdout:
            found.append("pg_dump")
    return found


@pytest.fixture
def cli(
    owner: SimpleNamespace, keyring: Keyring, notify_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str, str]]]:
    master = ",".join(f"{k}:{base64.b64encode(keyring.get(k).key).decode()}" for k in keyring.ids)
    monkeypatch.setenv("DATABASE_URL", notify_url)
    monkeypatch.setenv("TOOLRELAY_OWNER", str(owner.id))
    monkeypatch.setenv("TOOLRELAY_MASTER_KEY", master)
    context.database.cache_clear()
    runner = CliRunner()

    def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
        result = runner.invoke(cli_app, ["webhook", *args], input=stdin)
        return result.exit_code, result.stdout, result.stderr

    yield run
    context.database.cache_clear()


async def test_cli_reads_the_url_from_stdin_seals_it_and_still_delivers_to_it(
    owner: SimpleNamespace,
    receiver: Receiver,
    deliver: Driver,
    notify_url: str,
    cli: Callable[..., tuple[int, str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path, token = slack_path()
    argv = ["add", "--format", "slack", "--events", "pending"]
    code, out, err = cli(*argv, stdin=f"{receiver.base_url}{path}\n")
    assert code == 0, (out, err)
    assert not any(token in arg for arg in argv)  # nothing of it on the command line
    assert token not in out + err
    code, listed, _ = cli("list", "-o", "json")
    [hook] = json.loads(listed)["items"]
    assert hook["url"] == f"{receiver.base_url}/…" and hook["format"] == "slack"
    assert token not in listed + cli("list")[1]
    assert plaintext_holding(notify_url, token) == []

    caplog.set_level(logging.DEBUG)
    inv = owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
    assert await deliver.once() == 1
    [got] = receiver.at(path)  # the full path, unsealed at send
    assert f"invocation {inv}" in json.loads(got.body)["text"]
    assert owner.webhooks.deliveries()[0]["delivered_at"] is not None
    assert token not in cli("deliveries", "-o", "json")[1]
    logged = [str(r.__dict__) for r in caplog.records]
    assert any("webhook_delivery" in line for line in logged)
    assert not any(token in line for line in logged)
    assert plaintext_holding(notify_url, token) == []


def test_cli_refuses_the_url_as_an_argument(
    owner: SimpleNamespace, cli: Callable[..., tuple[int, str, str]]
) -> None:
    path, token = slack_path()
    code, out, err = cli("add", f"https://hooks.slack.com{path}", "--format", "slack")
    assert code == 2 and "stdin" in err and "ps" in err and token not in out + err
    assert owner.webhooks.list() == []  # nothing stored
    bad = cli("add", "--events", "pending", stdin="ftp://x\n")
    assert bad[0] == 1 and "http:// or https://" in bad[2]


async def test_api_never_returns_the_url_and_seals_it(
    owner: SimpleNamespace,
    receiver: Receiver,
    deliver: Driver,
    keyring: Keyring,
    notify_url: str,
) -> None:
    # A standard webhook whose token is in its path and in its query string.
    in_path, in_query = secrets.token_hex(12), secrets.token_hex(12)
    url = f"{receiver.base_url}/in/{in_path}?token={in_query}"
    auth = {"Authorization": f"Bearer {TokenStore(owner.registry.db).create(owner.id)[1]}"}
    app = create_app(ApiSettings(database_url=notify_url, keyring=keyring, run_worker=False))
    with TestClient(app) as client:
        made = client.post("/v1/webhooks", headers=auth,
                           json={"url": url, "events": ["invocation.pending"]})  # fmt: skip
        assert made.status_code == 201, made.text
        hook = made.json()
        receiver.secrets[f"/in/{in_path}"] = hook["secret"]
        shown = [made.text, client.get("/v1/webhooks", headers=auth).text,
                 client.get(f"/v1/webhooks/{hook['id']}", headers=auth).text,
                 client.patch(f"/v1/webhooks/{hook['id']}", headers=auth,
                              json={"enabled": True}).text,
                 client.post(f"/v1/webhooks/{hook['id']}/rotate-secret", headers=auth).text]  # fmt: skip
        receiver.secrets[f"/in/{in_path}"] = json.loads(shown[-1])["secret"]
        for text in shown:
            assert in_path not in text and in_query not in text
        assert hook["url"] == f"{receiver.base_url}/…"
        for token in (in_path, in_query):
            assert plaintext_holding(notify_url, token) == []
        owner.registry.invoke("bot", tool_for(owner, receiver, gated=True), {})
        assert await deliver.once() == 1
        [got] = receiver.at(f"/in/{in_path}")  # verified with the rotated secret
        assert got.json["type"] == "invocation.pending"
        deliveries = client.get("/v1/webhooks/deliveries", headers=auth).text
        assert in_path not in deliveries and in_query not in deliveries


def test_owners_cannot_read_the_sealed_url(
    owner: SimpleNamespace, receiver: Receiver, notify_url: str
) -> None:
    owner.webhooks.add(f"{receiver.base_url}{slack_path()[0]}", ["pending"], "slack")
    claims = json.dumps({"sub": str(owner.id), "role": "authenticated"})
    for column in ("url_ciphertext", "url_wrapped_key", "url_nonce"):
        with psycopg.connect(notify_url) as conn:
            conn.execute("SELECT set_config('role', 'authenticated', true),"
                         " set_config('request.jwt.claims', %s, true)", (claims,))  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT {column} FROM agents.webhook_subscriptions")
    # The shown form only, beside a sealed URL.
    with psycopg.connect(notify_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "UPDATE agents.webhook_subscriptions SET url = 'https://h.example/x/y'"
            " WHERE owner = %s",
            (owner.id,),
        )


async def rewrapped_and_delivered(
    owner: SimpleNamespace, receiver: Receiver, notify_url: str, keyring: Keyring, path: str
) -> None:
    """A key rotation: a new key, `webhook rewrap`, then a deliverer with the new key only
    (the old one removed) still reaches ``path``."""
    new_key = MasterKey(f"notify-{uuid.uuid4().hex[:8]}", os.urandom(32))
    both = Keyring([*(keyring.get(k) for k in keyring.ids), new_key])
    assert rewrap_secrets(owner.registry.db, both) >= 1
    assert rewrap_secrets(owner.registry.db, both) == 0
    owner.registry.invoke("bot", tool_for(owner, receiver, gated=True, key="rot.x"), {})
    pool = open_pool(notify_url, max_size=1)
    await pool.open(wait=True)
    try:
        async with aiohttp.ClientSession(connector=make_connector(LOOPBACK_ONLY)) as session:
            only_new = Deliverer(pool, Keyring([new_key]), LOOPBACK_ONLY, session)
            while await only_new.deliver_once():
                pass
    finally:
        await pool.close()
        # Put every subscription of this module back under the fixture's key.
        rewrap_secrets(
            owner.registry.db, Keyring([new_key, *(keyring.get(k) for k in keyring.ids)])
        )
    assert [r.json["type"] for r in receiver.at(path)] == ["invocation.pending"]


async def test_rewrap_after_a_key_rotation_keeps_the_sealed_url_working(
    owner: SimpleNamespace, receiver: Receiver, keyring: Keyring, notify_url: str
) -> None:
    path, token = slack_path()
    _, secret = owner.webhooks.add(f"{receiver.base_url}{path}", ["pending"], "standard")
    receiver.secrets[path] = secret
    await rewrapped_and_delivered(owner, receiver, notify_url, keyring, path)
    assert plaintext_holding(notify_url, token) == []


async def test_a_url_stored_before_0057_is_delivered_to_then_sealed_by_rewrap(
    owner: SimpleNamespace, receiver: Receiver, keyring: Keyring, notify_url: str
) -> None:
    # A row as migration 0057 found it: the full URL in `url`, nothing sealed of it.
    path, token = slack_path()
    sid, secret = uuid.uuid4(), "whsec_" + base64.b64encode(os.urandom(32)).decode()
    sealed = seal_secret(keyring, sid, owner.id, secret)
    with psycopg.connect(notify_url) as conn:
        conn.execute(
            "INSERT INTO agents.webhook_subscriptions (id, owner, url, format, events,"
            " secret_key_id, secret_wrapped_key, secret_nonce, secret_ciphertext)"
            " VALUES (%s, %s, %s, 'standard', ARRAY['invocation.pending'], %s, %s, %s, %s)",
            (sid, owner.id, f"{receiver.base_url}{path}", sealed["key_id"],
             sealed["wrapped_key"], sealed["nonce"], sealed["ciphertext"]),
        )  # fmt: skip
    receiver.secrets[path] = secret
    [listed] = owner.webhooks.list()  # shown like a sealed one already
    assert listed["url"] == f"{receiver.base_url}/…"
    assert "webhook_subscriptions.url" in plaintext_holding(notify_url, token)
    await rewrapped_and_delivered(owner, receiver, notify_url, keyring, path)
    assert plaintext_holding(notify_url, token) == []


def test_rotate_secret_seals_under_the_key_the_url_is_wrapped_under(
    make_owner: Callable[[], SimpleNamespace], keyring: Keyring, notify_url: str
) -> None:
    owner = make_owner()
    owner.webhooks.add("https://hooks.example.com/in/abc", ["pending"])
    newer = Keyring([*(keyring.get(k) for k in keyring.ids), MasterKey("newer", os.urandom(32))])
    Webhooks(owner.registry.db, owner.id, newer).rotate_secret(owner.webhooks.list()[0]["id"])
    with psycopg.connect(notify_url) as conn:
        row = conn.execute("SELECT secret_key_id FROM agents.webhook_subscriptions"
                           " WHERE owner = %s", (owner.id,)).fetchone()  # fmt: skip
    assert row is not None and row[0] == keyring.newest.id  # not "newer": the URL's key


def test_shown_url_and_scrubbed_errors() -> None:
    shown_url, scrubbed = subscriptions.shown_url, delivering._scrubbed
    assert shown_url("https://hooks.slack.com/services/T/B/x") == "https://hooks.slack.com/…"
    assert shown_url("http://127.0.0.1:8080/a?b=c") == "http://127.0.0.1:8080/…"
    assert shown_url("https://h.example?t=1") == "https://h.example/…"
    assert shown_url("https://H.example:8443") == "https://h.example:8443/"
    assert shown_url(shown_url("https://h.example/x")) == "https://h.example/…"
    url = "https://hooks.slack.com/services/T/B/s3cr3t?k=v"
    error = scrubbed(f"template_error: bad URL {url}; path /services/T/B/s3cr3t", url)
    assert "s3cr3t" not in error and "hooks.slack.com" in error


def test_a_url_refused_as_malformed_is_not_quoted_back() -> None:
    """The URL is read hidden because it may be the credential: the error that refuses a
    malformed one says why without it (it was quoted, path and all)."""
    for bad in ("http://127.0.0.1:99999/hook/T0SECRET-path", "http://[127.0.0.1/T0SECRET-path"):
        with pytest.raises(subscriptions.InvalidArgument) as refused:
            subscriptions.check_url(bad)
        assert "T0SECRET" not in refused.value.message and "not a URL" in refused.value.message
