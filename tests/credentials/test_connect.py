"""Connecting an account (issue 17) against a real authorization server, oidc-provider from
npm on loopback, its login and consent driven in Chromium: `toolrelay credential connect`
(a process, waiting on its loopback redirect) makes an oauth credential whose tokens a tool
call then sends; the refresh token rotates; a revoked one turns the credential needs_reauth,
`connect --reconnect` brings it back under the same id, and the failed call, retried,
completes. And what must store nothing: a denied consent, a replayed code, a PKCE verifier
that does not match, a provider the egress guard does not let through."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urljoin, urlsplit

import aiohttp
import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from tests.api.servers import LoopThread, threaded_upstream
from tests.browser import launch
from tests.cliproc import WAIT_S, Waiting
from tests.credentials.conftest import _scratch_database
from tests.dispatch.conftest import LOOPBACK_ONLY
from tests.dispatch.upstream import Upstream
from tests.oidc import Provider, start_provider
from tests.registry.helpers import add_tool
from toolrelay.credentials import CredentialStore, Keyring, MasterKey
from toolrelay.credentials import connect as flow
from toolrelay.db import Database
from toolrelay.dispatch.egress import make_connector
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry

CLIENT_ID = "toolrelay-connect"
CLIENT_SECRET = "connect-client-secret-for-the-tests-0123456789abcdef"
CLIENT = {
    "client_id": CLIENT_ID,
    "client_secret": CLIENT_SECRET,
    "application_type": "native",  # loopback redirects on any port (RFC 8252 7.3)
    "token_endpoint_auth_method": "client_secret_post",
    "grant_types": ["authorization_code", "refresh_token"],
    "redirect_uris": ["http://127.0.0.1/callback"],
}
KEY = MasterKey("connect-test", os.urandom(32))
T = TypeVar("T")


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with start_provider([CLIENT], refresh="always", rotate=True) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch("connecting an account")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with threaded_upstream() as server:
        yield server


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """A database of this module's own: the CLI refuses a master key set that lacks a key
    other tests sealed with (keycheck), so it must not share theirs."""
    with _scratch_database() as url:
        yield url


@pytest.fixture(scope="module")
def db(database_url: str) -> Database:
    return Database(database_url)


@pytest.fixture
def env(tmp_path: Path, database_url: str) -> dict[str, str]:
    """The CLI's environment: a tenant of its own, the test's master key, loopback allowed."""
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "TOOLRELAY_HOME": str(tmp_path),
        "TOOLRELAY_OWNER": str(uuid.uuid4()),
        "TOOLRELAY_MASTER_KEY": f"{KEY.id}:{base64.b64encode(KEY.key).decode()}",
        "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1",
    }


def start_connect(env: dict[str, str], *args: str) -> Waiting:
    """`toolrelay credential connect --no-browser ...` running, the client secret on stdin."""
    return Waiting(
        ["credential", "connect", "--no-browser", "--timeout", str(WAIT_S),
         "--client-secret-stdin", *args],
        env, stdin=CLIENT_SECRET + "\n",
    )  # fmt: skip


def oidc_args(provider: Provider, *extra: str) -> list[str]:
    return ["--provider", "oidc", "--issuer", provider.issuer, "--client-id", CLIENT_ID,
            "--scope", "openid offline_access", "--host", "127.0.0.1", *extra]  # fmt: skip


def consent(page: Page, login: str) -> None:
    """oidc-provider's development login and consent (skipped when it remembers both)."""
    login_box = page.locator('input[name="login"]')
    button = page.get_by_role("button", name="Continue")
    expect(login_box.or_(button).or_(page.get_by_text("Done."))).to_be_visible()
    if login_box.is_visible():
        login_box.fill(login)
        page.locator('input[name="password"]').fill("any password")
        page.get_by_role("button", name="Sign-in").click()
    expect(button.or_(page.get_by_text("Done."))).to_be_visible()
    if button.is_visible():
        button.click()


def connected(browser: Browser, env: dict[str, str], login: str, *args: str) -> str:
    """Run `credential connect`, sign in and consent in a browser; the credential id."""
    running = start_connect(env, *args)
    context = browser.new_context()
    page = context.new_page()
    page.goto(running.url())
    consent(page, login)
    expect(page.get_by_text("Done.")).to_be_visible()
    context.close()
    code, out, err = running.finish()
    assert code == 0, err
    assert CLIENT_SECRET not in out + err
    return out.strip()


