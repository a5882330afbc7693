"""The approvals page in headless Chromium: sign in, review the masked request, approve,
watch it complete (the in-process worker sends it to a loopback upstream), and the same on a
phone-sized screen. Screenshots go to artifacts/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.api.conftest import Client, agent_client
from tests.browser import CHROMIUM, chromium, launch
from tests.dispatch.upstream import Upstream

ARTIFACTS = Path(__file__).parents[2] / "artifacts"
SECRET = "sk-page-3c1d9e"
COMPLETES_WITHIN = 30_000  # ms: the page refreshes every 4 s, the worker sends at once
pytestmark = pytest.mark.skipif(
    chromium() is None,
    reason=f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium); "
    "the approvals page was NOT tested in a browser",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch("the approvals page")


@pytest.fixture
def owner_with_pending(api: str, make_owner: Any, upstream: Upstream) -> tuple[Client, Client]:
    """An owner whose agent has asked to publish a post (a write that waits for approval)."""
    owner = make_owner()
    cred = owner.post("/v1/credentials", json={"kind": "api_key", "name": "blog",
                                               "secret": SECRET, "allowed_hosts": ["127.0.0.1"]})  # fmt: skip
    assert cred.status_code == 201, cred.text
    tool = owner.put("/v1/tools/blog.publish", json={
        "name": "Publish a blog post", "endpoint_url": f"{upstream.base_url}/posts",
        "http_method": "POST", "egress_class": "write", "auth_method": "api_key",
        "credential_ref": cred.json()["id"], "auth_param_prefix": "Bearer ",
        "schema_input": {"type": "object", "required": ["title"], "properties": {
            "title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
            "draft": {"type": "boolean", "default": False}}},
        "request_template": {"headers": {"X-Blog": "main"},
                             "body": {"post": {"title": "{{input.title}}", "tags": "{{input.tags}}",
                                               "draft": "{{input.draft}}"}}}})  # fmt: skip
    assert tool.status_code == 200, tool.text
    agent = agent_client(api, owner, "writer-bot")
    owner.put("/v1/assignments/writer-bot/blog.publish")
    return owner, agent


def ask(agent: Client, title: str) -> str:
    response = agent.post("/v1/agent/invocations", json={
        "tool": "blog.publish", "input": {"title": title, "tags": ["release", "notes"]}})  # fmt: skip
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def sign_in(page: Page, api: str, token: str) -> None:
    page.goto(f"{api}/approvals")
    expect(page.get_by_role("heading", name="Approvals")).to_be_visible()
    page.get_by_label("Token", exact=True).fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Waiting for you")).to_be_visible()


def test_owner_signs_in_reviews_the_masked_request_and_approves(
    browser: Browser, api: str, owner_with_pending: tuple[Client, Client], upstream: Upstream
) -> None:
    owner, agent = owner_with_pending
    inv = ask(agent, "Toolrelay 0.2 is out")
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    sign_in(page, api, owner.token)

    card = page.locator(f'article[data-invocation="{inv}"]')
    expect(card).to_contain_text("Publish a blog post")
    expect(card).to_contain_text("writer-bot")
    expect(card).to_contain_text(f"POST {upstream.base_url}/posts")
    expect(card).to_contain_text("Authorization: Bearer ••••")
    expect(card).to_contain_text('"title": "Toolrelay 0.2 is out"')
    expect(card).not_to_contain_text('"draft"')  # a schema default is never sent
    expect(card).to_contain_text("X-Blog: main")
    assert SECRET not in page.content()
    cookie = next(c for c in context.cookies() if c["name"] == "toolrelay_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.screenshot(path=str(ARTIFACTS / "approvals.png"), full_page=True)

    card.get_by_role("button", name="Approve and send").click()
    expect(page.get_by_role("status")).to_contain_text("Approved")
    done = page.locator(f'li[data-invocation="{inv}"][data-status="completed"]')
    expect(done).to_be_visible(timeout=COMPLETES_WITHIN)
    expect(page.locator(f'article[data-invocation="{inv}"]')).to_have_count(0)
    page.screenshot(path=str(ARTIFACTS / "approvals-done.png"), full_page=True)
    assert upstream.by_invocation[inv] == 1
    sent = next(s for s in upstream.seen if s.headers.get("X-Toolrelay-Invocation") == inv)
    assert sent.headers["Authorization"] == f"Bearer {SECRET}"
    assert sent.body == {"post": {"title": "Toolrelay 0.2 is out", "tags": ["release", "notes"]}}
    context.close()


def test_on_a_phone_the_list_refreshes_itself_and_reject_takes_a_reason(
    browser: Browser, api: str, owner_with_pending: tuple[Client, Client], upstream: Upstream
) -> None:
    owner, agent = owner_with_pending
    first = ask(agent, "Hello from a phone")
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
        has_touch=True,
    )  # fmt: skip
    page = context.new_page()
    sign_in(page, api, owner.token)
    expect(page.locator(f'article[data-invocation="{first}"]')).to_be_visible()

    second = ask(agent, "Arrives while the page is open")
    arrived = page.locator(f'article[data-invocation="{second}"]')
    expect(arrived).to_be_visible(timeout=15_000)  # no reload: the page fetched it
    expect(page.locator("#count")).to_have_text("2")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways on a phone ({width} px)"
    page.screenshot(path=str(ARTIFACTS / "approvals-phone.png"), full_page=True)

    card = page.locator(f'article[data-invocation="{first}"]')
    card.get_by_text("Reject…").click()
    card.get_by_label("reason for rejecting").fill("Not on a Sunday")
    card.get_by_role("button", name="Reject", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Rejected")
    row = page.locator(f'li[data-invocation="{first}"][data-status="rejected"]')
    expect(row).to_contain_text("Not on a Sunday")
    assert owner.get(f"/v1/invocations/{first}").json()["reject_reason"] == "Not on a Sunday"
    assert upstream.by_invocation[first] == 0
    owner.post(f"/v1/invocations/{second}/reject")  # leave nothing runnable behind
    context.close()


def test_forms_without_the_csrf_token_and_agent_tokens_are_refused(
    browser: Browser, api: str, owner_with_pending: tuple[Client, Client]
) -> None:
    owner, agent = owner_with_pending
    inv = ask(agent, "Forged")
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{api}/approvals")
    page.get_by_label("Token", exact=True).fill(agent.token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("agent token")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "approvals-signin.png"))
    sign_in(page, api, owner.token)
    forged = page.request.post(f"{api}/approvals/{inv}/approve", form={"csrf": "0" * 64})
    assert forged.status == 403
    assert owner.get(f"/v1/invocations/{inv}").json()["status"] == "pending"
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    owner.post(f"/v1/invocations/{inv}/reject")
    context.close()
