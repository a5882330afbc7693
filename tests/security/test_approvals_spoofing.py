"""Issue 12, finding 9: the approvals page cannot be spoofed by what an agent sends.

An agent's input carries a right-to-left override, an isolate, C1 and DEL controls, a
zero-width joiner and a fake mask (``••••``). On the page every one of those characters is a
marked escape (``\\u202e``), none is in the served HTML raw, and only the real credential
has the "credential hidden" badge: the page draws it from the preview's structured flag, so
input text cannot produce it. Checked in the served HTML (no browser) and in Chromium.
"""

from __future__ import annotations

import re
import secrets
import unicodedata
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.api.conftest import Client, agent_client, client, settings
from tests.api.servers import serve_app
from tests.browser import launch
from toolrelay.api import create_app
from toolrelay.api.approvals import shown
from toolrelay.credentials import Keyring, MasterKey
from toolrelay.db import Database
from toolrelay.registry.preview import MASK, Part, preview_request
from toolrelay.tokens import TokenStore

SECRET = "sk-spoof-7f3a91"
TOOL = "notes.post"

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE
LRI = "\u2066"  # LEFT-TO-RIGHT ISOLATE
ZWJ = "\u200d"  # ZERO WIDTH JOINER
CSI = "\x9b"  # C1 CONTROL SEQUENCE INTRODUCER (C0 controls are refused in headers)
DEL = "\x7f"
ESC = "\x1b"  # in a JSON body the renderer writes it as \u001b itself
INJECTED = (RLO, LRI, ZWJ, CSI, DEL)
# What the agent sends: a header value that reads "Bearer ••••" once reordered, and a body
# title whose extension is disguised by an override.
NOTE = f"Bearer {MASK}{RLO}{LRI}{CSI}"
TITLE = f"invoice{ZWJ}{DEL}{ESC} {RLO}fdp.exe"
TOOL_NAME = f"Post a note{LRI}"


def escape_of(char: str) -> str:
    return f"\\u{ord(char):04x}"