def introspect(provider: Provider, token: str) -> dict[str, Any]:
    answer = httpx.post(f"{provider.issuer}/token/introspection",
                        data={"token": token, "client_id": CLIENT_ID,
                              "client_secret": CLIENT_SECRET})  # fmt: skip
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def run(coro: Coroutine[Any, Any, T]) -> T:
    """A coroutine on a loop of its own thread (Playwright's sync API holds this one's)."""
    loop = LoopThread()
    try:
        return loop.run(asyncio.wait_for(coro, WAIT_S))
    finally:
        loop.close()


def drain(database_url: str) -> None:
    worker = Worker(database_url, WorkerSettings(concurrency=4, lease_seconds=5.0, drain=True),
                    Keyring([KEY]), LOOPBACK_ONLY)  # fmt: skip
    run(worker.run())


def expire(db: Database, credential_id: uuid.UUID) -> None:
    with db.as_dispatcher() as conn:
        conn.execute("UPDATE agents.credentials SET expires_at = now() - interval '1 minute'"
                     " WHERE id = %s", (credential_id,))  # fmt: skip


def bearer(upstream: Upstream, invocation: uuid.UUID) -> str:
    [sent] = [
        s for s in upstream.seen if s.headers.get("X-Toolrelay-Invocation") == str(invocation)
    ]
    return sent.headers["Authorization"].removeprefix("Bearer ")


def test_connect_refresh_rotation_revocation_and_reconnect(
    browser: Browser,
    provider: Provider,
    env: dict[str, str],
    db: Database,
    database_url: str,
    upstream: Upstream,
) -> None:
    owner = uuid.UUID(env["TOOLRELAY_OWNER"])
    credential = uuid.UUID(connected(browser, env, "ana", *oidc_args(provider, "--name", "idp")))
    store = CredentialStore(db, Keyring([KEY]))
    info = store.get(owner, credential)
    assert (info.kind, info.name, info.status, info.allowed_hosts) == (
        "oauth", "idp", "active", ["127.0.0.1"])  # fmt: skip
    first = store.oauth_client(owner, credential)
    assert first.refresh_token and first.client_secret == CLIENT_SECRET
    assert first.token_url == f"{provider.issuer}/token"
    with db.as_dispatcher() as conn:  # sealed like a pasted one: no token in the clear
        row = conn.execute("SELECT ciphertext FROM agents.credentials WHERE id = %s",
                           (credential,)).fetchone()  # fmt: skip
    assert row is not None and first.access_token is not None
    assert first.access_token.encode() not in bytes(row["ciphertext"])

    registry = Registry(db, owner)
    add_tool(registry, key="idp.me", endpoint_url=f"{upstream.base_url}/me",
             auth_method="oauth", credential_ref=str(credential))  # fmt: skip
    registry.create_agent("bot")
    registry.assign("bot", "idp.me")

    # a call sends the access token the provider issued (and it is live there)
    call = registry.invoke("bot", "idp.me", {"text": "hi"})
    drain(database_url)
    assert registry.get_invocation(call)["status"] == "completed"
    assert bearer(upstream, call) == first.access_token
    assert introspect(provider, first.access_token)["active"] is True

    # expired: the dispatcher refreshes; the refresh token rotates, the old one is dead
    expire(db, credential)
    call = registry.invoke("bot", "idp.me", {"text": "again"})
    drain(database_url)
    assert registry.get_invocation(call)["status"] == "completed"
    second = store.oauth_client(owner, credential)
    assert bearer(upstream, call) == second.access_token != first.access_token
    assert second.refresh_token not in (None, first.refresh_token)
    assert introspect(provider, str(first.refresh_token))["active"] is False

    # revoked at the provider: the next refresh fails, the credential needs a person
    revoked = httpx.post(f"{provider.issuer}/token/revocation",
                         data={"token": second.refresh_token, "client_id": CLIENT_ID,
                               "client_secret": CLIENT_SECRET})  # fmt: skip
    assert revoked.status_code == 200
    expire(db, credential)
    failed = registry.invoke("bot", "idp.me", {"text": "after revocation"})
    drain(database_url)
    assert registry.get_invocation(failed)["status"] == "failed"
    assert store.get(owner, credential).status == "needs_reauth"

    # reconnect: same id (tools keep their credential_ref), the app taken from the old one
    # (no --provider or --issuer: the connect recorded them)
    again = connected(browser, env, "ana", "--reconnect", str(credential))
    assert uuid.UUID(again) == credential
    assert store.get(owner, credential).status == "active"
    retried = registry.retry(failed)
    drain(database_url)
    assert registry.get_invocation(retried)["status"] == "completed"
    third = store.oauth_client(owner, credential)
    assert bearer(upstream, retried) == third.access_token
    assert third.access_token not in (first.access_token, second.access_token)


