"""`toolrelay login` against a real OpenID Connect provider (oidc-provider from npm): the CLI,
run as a process, waits on a loopback redirect (RFC 8252) while Chromium signs in at the
provider; afterwards every command acts as that member (their role checked, decisions in
their name) until `logout`, expiry or removal ends it. And the port it listens on answers
nobody but the provider's redirect with this sign-in's state."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect
from typer.testing import CliRunner

from tests.browser import launch
from tests.cliproc import WAIT_S, Waiting
from tests.oidc import Provider, start_provider
from tests.registry.helpers import agent_with_tool
from toolrelay.cli import context
from toolrelay.cli.main import app
from toolrelay.db import Database
from toolrelay.registry import Registry
from toolrelay.registry.members import Members

CLIENT = {
    "client_id": "toolrelay-cli",
    "application_type": "native",
    "token_endpoint_auth_method": "none",
    "redirect_uris": ["http://127.0.0.1/callback"],  # any port on loopback (RFC 8252 7.3)
}
runner = CliRunner()


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with start_provider([CLIENT]) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    yield from launch("toolrelay login")


@pytest.fixture
def home(
    tmp_path: Path, database_url: str, provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> Path:
    monkeypatch.setenv("TOOLRELAY_HOME", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.delenv("TOOLRELAY_OWNER", raising=False)
    monkeypatch.setenv("TOOLRELAY_OIDC_ISSUER", provider.issuer)
    monkeypatch.setenv("TOOLRELAY_OIDC_CLI_CLIENT_ID", "toolrelay-cli")
    context.database.cache_clear()
    return tmp_path


def start_login(*args: str) -> Waiting:
    """`toolrelay login --no-browser` running."""
    return Waiting(["login", "--no-browser", "--timeout", str(WAIT_S), *args], os.environ)


def sign_in_at_provider(browser: Browser, url: str, login: str) -> None:
    page = browser.new_context().new_page()
    page.goto(url)
    page.locator('input[name="login"]').fill(login)
    page.locator('input[name="password"]').fill("any password")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()
    expect(page.get_by_text("Done.")).to_be_visible()
    page.context.close()


def tenant_with_pending(
    db: Database, *members: tuple[str, str, str]
) -> tuple[Registry, dict[str, uuid.UUID], uuid.UUID]:
    owner = Registry(db, uuid.uuid4())
    ids = {
        name: Members(db).add(owner.owner, name, role, email).id for name, role, email in members
    }
    agent_with_tool(owner, key="notes.create", egress_class="write", http_method="POST")
    return owner, ids, owner.invoke("bot", "notes.create", {"text": "hi"})


def test_login_then_every_command_acts_as_the_member_until_logout(
    home: Path, db: Database, browser: Browser
) -> None:
    who = f"ana-{uuid.uuid4().hex[:8]}"
    owner, ids, call = tenant_with_pending(db, ("Ana", "approver", f"{who}@example.test"))
    login = start_login()
    sign_in_at_provider(browser, login.url(), who)
    code, out, err = login.finish()
    assert code == 0, err
    assert f"signed in as Ana (approver) in organization {owner.owner}" in err
    session = home / "session.json"
    assert stat.S_IMODE(session.stat().st_mode) == 0o600
    token = context.signed_in()
    assert token is not None and token.token not in out + err  # the token is never printed

    shown = runner.invoke(app, ["whoami"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.split("\t")[:3] == ["Ana", "approver", f"member {ids['Ana']}"]
    # TOOLRELAY_OWNER was not needed: the session names the organization
    approved = runner.invoke(app, ["approve", str(call)])
    assert approved.exit_code == 0, approved.output
    assert owner.get_invocation(call)["decided_by"] == ids["Ana"]
    # an approver may not register tools, whatever the CLI can reach
    refused = runner.invoke(app, ["agent", "create", "another-bot"])
    assert refused.exit_code == 1 and "admin" in refused.output

    out_ = runner.invoke(app, ["logout"])
    assert out_.exit_code == 0, out_.output
    assert not session.exists()
    with db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT revoked_at FROM agents.api_tokens WHERE member_id = %s AND session = 'cli'",
            (ids["Ana"],),
        ).fetchone()
    assert row is not None and row["revoked_at"] is not None


def test_a_removed_member_cli_session_ends_at_once(
    home: Path, db: Database, browser: Browser
) -> None:
    who = f"ben-{uuid.uuid4().hex[:8]}"
    owner, ids, call = tenant_with_pending(db, ("Ben", "approver", f"{who}@example.test"))
    login = start_login()
    sign_in_at_provider(browser, login.url(), who)
    assert login.finish()[0] == 0
    Members(db).remove(owner.owner, ids["Ben"])
    approved = runner.invoke(app, ["approve", str(call)])
    assert approved.exit_code == 1
    assert "your sign-in as Ben has ended" in approved.output
    assert owner.get_invocation(call)["status"] == "pending"


def test_a_person_in_two_organizations_names_one(
    home: Path, db: Database, browser: Browser
) -> None:
    who = f"mo-{uuid.uuid4().hex[:8]}"
    first, first_ids, _ = tenant_with_pending(db, ("Mo", "viewer", f"{who}@example.test"))
    second, second_ids, _ = tenant_with_pending(db, ("Mo", "admin", f"{who}@example.test"))
    login = start_login()
    sign_in_at_provider(browser, login.url(), who)
    code, _, err = login.finish()
    assert code == 1 and "member of 2 organizations" in err
    assert str(first.owner) in err and str(second.owner) in err
    assert not (home / "session.json").exists()

    login = start_login("--owner", str(second.owner))
    sign_in_at_provider(browser, login.url(), who)
    code, _, err = login.finish()
    assert code == 0, err
    shown = runner.invoke(app, ["whoami"])
    assert shown.output.split("\t")[:3] == ["Mo", "admin", f"member {second_ids['Mo']}"]
    assert first_ids["Mo"] != second_ids["Mo"]


def test_the_loopback_port_answers_only_this_sign_in(home: Path, provider: Provider) -> None:
    """Another local process that finds the port cannot end the wait with its own code, nor
    learn anything from it; the CLI keeps waiting for the provider."""
    login = start_login()
    url = login.url()
    redirect = httpx.URL(url).params["redirect_uri"]
    forged = httpx.get(redirect, params={"code": "attacker-code", "state": "guess"})
    assert forged.status_code == 400 and forged.text == "not this sign-in"
    assert login.process.poll() is None  # still waiting
    login.process.terminate()
    login.process.wait(WAIT_S)


def test_login_without_a_provider_says_what_to_set(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOOLRELAY_OIDC_ISSUER")
    result = runner.invoke(app, ["login", "--no-browser"])
    assert result.exit_code == 1
    assert (
        "TOOLRELAY_OIDC_ISSUER" in result.output and "TOOLRELAY_OIDC_CLI_CLIENT_ID" in result.output
    )
