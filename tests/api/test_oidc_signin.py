"""Members sign in to the approvals page through a real OpenID Connect provider
(oidc-provider from npm, on loopback), driven in Chromium: the member found by the verified
email and bound by subject, decisions named after them, sign-out revoking the session; and
what an attacker or a confused person tries: a callback with a forged or reused state, a
callback opened in another browser (login CSRF), an unverified or unknown email, a denied
consent, a removed member's session, a person in two organizations."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from tests.api.conftest import Client, agent_client, client, settings
from tests.api.servers import serve_app
from tests.browser import launch
from tests.dispatch.upstream import Upstream
from tests.oidc import Provider, start_provider
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.signin import OidcSettings
from toolrelay.tokens import TokenStore

ARTIFACTS = Path(__file__).parents[2] / "artifacts"
CLIENT_SECRET = "web-client-secret-for-the-oidc-tests-0123456789"


def person(name: str) -> str:
    """A login of its own at the provider (LOGIN@example.test, verified; tests/oidc)."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def email(login: str) -> str:
    return f"{login}@example.test"


@pytest.fixture(scope="module")
def oidc_app(database_url: str, keyring: Keyring) -> Iterator[tuple[str, Provider]]:
    """The API (its address bound first, so the provider can register its callback) signing
    people in through oidc-provider."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    web = {
        "client_id": "toolrelay-web",
        "client_secret": CLIENT_SECRET,
        "redirect_uris": [f"{base}/approvals/oidc/callback"],
    }
    with start_provider([web]) as provider:
        oidc = OidcSettings(
            issuer=provider.issuer,
            client_id="toolrelay-web",
            client_secret=CLIENT_SECRET,
            cli_client_id="toolrelay-web",
            name="Test IdP",
        )
        app = create_app(settings(database_url, keyring, oidc=oidc))
        with serve_app(app, sock) as url:
            assert url == base
            yield url, provider


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch("sign-in through OpenID Connect")


@pytest.fixture
def team(
    oidc_app: tuple[str, Provider], db: Database, upstream: Upstream
) -> Iterator[Callable[..., Any]]:
    """A tenant with members (name → role, email) and an agent waiting on a write."""
    url, _ = oidc_app
    made: list[Client] = []

    def make(members: dict[str, tuple[str, str]]) -> tuple[Client, dict[str, str], str]:
        """``members``: name → (role, email)."""
        owner_id = uuid.uuid4()
        _, token = TokenStore(db).create(owner_id, name="test")
        owner = client(url, token, owner_id)
        made.append(owner)
        ids = {}
        for name, (role, email) in members.items():
            added = owner.post("/v1/members", json={"name": name, "role": role, "email": email})
            assert added.status_code == 201, added.text
            ids[name] = added.json()["id"]
        tool = owner.put("/v1/tools/blog.publish", json={
            "name": "Publish a post", "endpoint_url": f"{upstream.base_url}/posts",
            "http_method": "POST", "egress_class": "write", "auth_method": "none",
            "schema_input": {"type": "object", "properties": {"title": {"type": "string"}}},
            "request_template": {"body": {"title": "{{input.title}}"}}})  # fmt: skip
        assert tool.status_code == 200, tool.text
        agent = agent_client(url, owner, "writer")
        owner.put("/v1/assignments/writer/blog.publish")
        made.append(agent)
        call = agent.post("/v1/agent/invocations",
                          json={"tool": "blog.publish", "input": {"title": "hello"}})  # fmt: skip
        assert call.status_code == 202, call.text
        return owner, ids, str(call.json()["id"])

    yield make
    for c in made:
        c.http.close()


def at_provider(page: Page, login: str) -> None:
    """Sign in and consent on oidc-provider's development pages."""
    page.locator('input[name="login"]').fill(login)
    page.locator('input[name="password"]').fill("any password")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()


def start(page: Page, url: str) -> None:
    page.goto(f"{url}/approvals")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.locator('input[name="login"]')).to_be_visible()


def hold_callback(context: BrowserContext, provider: Provider) -> list[str]:
    """Stop the provider's redirect back to us in ``context``, keeping its URL. (A route
    does not see the target of a redirect, so the provider's own answers are fetched here
    and the one that would send the browser to our callback is held.)"""
    held: list[str] = []

    def hold(route: Route) -> None:
        response = route.fetch(max_redirects=0)
        while response.status in (301, 302, 303, 307, 308):
            target = urljoin(response.url, response.headers["location"])
            if "/approvals/oidc/callback" in target:
                held.append(target)
                route.fulfill(status=200, body="held by the test")
                return
            if not target.startswith(provider.issuer):
                break
            response = context.request.get(target, max_redirects=0)  # the context's cookies
        route.fulfill(response=response)

    context.route(f"{provider.issuer}/**", hold)
    return held


