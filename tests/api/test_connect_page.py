"""Connecting an account through the API and the approvals page (issue 17) against a real
authorization server (oidc-provider from npm), in Chromium: POST /v1/credentials/connect →
the member reviews and continues, signed in → the provider → /v1/oauth/callback stores the
credential; Reconnect on the credentials page keeps the id. And what must store nothing:
the link opened by someone else (phishing a victim into connecting their account into the
attacker's organization), the callback opened in another browser, a replayed callback."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from tests.api.conftest import Client, client, settings
from tests.api.servers import serve_app
from tests.browser import launch
from tests.oidc import Provider, start_provider
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.registry.members import Members
from toolrelay.tokens import TokenStore

ARTIFACTS = Path(__file__).parents[2] / "artifacts"
CLIENT_ID = "toolrelay-connect-web"
CLIENT_SECRET = "connect-web-client-secret-for-the-tests-0123456789"


@pytest.fixture(scope="module")
def served(database_url: str, keyring: Keyring) -> Iterator[tuple[str, Provider]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app_client = {
        "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
        "token_endpoint_auth_method": "client_secret_post",
        "grant_types": ["authorization_code", "refresh_token"],
        "redirect_uris": [f"{base}/v1/oauth/callback"],
    }  # fmt: skip
    with start_provider([app_client], refresh="always", rotate=True) as provider:
        app = create_app(settings(database_url, keyring, oidc=None))
        with serve_app(app, sock) as url:
            yield url, provider


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch("connecting an account on the page")


@pytest.fixture
def tenant(served: tuple[str, Provider], db: Database) -> Iterator[Callable[[], Client]]:
    made: list[Client] = []

    def make() -> Client:
        owner = uuid.uuid4()
        _, token = TokenStore(db).create(owner, name="test")
        made.append(client(served[0], token, owner))
        return made[-1]

    yield make
    for c in made:
        c.http.close()


def start_connect(who: Client, provider: Provider, **extra: Any) -> dict[str, Any]:
    body = {"provider": "oidc", "issuer": provider.issuer, "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET, "name": "idp", "scopes": ["openid offline_access"],
            "allowed_hosts": ["127.0.0.1"]} | extra  # fmt: skip
    answer = who.post("/v1/credentials/connect", json=body)
    assert answer.status_code == 201, answer.text
    made: dict[str, Any] = answer.json()
    return made


def signed_in(browser: Browser, url: str, token: str) -> tuple[BrowserContext, Page]:
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{url}/approvals")
    page.get_by_label("Token", exact=True).fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Waiting for you")).to_be_visible()
    return context, page


def consent(page: Page) -> None:
    login_box = page.locator('input[name="login"]')
    button = page.get_by_role("button", name="Continue", exact=True)
    done = page.get_by_role("heading", name="Connected").or_(page.get_by_role("alert"))
    expect(login_box.or_(button).or_(done)).to_be_visible()
    if login_box.is_visible():
        login_box.fill("ana")
        page.locator('input[name="password"]').fill("any password")
        page.get_by_role("button", name="Sign-in").click()
    expect(button.or_(done)).to_be_visible()
    if button.is_visible():
        button.click()


def hold_callback(context: BrowserContext, provider: Provider) -> list[str]:
    held: list[str] = []

    def hold(route: Route) -> None:
        response = route.fetch(max_redirects=0)
        while response.status in (302, 303):
            target = urljoin(response.url, response.headers["location"])
            if "/v1/oauth/callback" in target:
                held.append(target)
                route.fulfill(status=200, body="held by the test")
                return
            response = context.request.get(target, max_redirects=0)
        route.fulfill(response=response)

    context.route(f"{provider.issuer}/**", hold)
    return held


def test_connect_through_the_api_and_the_page_then_reconnect(
    browser: Browser, served: tuple[str, Provider], tenant: Callable[[], Client], db: Database
) -> None:
    url, provider = served
    admin = tenant()
    started = start_connect(admin, provider)
    assert started["connect_url"] == f"{url}/approvals/connect/{started['id']}"
    context, page = signed_in(browser, url, admin.token)
    page.goto(started["connect_url"])
    expect(page.get_by_role("heading", name="Connect OpenID Connect (discovery)")).to_be_visible()
    expect(page.locator("main")).to_contain_text("openid offline_access")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "connect-review.png"), full_page=True)
    page.get_by_role("button", name="Continue to OpenID Connect (discovery)").click()
    consent(page)
    expect(page.get_by_role("heading", name="Connected")).to_be_visible()
    credential = page.locator("#credential").inner_text()
    page.screenshot(path=str(ARTIFACTS / "connect-done.png"), full_page=True)
    info = admin.get(f"/v1/credentials/{credential}").json()
    assert (info["kind"], info["name"], info["status"], info["reconnect"]) == (
        "oauth", "idp", "active", None)  # fmt: skip
    assert CLIENT_SECRET not in page.content()

    # the provider revokes; the dispatcher would mark it so: Reconnect on the page
    with db.as_dispatcher() as conn:
        conn.execute("UPDATE agents.credentials SET status = 'needs_reauth' WHERE id = %s",
                     (credential,))  # fmt: skip
    assert admin.get(f"/v1/credentials/{credential}").json()["reconnect"] == (
        f"/approvals/credentials#credential-{credential}")  # fmt: skip
    page.goto(f"{url}/approvals/credentials")
    row = page.locator(f'li[data-credential="{credential}"]')
    expect(row).to_have_attribute("data-status", "needs_reauth")
    page.screenshot(path=str(ARTIFACTS / "credentials-reconnect.png"), full_page=True)
    row.get_by_role("button", name="Reconnect").click()
    expect(page.locator("main")).to_contain_text("it keeps its id")
    page.get_by_role("button", name="Continue to OpenID Connect (discovery)").click()
    consent(page)
    expect(page.get_by_role("status")).to_contain_text(f"{credential} (reconnected)")
    reconnected = admin.get(f"/v1/credentials/{credential}").json()
    assert (reconnected["status"], reconnected["reconnect"]) == ("active", None)
    context.close()


def test_a_connect_link_opened_by_someone_else_does_nothing(
    browser: Browser, served: tuple[str, Provider], tenant: Callable[[], Client], db: Database
) -> None:
    """An attacker starts a connect in their organization and sends the link: the victim,
    signed in to their own, gets nothing from it; nobody signed in is asked to sign in."""
    url, provider = served
    attacker, victim = tenant(), tenant()
    started = start_connect(attacker, provider)
    context, page = signed_in(browser, url, victim.token)
    page.goto(started["connect_url"])
    expect(page.get_by_role("alert")).to_contain_text("started by someone else")
    expect(page.get_by_role("button", name="Continue to OpenID Connect (discovery)")).to_have_count(
        0
    )
    context.close()
    anonymous = browser.new_context().new_page()
    anonymous.goto(started["connect_url"])
    expect(anonymous.get_by_role("alert")).to_contain_text("sign in to the approvals page first")
    anonymous.context.close()
    # and a member of the attacker's own team other than the one who started it: the same
    other = Members(db).invite(attacker.owner, "Mo", "admin")[1]
    context, page = signed_in(browser, url, other)
    page.goto(started["connect_url"])
    expect(page.get_by_role("alert")).to_contain_text("started by someone else")
    context.close()
    assert attacker.get("/v1/credentials").json()["items"] == []


def test_the_callback_in_another_browser_or_twice_stores_nothing(
    browser: Browser, served: tuple[str, Provider], tenant: Callable[[], Client]
) -> None:
    url, provider = served
    admin = tenant()
    started = start_connect(admin, provider)
    context, page = signed_in(browser, url, admin.token)
    held = hold_callback(context, provider)
    page.goto(started["connect_url"])
    page.get_by_role("button", name="Continue to OpenID Connect (discovery)").click()
    consent(page)
    expect(page.get_by_text("held by the test")).to_be_visible()
    other = browser.new_context().new_page()
    other.goto(held[0])
    expect(other.get_by_role("alert")).to_contain_text("continued in another browser")
    expect(other.get_by_role("alert")).to_contain_text("nothing was stored")
    other.context.close()
    # the flow is spent: the right browser, too late, is refused as well
    context.unroute(f"{provider.issuer}/**")
    page.goto(held[0])
    expect(page.get_by_role("alert")).to_contain_text("already used")
    assert admin.get("/v1/credentials").json()["items"] == []
    context.close()


def test_only_an_admin_starts_a_connect(
    served: tuple[str, Provider], tenant: Callable[[], Client], db: Database
) -> None:
    url, provider = served
    admin = tenant()
    viewer = client(url, Members(db).invite(admin.owner, "Vic", "viewer")[1], admin.owner)
    refused = viewer.post("/v1/credentials/connect",
                          json={"provider": "oidc", "issuer": provider.issuer, "client_id": "x"})  # fmt: skip
    assert refused.status_code == 403 and "admin" in refused.json()["error"]["message"]
    unknown = admin.post("/v1/credentials/connect", json={"provider": "nope", "client_id": "x"})
    assert unknown.status_code == 422 and "unknown provider 'nope'" in unknown.text