def test_a_denied_consent_stores_nothing(
    browser: Browser, provider: Provider, env: dict[str, str], db: Database
) -> None:
    running = start_connect(env, *oidc_args(provider))
    page = browser.new_context().new_page()
    page.goto(running.url())
    page.get_by_role("link", name="Cancel").click()
    expect(page.get_by_text("Refused by the provider.")).to_be_visible()
    code, out, err = running.finish()
    assert code == 1 and "access_denied" in err and "nothing was stored" in err
    assert out == ""
    assert CredentialStore(db).list(uuid.UUID(env["TOOLRELAY_OWNER"])) == []


def test_a_provider_the_egress_guard_refuses_is_never_asked(
    provider: Provider, env: dict[str, str], db: Database
) -> None:
    """The issuer is an owner's input: its discovery goes through the egress guard like a tool
    call (here loopback, not allowed), before anything is shown or stored."""
    env = {**env, "TOOLRELAY_EGRESS_ALLOW": ""}
    running = start_connect(env, *oidc_args(provider))
    code, _, err = running.finish()
    assert code == 1 and "egress" in err.lower(), err
    assert not running.shown
    assert CredentialStore(db).list(uuid.UUID(env["TOOLRELAY_OWNER"])) == []


def held_code(browser: Browser, provider: Provider, started: flow.Started) -> str:
    """Sign in for ``started`` and keep the code the provider sends back (the browser never
    reaches the redirect URI)."""
    context: BrowserContext = browser.new_context()
    held: list[str] = []

    def hold(route: Route) -> None:
        response = route.fetch(max_redirects=0)
        while response.status in (302, 303):
            target = urljoin(response.url, response.headers["location"])
            if target.startswith(started.redirect_uri):
                held.append(target)
                route.fulfill(status=200, body="held")
                return
            response = context.request.get(target, max_redirects=0)
        route.fulfill(response=response)

    context.route(f"{provider.issuer}/**", hold)
    page = context.new_page()
    page.goto(started.url)
    consent(page, "ana")
    expect(page.get_by_text("held")).to_be_visible()
    context.close()
    query = parse_qs(urlsplit(held[0]).query)
    assert query["state"] == [started.state]
    return query["code"][0]


def test_a_code_is_exchanged_once_and_only_with_its_verifier(
    browser: Browser, provider: Provider
) -> None:
    connection = flow.Connection(flow.preset("oidc"), CLIENT_ID, CLIENT_SECRET,
                                 ("openid", "offline_access"), provider.issuer)  # fmt: skip
    redirect = "http://127.0.0.1:9/callback"

    async def started() -> flow.Started:
        async with aiohttp.ClientSession(connector=make_connector(LOOPBACK_ONLY)) as http:
            return await flow.start(http, connection, redirect)

    async def exchange(s: flow.Started, code: str) -> str:
        async with aiohttp.ClientSession(connector=make_connector(LOOPBACK_ONLY)) as http:
            return await flow.exchange(http, connection, s, code)

    first = run(started())
    code = held_code(browser, provider, first)
    secret = json.loads(run(exchange(first, code)))
    assert secret["access_token"] and secret["refresh_token"]
    with pytest.raises(flow.ConnectError, match="invalid_grant"):
        run(exchange(first, code))  # the same code again

    second = run(started())
    code = held_code(browser, provider, second)
    wrong = flow.Started(second.url, second.state, second.nonce, "x" * 64, second.redirect_uri,
                         second.endpoints)  # fmt: skip
    with pytest.raises(flow.ConnectError, match="invalid_grant"):
        run(exchange(wrong, code))  # a verifier that is not this flow's

    third = run(started())
    code = held_code(browser, provider, third)
    other = flow.Started(third.url, third.state, "another-nonce", third.code_verifier,
                         third.redirect_uri, third.endpoints)  # fmt: skip
    with pytest.raises(flow.ConnectError, match="nonce"):
        run(exchange(other, code))  # an ID token minted for another request