def test_a_member_signs_in_at_the_provider_and_decides_in_their_own_name(
    browser: Browser, oidc_app: tuple[str, Provider], team: Callable[..., Any], db: Database
) -> None:
    url, _ = oidc_app
    ana = person("ana")
    owner, ids, call = team({"Ana": ("approver", email(ana).upper())})
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    start(page, url)
    at_provider(page, ana)
    expect(page.get_by_role("heading", name="Waiting for you")).to_be_visible()
    expect(page.locator("#who")).to_have_text("Ana (approver)")
    session = next(c for c in context.cookies() if c["name"] == "toolrelay_session")
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    assert not [c for c in context.cookies() if c["name"] == "toolrelay_oidc_state"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "approvals-oidc-signed-in.png"), full_page=True)

    page.locator(f'article[data-invocation="{call}"]').get_by_role(
        "button", name="Approve and send"
    ).click()
    expect(page.get_by_role("status")).to_contain_text("Approved")
    decided = owner.get(f"/v1/invocations/{call}").json()
    assert decided["decided_by"] == ids["Ana"]

    with db.as_dispatcher() as conn:
        member = conn.execute(
            "SELECT oidc_subject, oidc_issuer FROM agents.members WHERE id = %s", (ids["Ana"],)
        ).fetchone()
        tokens = conn.execute(
            "SELECT session, revoked_at FROM agents.api_tokens"
            " WHERE member_id = %s AND session IS NOT NULL",
            (ids["Ana"],),
        ).fetchall()
    assert member == {"oidc_subject": ana, "oidc_issuer": oidc_app[1].issuer}
    assert [(t["session"], t["revoked_at"]) for t in tokens] == [("page", None)]

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible()
    with db.as_dispatcher() as conn:
        revoked = conn.execute(
            "SELECT session, revoked_at IS NOT NULL AS revoked FROM agents.api_tokens"
            " WHERE member_id = %s ORDER BY created_at",
            (ids["Ana"],),
        ).fetchall()
    # the session's token is revoked; the token made with the member (a script's) is not
    assert [(r["session"], r["revoked"]) for r in revoked] == [(None, False), ("page", True)]
    # the cookie's token no longer opens anything, wherever it is presented
    reuse = httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {session['value']}"})
    assert reuse.status_code == 401
    context.close()


def test_a_callback_opened_in_another_browser_signs_nobody_in(
    browser: Browser, oidc_app: tuple[str, Provider], team: Callable[..., Any]
) -> None:
    """Login CSRF: someone finishes a sign-in at the provider and sends its callback link to
    another person; the link must not sign that person in as anyone."""
    url, provider = oidc_app
    ana = person("ana")
    team({"Ana": ("approver", email(ana))})
    attacker = browser.new_context()
    held = hold_callback(attacker, provider)
    page = attacker.new_page()
    start(page, url)
    at_provider(page, ana)
    expect(page.get_by_text("held by the test")).to_be_visible()
    assert len(held) == 1 and "code=" in held[0]
    attacker.close()

    victim = browser.new_context()
    page = victim.new_page()
    page.goto(held[0])
    expect(page.get_by_role("alert")).to_contain_text("started in another browser")
    assert not [c for c in victim.cookies() if c["name"] == "toolrelay_session"]
    victim.close()


def test_a_callback_is_used_once_and_a_forged_state_is_refused(
    browser: Browser, oidc_app: tuple[str, Provider], team: Callable[..., Any]
) -> None:
    url, provider = oidc_app
    ana = person("ana")
    team({"Ana": ("approver", email(ana))})
    context = browser.new_context()
    held = hold_callback(context, provider)
    page = context.new_page()
    start(page, url)
    at_provider(page, ana)
    expect(page.get_by_text("held by the test")).to_be_visible()
    context.unroute(f"{provider.issuer}/**")
    page.goto(held[0])
    expect(page.get_by_role("heading", name="Waiting for you")).to_be_visible()
    # the same answer again, in the same browser: its state is spent
    page.goto(held[0])
    expect(page.get_by_role("alert")).to_contain_text("this sign-in was")
    forged = held[0].replace("state=", "state=x")
    page.goto(forged)
    expect(page.get_by_role("alert")).to_contain_text("not started here")
    context.close()


