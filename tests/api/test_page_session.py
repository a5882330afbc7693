"""The approvals page never keeps a pasted token in its cookie (migration 0055).

Cookies are not kept apart by port: any other service on the page's host name (a dev server,
a loopback upstream) receives the page's cookie. It used to be the pasted owner token itself,
long-lived and left valid by signing out. Now the cookie holds a page session's own token:
at most 8 hours, never past the pasted token's expiry, ended by signing out and by revoking
the token it came from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import httpx

from tests.api.conftest import Client, agent_client
from toolrelay.api.approvals import COOKIE
from toolrelay.db import Database
from toolrelay.tokens import hash_token


@contextmanager
def page(api: str, pasted: str) -> Iterator[tuple[httpx.Client, str]]:
    """A browser's cookie jar signed in with ``pasted``, and the cookie's value."""
    with httpx.Client(base_url=api, timeout=30.0) as http:
        response = http.post("/approvals/session", data={"token": pasted})
        assert response.status_code == 303, response.text
        yield http, http.cookies[COOKIE]


def me(api: str, token: str) -> int:
    return httpx.get(f"{api}/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code


def signed_in(http: httpx.Client) -> bool:
    return "Sign out" in http.get("/approvals").text


def sign_out(http: httpx.Client) -> None:
    html = http.get("/approvals").text
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert match is not None, html
    assert http.post("/approvals/signout", data={"csrf": match[1]}).status_code == 303


def test_the_cookie_holds_a_session_of_its_own_that_signing_out_ends(
    api: str, make_owner: Callable[[], Client]
) -> None:
    owner = make_owner()
    with page(api, owner.token) as (http, cookie):
        assert cookie != owner.token
        assert owner.token not in str(http.cookies.jar)
        assert signed_in(http)
        assert me(api, cookie) == 200  # it is a token of the same owner...
        sessions = [t for t in owner.get("/v1/tokens").json()["items"]
                    if t["name"] == "signed in (page)"]  # fmt: skip
        assert len(sessions) == 1 and sessions[0]["kind"] == "owner"
        expires = datetime.fromisoformat(sessions[0]["expires_at"])
        assert expires <= datetime.now(UTC) + timedelta(hours=8, minutes=1)
        sign_out(http)
        assert not signed_in(http)
    assert me(api, cookie) == 401  # ...that signing out ended
    assert me(api, owner.token) == 200  # the pasted token is the owner's to revoke, not the page's


def test_revoking_the_pasted_token_ends_the_sessions_made_from_it(
    api: str, make_owner: Callable[[], Client], db: Database
) -> None:
    owner = make_owner()
    made = owner.post("/v1/tokens", json={"name": "laptop"}).json()
    with (
        page(api, made["token"]) as (http, cookie),
        page(api, made["token"]) as (other, _),
        page(api, cookie) as (third, _),  # a session's own token pasted: the same root
    ):
        assert signed_in(http) and signed_in(other) and signed_in(third)
        assert owner.delete(f"/v1/tokens/{made['id']}").json() == {"revoked": True}
        assert not signed_in(http) and not signed_in(other) and not signed_in(third)
    with db.as_dispatcher() as conn:
        rows = conn.execute(
            "SELECT parent_id, revoked_at FROM agents.api_tokens WHERE session = 'page'"
            " AND owner = %s",
            (owner.owner,),
        ).fetchall()
    assert len(rows) == 3
    assert all(str(r["parent_id"]) == made["id"] for r in rows)
    assert all(r["revoked_at"] is not None for r in rows)


def test_a_session_never_outlives_the_pasted_token(
    api: str, make_owner: Callable[[], Client], db: Database
) -> None:
    owner = make_owner()
    soon = datetime.now(UTC) + timedelta(minutes=20)
    made = owner.post("/v1/tokens", json={"name": "short", "expires_at": soon.isoformat()}).json()
    with page(api, made["token"]) as (_, cookie), db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT expires_at FROM agents.api_tokens WHERE token_hash = %s", (hash_token(cookie),)
        ).fetchone()
    assert row is not None
    assert row["expires_at"] == datetime.fromisoformat(made["expires_at"])


def test_a_members_session_is_the_members_and_ends_with_the_member(
    api: str, make_owner: Callable[[], Client]
) -> None:
    owner = make_owner()
    member = owner.post("/v1/members", json={"name": "Ada", "role": "approver"}).json()
    with page(api, member["token"]) as (http, cookie):
        who = httpx.get(f"{api}/v1/me", headers={"Authorization": f"Bearer {cookie}"}).json()
        assert (who["member_id"], who["role"]) == (member["id"], "approver")
        assert owner.delete(f"/v1/members/{member['id']}").status_code == 200
        assert not signed_in(http)
    assert me(api, cookie) == 401


def test_agent_and_dead_tokens_make_no_session(
    api: str, make_owner: Callable[[], Client], db: Database
) -> None:
    owner = make_owner()
    agent = agent_client(api, owner, "page-bot")
    made = owner.post("/v1/tokens", json={"name": "gone"}).json()
    owner.delete(f"/v1/tokens/{made['id']}")
    with httpx.Client(base_url=api, timeout=30.0) as http:
        for token, status in ((agent.token, 403), (made["token"], 401), ("trk_nope", 401)):
            response = http.post("/approvals/session", data={"token": token})
            assert response.status_code == status, response.text
            assert COOKIE not in http.cookies
    with db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM agents.api_tokens WHERE session = 'page' AND owner = %s",
            (owner.owner,),
        ).fetchone()
    assert row == {"n": 0}
    agent.http.close()
