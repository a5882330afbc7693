"""The approvals page grows up (issue 16, item 6): Recent no longer vanishes behind 16 pending
calls, a queue over 100 says so, a call whose tool changed cannot be approved and says why,
a history with filters and pages, and one call's detail (input, request, attempts, who
decided and why) — over HTTP, and in Chromium at desktop and phone widths."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser

from tests.api.conftest import Client
from tests.browser import launch
from tests.registry.helpers import agent_with_tool
from tests.security.test_approvals_spoofing import signed_in
from toolrelay.db import Database
from toolrelay.registry import Registry
from toolrelay.registry.members import Members
from toolrelay.registry.policies import Policies

GATED = {"egress_class": "write", "requires_approval": True, "http_method": "POST",
         "endpoint_url": "http://127.0.0.1:9/notes"}  # fmt: skip
ARTIFACTS = Path(__file__).parents[2] / "artifacts"


@pytest.fixture
def tenant(make_owner: Callable[[], Client], db: Database) -> tuple[Client, Registry]:
    owner = make_owner()
    registry = Registry(db, owner.owner)
    agent_with_tool(registry, key="notes.create", **GATED)
    return owner, registry


def calls(registry: Registry, n: int, text: str = "x") -> list[uuid.UUID]:
    return [registry.invoke("bot", "notes.create", {"text": f"{text}{i}"}) for i in range(n)]


def test_recent_shows_settled_calls_however_many_wait(
    api: str, tenant: tuple[Client, Registry]
) -> None:
    owner, registry = tenant
    [done] = calls(registry, 1, "done")
    registry.reject(done, "no")
    calls(registry, 17)  # before: Recent read the 16 newest and kept the settled ones: none
    with signed_in(api, owner.token) as http:
        html = http.get("/approvals").text
    recent = html.split('id="recent-title"', 1)[1]
    assert f'data-invocation="{done}"' in recent and 'data-status="rejected"' in recent


def test_a_queue_over_a_hundred_says_how_many_wait(
    api: str, tenant: tuple[Client, Registry]
) -> None:
    owner, registry = tenant
    calls(registry, 101)
    with signed_in(api, owner.token) as http:
        html = http.get("/approvals/queue").text
    assert html.count('class="card"') == 100
    assert "Showing the 100 oldest of 101 waiting calls" in html
    assert 'data-pending="101"' in html


def test_a_call_whose_tool_changed_cannot_be_approved(
    api: str, tenant: tuple[Client, Registry]
) -> None:
    owner, registry = tenant
    [call] = calls(registry, 1)
    registry.update_tool("notes.create", {"endpoint_url": "http://127.0.0.1:9/elsewhere"})
    with signed_in(api, owner.token) as http:
        html = http.get("/approvals/queue").text
    card = html.split(f'data-invocation="{call}"', 1)[1].split("</article>", 1)[0]
    assert f'/approvals/{call}/approve"' not in card
    assert "can no longer be approved: its tool changed" in card
    assert f'/approvals/{call}/reject"' in card  # rejecting it stays possible


def test_history_filters_and_pages(api: str, tenant: tuple[Client, Registry], db: Database) -> None:
    owner, registry = tenant
    ann = Members(db).add(owner.owner, "Ann", "approver")
    as_ann = Registry(db, owner.owner, member_id=ann.id)
    made = calls(registry, 30)
    for call in made[:27]:
        registry.reject(call, "bulk")
    for call in made[27:]:
        as_ann.reject(call, "by Ann")
    with signed_in(api, owner.token) as http:
        first = http.get("/approvals/history").text
        assert first.count("<li data-invocation=") == 25
        older = re.search(r'href="/approvals/history(\?[^"]+)" rel="next"', first)
        assert older is not None
        second = http.get("/approvals/history" + older.group(1).replace("&amp;", "&")).text
        assert second.count("<li data-invocation=") == 5
        shown = set(re.findall(r'<li data-invocation="([^"]+)"', first + second))
        assert shown == {str(c) for c in made}  # every call once, across the pages
        by_ann = http.get(f"/approvals/history?decided_by={ann.id}").text
        assert set(re.findall(r'<li data-invocation="([^"]+)"', by_ann)) == {
            str(c) for c in made[27:]
        }
        assert "rejected by Ann" in by_ann
        assert http.get("/approvals/history?status=completed").text.count("<li data-") == 0
        assert http.get("/approvals/history?tool=other").text.count("<li data-") == 0
        bad = http.get("/approvals/history?status=bogus")
        assert bad.status_code == 400 and "status must be one of" in bad.text
        assert "pending" not in re.findall(r'<option value="(\w+)"', first)  # settled only


def test_detail_shows_the_request_the_attempts_and_who_decided(
    api: str, tenant: tuple[Client, Registry], db: Database
) -> None:
    owner, registry = tenant
    bot = Registry(db, owner.owner, agent_id=registry.get_agent("bot")["id"])
    pending = bot.invoke("bot", "notes.create", {"text": "<b>hi</b>"}, reason="the report")
    rejected = bot.invoke("bot", "notes.create", {"text": "no"})
    registry.reject(rejected, "not <today>")
    rule = Policies(db).add(owner.owner, "notes.create", "tiny notes", "approve",
                            {"properties": {"text": {"maxLength": 3}}})  # fmt: skip
    by_rule = bot.invoke("bot", "notes.create", {"text": "ok"})
    with signed_in(api, owner.token) as http:
        page = http.get(f"/approvals/calls/{pending}").text
        assert "The request approval sends" in page and 'data-part="url"' in page
        assert "the report" in page and "\\u003cb\\u003ehi" in page  # the input, escaped JSON
        assert "None: nothing was sent." in page
        gone = http.get(f"/approvals/calls/{rejected}").text
        assert '<dd data-part="decision">rejected by owner, ' in gone  # who, not the error text
        assert "not &lt;today&gt;" in gone
        assert "The request approval sends" not in gone
        ruled = http.get(f"/approvals/calls/{by_rule}").text
        assert f'<dd data-part="decision">approved by policy {rule.name}, ' in ruled
        missing = http.get(f"/approvals/calls/{uuid.uuid4()}")
        assert missing.status_code == 404 and "No such call." in missing.text
    signed_out = httpx.get(f"{api}/approvals/calls/{pending}", follow_redirects=False)
    assert (signed_out.status_code, signed_out.headers["location"]) == (303, "/approvals")


# --- in Chromium ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch("the history pages")


@pytest.mark.parametrize(("width", "height", "name"), [(1280, 900, "desktop"), (390, 844, "phone")])
def test_history_and_detail_in_chromium(
    browser: Browser, api: str, tenant: tuple[Client, Registry],
    width: int, height: int, name: str,
) -> None:  # fmt: skip
    owner, registry = tenant
    made = calls(registry, 3, "a long note that wraps on a phone screen ")
    registry.reject(made[0], "too long a reason to fit on one line of a phone, surely")
    page = browser.new_page(viewport={"width": width, "height": height})
    try:
        page.goto(f"{api}/approvals")
        page.get_by_label("Token", exact=True).fill(owner.token)
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("link", name="History", exact=True).click()
        page.get_by_role("link", name="notes.create").first.click()
        page.locator("[data-part=decision]", has_text="rejected by owner").wait_for()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"approvals-detail-{name}.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        page.goto(f"{api}/approvals/history")
        page.screenshot(path=str(ARTIFACTS / f"approvals-history-{name}.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        assert page.locator("li[data-invocation]").count() == 1  # the settled one only
    finally:
        page.close()


def test_bulk_approve_approves_each_selected_request_as_its_card_showed_it(
    api: str, tenant: tuple[Client, Registry]
) -> None:
    owner, registry = tenant
    first, second, third = calls(registry, 3)
    with signed_in(api, owner.token) as http:
        html = http.get("/approvals").text
        picks = dict(re.findall(r'name="pick" form="bulk" value="([^":]+):([0-9a-f]*)"', html))
        assert set(picks) == {str(first), str(second), str(third)}
        csrf = re.search(r'id="bulk".*?name="csrf" value="([^"]+)"', html, re.S)
        assert csrf is not None
        answer = http.post("/approvals/bulk-approve", data={"csrf": csrf.group(1), "pick": [
            f"{first}:{picks[str(first)]}", f"{second}:{'0' * 64}",  # a request not shown
        ]})  # fmt: skip
        assert answer.status_code == 409
        assert (
            "Approved 1 of 2." in answer.text and "no longer the one you were shown" in answer.text
        )
        forged = http.post("/approvals/bulk-approve", data={"csrf": "nope", "pick": [
            f"{third}:{picks[str(third)]}"]})  # fmt: skip
        assert forged.status_code == 403
    statuses = [registry.get_invocation(c)["status"] for c in (first, second, third)]
    assert statuses == ["running", "pending", "pending"]


def test_bulk_approve_in_chromium_on_a_phone(
    browser: Browser, api: str, tenant: tuple[Client, Registry]
) -> None:
    owner, registry = tenant
    made = calls(registry, 3)
    page = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        page.goto(f"{api}/approvals")
        page.get_by_label("Token", exact=True).fill(owner.token)
        page.get_by_role("button", name="Sign in").click()
        boxes = page.get_by_label('select this request for "Approve selected"')
        boxes.nth(0).check()
        boxes.nth(2).check()
        page.get_by_role("button", name="Approve selected").click()
        page.locator("[data-part=bulk]", has_text="Approved 2 of 2.").wait_for()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "approvals-bulk-phone.png"), full_page=True)
    finally:
        page.close()
    statuses = sorted(registry.get_invocation(c)["status"] for c in made)
    assert statuses == ["pending", "running", "running"]


def test_a_quorum_in_progress_shows_on_the_card(
    api: str, make_owner: Callable[[], Client], db: Database
) -> None:
    owner = make_owner()
    registry = Registry(db, owner.owner)
    agent_with_tool(registry, key="bank.pay", is_dangerous=True, **GATED)
    ann, bob = (Members(db).invite(owner.owner, name, "approver")[1] for name in ("Ann", "Bob"))
    [call] = [registry.invoke("bot", "bank.pay", {"text": "100"})]
    with signed_in(api, ann) as http:
        card = http.get("/approvals").text.split(f'data-invocation="{call}"', 1)[1]
        assert "0 of 2 approvals" in card.split("</article>", 1)[0]
        Registry(db, owner.owner, member_id=_member(db, owner.owner, "Ann")).approve(call)
        card = http.get("/approvals").text.split(f'data-invocation="{call}"', 1)[1]
        card = card.split("</article>", 1)[0]
        assert "1 of 2 approvals" in card and "You approved this" in card
        assert f'/approvals/{call}/approve"' not in card  # not twice
    with signed_in(api, bob) as http:
        card = http.get("/approvals").text.split(f'data-invocation="{call}"', 1)[1]
        card = card.split("</article>", 1)[0]
        assert "1 of 2 approvals" in card and f'/approvals/{call}/approve"' in card


def test_the_tenant_token_is_told_to_approve_as_a_member_in_a_team(
    api: str, make_owner: Callable[[], Client], db: Database
) -> None:
    """In a team the tenant's own token approves nothing (migration 0040): its card says
    why and offers no Approve button (it may still reject); a member's card has one."""
    owner = make_owner()
    registry = Registry(db, owner.owner)
    agent_with_tool(registry, key="notes.create", **GATED)
    ann, _bob = (Members(db).invite(owner.owner, name, "approver")[1] for name in ("Ann", "Bob"))
    [call] = [registry.invoke("bot", "notes.create", {"text": "hi"})]
    with signed_in(api, owner.token) as http:
        card = http.get("/approvals").text.split(f'data-invocation="{call}"', 1)[1]
        card = card.split("</article>", 1)[0]
        assert f'/approvals/{call}/approve"' not in card and 'name="pick"' not in card
        assert 'data-part="approve-as-member"' in card and "toolrelay login" in card
        assert f'/approvals/{call}/reject"' in card
    with signed_in(api, ann) as http:
        card = http.get("/approvals").text.split(f'data-invocation="{call}"', 1)[1]
        assert f'/approvals/{call}/approve"' in card.split("</article>", 1)[0]


def _member(db: Database, owner: uuid.UUID, name: str) -> uuid.UUID:
    return next(m.id for m in Members(db).list(owner) if m.name == name)