@pytest.mark.parametrize(
    ("who", "says"),
    [("unverified-eve", "has not verified"), ("stranger", "no member here signs in as")],
)
def test_who_is_not_a_verified_member_is_told_why(
    browser: Browser,
    oidc_app: tuple[str, Provider],
    team: Callable[..., Any],
    who: str,
    says: str,
) -> None:
    url, _ = oidc_app
    login = person(who)
    if who.startswith("unverified"):  # a member's address, but the IdP did not verify it
        team({"Eve": ("approver", email(login))})
    context = browser.new_context()
    page = context.new_page()
    start(page, url)
    at_provider(page, login)
    says = f"{says} {email(login)}"
    expect(page.get_by_role("alert")).to_contain_text(says)
    assert not [c for c in context.cookies() if c["name"] == "toolrelay_session"]
    context.close()


def test_a_denied_consent_says_so(
    browser: Browser, oidc_app: tuple[str, Provider], team: Callable[..., Any]
) -> None:
    url, _ = oidc_app
    team({"Ana": ("approver", email(person("ana")))})
    context = browser.new_context()
    page = context.new_page()
    start(page, url)
    page.get_by_role("link", name="Cancel").click()
    expect(page.get_by_role("alert")).to_contain_text("access_denied")
    context.close()


def test_a_removed_member_is_signed_out_at_once(
    browser: Browser, oidc_app: tuple[str, Provider], team: Callable[..., Any]
) -> None:
    url, _ = oidc_app
    ana = person("ana")
    owner, ids, _ = team({"Ana": ("approver", email(ana))})
    context = browser.new_context()
    page = context.new_page()
    start(page, url)
    at_provider(page, ana)
    expect(page.get_by_role("heading", name="Waiting for you")).to_be_visible()
    assert owner.delete(f"/v1/members/{ids['Ana']}").status_code == 200
    page.goto(f"{url}/approvals")
    expect(page.get_by_role("alert")).to_contain_text("Your session ended")
    # and signing in again (the provider remembers her: no login page) finds no member
    page.get_by_role("link", name="Sign in with Test IdP").click()
    expect(page.get_by_role("alert")).to_contain_text(f"no member here signs in as {email(ana)}")
    context.close()


def test_a_viewer_signs_in_as_a_viewer_and_cannot_approve(
    browser: Browser, oidc_app: tuple[str, Provider], team: Callable[..., Any]
) -> None:
    url, _ = oidc_app
    vic = person("vic")
    owner, _, call = team({"Vic": ("viewer", email(vic))})
    context = browser.new_context()
    page = context.new_page()
    start(page, url)
    at_provider(page, vic)
    expect(page.locator("#who")).to_have_text("Vic (viewer)")
    page.locator(f'article[data-invocation="{call}"]').get_by_role(
        "button", name="Approve and send"
    ).click()
    expect(page.get_by_role("alert")).to_contain_text("approver")
    assert owner.get(f"/v1/invocations/{call}").json()["status"] == "pending"
    context.close()


def test_a_person_in_two_organizations_chooses_one(
    browser: Browser, oidc_app: tuple[str, Provider], team: Callable[..., Any]
) -> None:
    url, _ = oidc_app
    mo = person("mo")
    first, first_ids, _ = team({"Mo": ("approver", email(mo))})
    _, second_ids, _ = team({"Mo": ("viewer", email(mo))})
    context = browser.new_context()
    page = context.new_page()
    start(page, url)
    at_provider(page, mo)
    expect(page.get_by_role("alert")).to_contain_text("member of 2 organizations")
    page.get_by_role("link", name=f"in organization {first.owner}").click()
    # already signed in at the provider: it may answer at once or ask to consent again
    continue_button = page.get_by_role("button", name="Continue")
    waiting = page.get_by_role("heading", name="Waiting for you")
    expect(continue_button.or_(waiting)).to_be_visible()
    if continue_button.is_visible():
        continue_button.click()
    expect(page.locator("#who")).to_have_text("Mo (approver)")
    assert first_ids["Mo"] != second_ids["Mo"]
    context.close()


def test_starting_sign_ins_is_rate_limited(
    oidc_app: tuple[str, Provider], database_url: str, keyring: Keyring
) -> None:
    """Each start writes a flow row before anyone is known: one address cannot write them
    without bound."""
    _, provider = oidc_app
    oidc = OidcSettings(issuer=provider.issuer, client_id="toolrelay-web",
                        client_secret=CLIENT_SECRET, cli_client_id="toolrelay-web")  # fmt: skip
    app = create_app(settings(database_url, keyring, oidc=oidc, rate_burst=3,
                              rate_per_second=0.001))  # fmt: skip
    with serve_app(app) as url:
        answers = [
            httpx.get(f"{url}/approvals/signin/oidc", follow_redirects=False).status_code
            for _ in range(5)
        ]
    assert answers == [303, 303, 303, 429, 429]