def raw_hidden(text: str) -> list[str]:
    """Control and format characters in ``text`` (HTML keeps its own tabs and newlines)."""
    return sorted({f"U+{ord(c):04X}" for c in text if c not in "\t\n\r"
                   and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")})  # fmt: skip


# --- the server and the pending invocation ------------------------------------------------


@pytest.fixture(scope="module")
def api(database_url: str) -> Iterator[str]:
    keyring = Keyring([MasterKey("spoof-test", secrets.token_bytes(32))])
    with serve_app(create_app(settings(database_url, keyring, run_worker=False))) as url:
        yield url


@pytest.fixture
def pending(api: str, db: Database) -> Iterator[tuple[Client, str]]:
    """An owner, and an invocation its agent made with hostile input, waiting for approval."""
    owner_id = uuid.uuid4()
    _, token = TokenStore(db).create(owner_id, name="test")
    owner = client(api, token, owner_id)
    cred = owner.post("/v1/credentials", json={"kind": "api_key", "name": "notes",
                                               "secret": SECRET, "allowed_hosts": ["127.0.0.1"]})  # fmt: skip
    assert cred.status_code == 201, cred.text
    tool = owner.put(f"/v1/tools/{TOOL}", json={
        "name": TOOL_NAME, "endpoint_url": "http://127.0.0.1:9/notes", "http_method": "POST",
        "egress_class": "write", "auth_method": "api_key", "credential_ref": cred.json()["id"],
        "auth_param_prefix": "Bearer ",
        "schema_input": {"type": "object", "properties": {
            "note": {"type": "string"}, "title": {"type": "string"}}},
        "request_template": {"headers": {"X-Note": "{{input.note}}"},
                             "body": {"title": "{{input.title}}", "note": "{{input.note}}"}}})  # fmt: skip
    assert tool.status_code == 200, tool.text
    agent = agent_client(api, owner, "spoofer")
    owner.put(f"/v1/assignments/spoofer/{TOOL}")
    asked = agent.post("/v1/agent/invocations",
                       json={"tool": TOOL, "input": {"note": NOTE, "title": TITLE}})  # fmt: skip
    assert asked.status_code == 202, asked.text
    invocation = str(asked.json()["id"])
    yield owner, invocation
    owner.post(f"/v1/invocations/{invocation}/reject")
    agent.http.close()
    owner.http.close()


@contextmanager
def signed_in(api: str, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30.0) as http:
        response = http.post("/approvals/session", data={"token": token})
        assert response.status_code == 303, response.text
        yield http


def request_display(html: str, invocation: str) -> str:
    card = html.split(f'data-invocation="{invocation}"', 1)[1]
    start = card.index('<div class="request"')
    return card[start : card.index('<div class="actions">', start)]


# --- the preview and the filter, without a server ----------------------------------------


def test_the_masked_place_is_a_flag_not_text() -> None:
    row = {"id": uuid.UUID(int=1), "input": {"note": NOTE}, "endpoint_url": "https://x.test/a",
           "http_method": "GET", "request_template": {"headers": {"X-Note": "{{input.note}}"}},
           "schema_input": {}, "auth_method": "api_key", "auth_placement": "header",
           "auth_param_name": "Authorization", "auth_param_prefix": "Bearer ",
           "credential_ref": uuid.UUID(int=2), "idempotency_header": None}  # fmt: skip
    preview = preview_request(row)
    lines = {header.name: header.value for header in preview.header_lines}
    assert lines["Authorization"] == (Part("Bearer "), Part(secret=True))
    assert lines["X-Note"] == (Part(NOTE),)  # input's "••••" is text, never a secret part
    # The text views cannot tell them apart; that is why the page never draws from them.
    assert dict(preview.headers)["Authorization"] == dict(preview.headers)["X-Note"][:11]
    query = preview_request(row | {"auth_placement": "query", "auth_param_name": "key"})
    assert query.url_parts[-1] == Part(secret=True) and query.url.endswith(f"key=Bearer {MASK}")


@pytest.mark.parametrize("char", [*INJECTED, "\x00", "\x01", "\t", "\n", "\x85", "\u200b",
                                  "\u200e", "\u200f", "\u061c", "\u202a", "\u2069", "\ufeff",
                                  "\u2028", "\u00ad", "\u180e", "\u3164", "\ufe0f",
                                  "\U000e0041", "\ud800"])  # fmt: skip
def test_every_hidden_character_is_drawn_as_a_marked_escape(char: str) -> None:
    html = str(shown(f"a{char}b<"))
    code = escape_of(char) if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"
    assert re.fullmatch(rf'a<span class="esc" title="U\+{ord(char):04X} [^"]+">'
                        rf"{re.escape(code)}</span>b&lt;", html), html  # fmt: skip
    assert str(shown("a\tb\nc", block=True)) == "a\tb\nc"  # the body keeps its layout
    assert str(shown("naïve ••••  עברית")) == "naïve ••••  עברית"  # visible text is left alone


# --- the served page ----------------------------------------------------------------------


def test_served_html_has_no_raw_hidden_characters_and_one_badge(
    api: str, pending: tuple[Client, str]
) -> None:
    owner, invocation = pending
    with signed_in(api, owner.token) as http:
        for path in ("/approvals", "/approvals/queue"):  # the page and what refreshes it
            html = http.get(path).text
            assert raw_hidden(html) == [], f"{path} draws hidden characters raw"
            display = request_display(html, invocation)
            for char in INJECTED:
                assert f">{escape_of(char)}</span>" in display, (path, char)
            assert html.count('class="secret"') == 1  # the real credential only
            header_lines = re.findall(r'<span class="line" data-part="header">.*?</span></span>\n',
                                      display)  # fmt: skip
            auth = next(line for line in header_lines if ">Authorization:<" in line)
            note = next(line for line in header_lines if ">X-Note:<" in line)
            assert 'class="secret"' in auth and "credential hidden" in auth
            assert 'class="secret"' not in note and MASK in note  # shown as is, no badge
            assert escape_of(LRI) in html.split("<h3>", 1)[1].split("</h3>", 1)[0]  # tool name
            assert SECRET not in html


# --- the page in Chromium -----------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch("the spoofing test")


def sign_in(page: Page, api: str, token: str) -> None:
    page.goto(f"{api}/approvals")
    page.get_by_label("Token", exact=True).fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Waiting for you")).to_be_visible()


def test_in_a_browser_escapes_are_visible_and_only_the_real_credential_has_the_badge(
    browser: Browser, api: str, pending: tuple[Client, str], tmp_path: Path
) -> None:
    owner, invocation = pending
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    sign_in(page, api, owner.token)
    card = page.locator(f'article[data-invocation="{invocation}"]')
    request = card.locator(".request")
    expect(request).to_be_visible()

    text = request.text_content() or ""
    assert raw_hidden(text) == [], "the DOM text of the request has raw hidden characters"
    for char in INJECTED:
        assert escape_of(char) in text, char
    expect(card.locator("h3")).to_have_text(f"Post a note{escape_of(LRI)}")
    marks = request.locator(".esc")
    assert marks.count() >= 2 * len(INJECTED) - 2  # header and body, each escape its own span
    expect(marks.first).to_have_attribute("title", re.compile(r"^U\+[0-9A-F]{4} "))

    badge = request.get_by_role("img", name=re.compile("credential hidden"))
    expect(badge).to_have_count(1)
    auth = request.locator('[data-part="header"]', has_text="Authorization:")
    note = request.locator('[data-part="header"]', has_text="X-Note:")
    expect(auth.locator(".secret")).to_have_count(1)
    expect(note.locator(".secret")).to_have_count(0)
    expect(note).to_contain_text(f"X-Note: Bearer {MASK}{escape_of(RLO)}")  # as is, escaped
    # The badge is a box of its own; the fake mask is plain text of the request's colour.
    look = badge.evaluate("e => [getComputedStyle(e).backgroundColor, getComputedStyle(e)"
                          ".borderTopStyle, getComputedStyle(e).userSelect]")  # fmt: skip
    plain = note.locator(".v").evaluate("e => getComputedStyle(e).backgroundColor")
    assert look[1] == "solid" and look[2] == "none" and look[0] != plain, (look, plain)

    served = page.request.get(f"{api}/approvals/queue").text()
    assert raw_hidden(request_display(served, invocation)) == []
    assert raw_hidden(page.content()) == []
    assert SECRET not in served
    shot = tmp_path / "approvals-spoofing.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0
    context.close()
