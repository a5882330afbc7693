"""The Postiz-compatible server answers exactly as the contract says, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from toolrelay.testing.postiz import (
    INVOCATION_HEADER,
    Organization,
    RateLimiter,
    RunningPostiz,
    postiz_server,
    weighted_length,
)

DATE = "2026-12-01T10:00:00.000Z"
IN_RANGE = {"startDate": "2026-11-01T00:00:00Z", "endDate": "2027-01-01T00:00:00Z"}
Answer = tuple[int, Any, aiohttp.ClientResponse]


@pytest.fixture
async def postiz() -> AsyncIterator[RunningPostiz]:
    async with postiz_server(rate_limit=3) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def acme(server: RunningPostiz) -> Organization:
    return server.org("Acme")


def x_id(server: RunningPostiz, org: str = "Acme") -> str:
    return server.org(org).by_identifier("x").id


def body(integration_id: str, content: str = "Hello", **changes: Any) -> dict[str, Any]:
    post = {
        "integration": {"id": integration_id},
        "value": [{"content": content, "image": []}],
        "settings": {"__type": "x", "who_can_reply_post": "everyone"},
    }
    fields = {"type": "schedule", "shortLink": False, "date": DATE, "tags": [], "posts": [post]}
    return fields | changes


async def call(
    http: aiohttp.ClientSession, method: str, url: str, key: str | None = None, **kwargs: Any
) -> Answer:
    headers = kwargs.pop("headers", {}) | ({"Authorization": key} if key is not None else {})
    async with http.request(method, url, headers=headers, **kwargs) as response:
        text = await response.text()
        is_json = response.content_type == "application/json"
        return response.status, json.loads(text) if is_json else text, response


async def create(
    http: aiohttp.ClientSession,
    server: RunningPostiz,
    payload: Any,
    key: str | None = None,
    invocation: str | None = None,
) -> Answer:
    url = f"{server.api_base_url}/public/v1/posts"
    headers = {INVOCATION_HEADER: invocation} if invocation else {}
    return await call(http, "POST", url, key or acme(server).api_key, json=payload, headers=headers)


def bad_request(*messages: str) -> dict[str, Any]:
    return {"message": list(messages), "error": "Bad Request", "statusCode": 400}


# --- authentication ---------------------------------------------------------------------


async def test_missing_or_empty_key_is_not_found(postiz: RunningPostiz, http: Any) -> None:
    url = f"{postiz.base_url}/public/v1/is-connected"
    for key in (None, ""):
        status, answer, _ = await call(http, "GET", url, key)
        assert (status, answer) == (401, {"msg": "No API Key found"})


async def test_bearer_prefixed_or_unknown_key_is_invalid(postiz: RunningPostiz, http: Any) -> None:
    url = f"{postiz.base_url}/public/v1/integrations"
    for key in (f"Bearer {acme(postiz).api_key}", "0" * 64):
        status, answer, _ = await call(http, "GET", url, key)
        assert (status, answer) == (401, {"msg": "Invalid API key"})


async def test_raw_key_is_connected(postiz: RunningPostiz, http: Any) -> None:
    url = f"{postiz.base_url}/public/v1/is-connected"
    status, answer, _ = await call(http, "GET", url, acme(postiz).api_key)
    assert (status, answer) == (200, {"connected": True})


async def test_seeded_organizations_have_real_looking_keys(postiz: RunningPostiz) -> None:
    assert [o.name for o in postiz.organizations] == ["Acme", "Globex"]
    for org in postiz.organizations:
        assert len(org.api_key) == 64 and set(org.api_key) <= set("0123456789abcdef")
        assert sorted(i.identifier for i in org.integrations) == ["linkedin", "x"]


async def test_unknown_route_is_a_nest_style_404(postiz: RunningPostiz, http: Any) -> None:
    status, answer, _ = await call(http, "PUT", f"{postiz.base_url}/public/v1/posts")
    expected = {"message": "Cannot PUT /public/v1/posts", "error": "Not Found", "statusCode": 404}
    assert (status, answer) == (404, expected)


# --- integrations -----------------------------------------------------------------------


async def test_integrations_are_the_key_organizations_only(
    postiz: RunningPostiz, http: Any
) -> None:
    url = f"{postiz.base_url}/public/v1/integrations"
    fields = {"id", "name", "identifier", "picture", "disabled", "profile"}
    for org in postiz.organizations:
        status, answer, _ = await call(http, "GET", url, org.api_key)
        assert status == 200
        assert [i["id"] for i in answer] == [i.id for i in org.integrations]
        assert all(set(i) == fields for i in answer)


# --- creating posts ---------------------------------------------------------------------


async def test_create_answers_201_with_one_entry_per_post(postiz: RunningPostiz, http: Any) -> None:
    linkedin = acme(postiz).by_identifier("linkedin")
    payload = body(x_id(postiz))
    payload["posts"].append(
        {"integration": {"id": linkedin.id}, "value": [{"content": "Hi", "image": []}]}
    )
    status, answer, _ = await create(http, postiz, payload, invocation="inv-1")
    assert status == 201
    assert [a["integration"] for a in answer] == [x_id(postiz), linkedin.id]
    assert [a["postId"] for a in answer] == list(postiz.state.posts)
    assert postiz.state.creations_by_invocation == {"inv-1": 1}


async def test_requests_are_logged_with_headers_and_body(postiz: RunningPostiz, http: Any) -> None:
    payload = body(x_id(postiz))
    await create(http, postiz, payload, invocation="inv-2")
    [logged] = postiz.state.requests_to("POST", "/public/v1/posts")
    assert logged.body == payload and logged.status == 201
    assert logged.headers["authorization"] == acme(postiz).api_key
    assert logged.invocation_id == "inv-2"


async def test_failed_creations_are_not_counted(postiz: RunningPostiz, http: Any) -> None:
    await create(http, postiz, body("nope"), invocation="inv-3")
    assert postiz.state.creations_by_invocation["inv-3"] == 0
    assert postiz.state.posts == {}


async def test_validation_errors_name_each_field_path(postiz: RunningPostiz, http: Any) -> None:
    payload = {
        "type": "later",
        "shortLink": "no",
        "tags": [{"value": "a"}],
        "posts": [{"integration": {}, "value": [{"content": ""}]}],
    }
    status, answer, _ = await create(http, postiz, payload)
    assert (status, answer) == (
        400,
        bad_request(
            "type must be one of the following values: draft, schedule, now",
            "shortLink must be a boolean value",
            "date should not be null or undefined",
            "tags.0.label should not be null or undefined",
            "posts.0.integration.id should not be empty",
            "posts.0.value.0.image should not be null or undefined",
            "posts.0.value.0.content should not be empty",
        ),
    )


async def test_bad_date_and_empty_posts_are_reported(postiz: RunningPostiz, http: Any) -> None:
    status, answer, _ = await create(http, postiz, body("any", date="tomorrow", posts=[]))
    assert (status, answer) == (
        400,
        bad_request(
            "date must be a valid ISO 8601 date string", "posts must contain at least 1 elements"
        ),
    )


async def test_body_that_is_not_declared_json_is_validated_as_empty(
    postiz: RunningPostiz, http: Any
) -> None:
    url = f"{postiz.public_url}/posts"
    data = json.dumps(body(x_id(postiz)))
    headers = {"Content-Type": "text/plain"}
    status, answer, _ = await call(
        http, "POST", url, acme(postiz).api_key, data=data, headers=headers
    )
    assert status == 400
    assert answer["message"][0] == "type should not be null or undefined"
    assert len(answer["message"]) == 5


async def test_empty_content_is_fine_with_an_image(postiz: RunningPostiz, http: Any) -> None:
    payload = body(x_id(postiz), content="")
    payload["posts"][0]["value"][0]["image"] = [{"id": "i1", "path": "https://cdn.test/a.png"}]
    status, _, _ = await create(http, postiz, payload)
    assert status == 201


async def test_integration_of_another_organization_is_not_found(
    postiz: RunningPostiz, http: Any
) -> None:
    for integration_id in (x_id(postiz, "Globex"), "does-not-exist"):
        status, answer, _ = await create(http, postiz, body(integration_id))
        message = f"Integration with id {integration_id} not found"
        assert (status, answer) == (
            400,
            {"message": message, "error": "Bad Request", "statusCode": 400},
        )


async def test_x_requires_who_can_reply_even_for_drafts(postiz: RunningPostiz, http: Any) -> None:
    payload = body(x_id(postiz), type="draft")
    del payload["posts"][0]["settings"]["who_can_reply_post"]
    status, answer, _ = await create(http, postiz, payload)
    allowed = "everyone, following, mentionedUsers, subscribers, verified"
    message = f"posts.0.settings.who_can_reply_post must be one of the following values: {allowed}"
    assert (status, answer) == (400, bad_request(message))


async def test_x_community_must_be_an_x_community_url(postiz: RunningPostiz, http: Any) -> None:
    for community, expected in (("", 201), ("https://x.com/i/communities/123", 201), ("x", 400)):
        payload = body(x_id(postiz))
        payload["posts"][0]["settings"]["community"] = community
        postiz.state.reset_rate_limit()
        status, _, _ = await create(http, postiz, payload)
        assert status == expected, community


async def test_long_x_post_is_refused_when_scheduled_but_not_as_draft(
    postiz: RunningPostiz, http: Any
) -> None:
    too_long = "a" * 281
    for post_type in ("schedule", "now"):
        status, answer, _ = await create(http, postiz, body(x_id(postiz), too_long, type=post_type))
        assert (status, answer) == (
            400,
            {
                "statusCode": 400,
                "provider": "x",
                "name": acme(postiz).by_identifier("x").name,
                "message": "post is too long, please fix it",
            },
        )
    status, _, _ = await create(http, postiz, body(x_id(postiz), too_long, type="draft"))
    assert status == 201


def test_weighted_length_approximates_twitter() -> None:
    assert weighted_length("a" * 280) == 280
    assert weighted_length("日本語") == 6
    assert weighted_length("see https://example.com/" + "p" * 100) == 4 + 23
    assert weighted_length("👍🏽 👨\u200d👩\u200d👧 🇫🇷 ❤️") == 2 + 1 + 2 + 1 + 2 + 1 + 2


# --- listing and deleting ---------------------------------------------------------------


async def test_listing_posts_needs_both_dates(postiz: RunningPostiz, http: Any) -> None:
    url = f"{postiz.base_url}/public/v1/posts"
    status, answer, _ = await call(http, "GET", url, acme(postiz).api_key)
    assert (status, answer) == (
        400,
        bad_request(
            "startDate must be a valid ISO 8601 date string",
            "endDate must be a valid ISO 8601 date string",
        ),
    )


async def test_listing_posts_in_range_gives_settings_as_a_string(
    postiz: RunningPostiz, http: Any
) -> None:
    _, [created], _ = await create(http, postiz, body(x_id(postiz)))
    await create(http, postiz, body(x_id(postiz, "Globex")), key=postiz.org("Globex").api_key)
    url = f"{postiz.base_url}/public/v1/posts"
    status, answer, _ = await call(http, "GET", url, acme(postiz).api_key, params=IN_RANGE)
    assert status == 200
    [post] = answer["posts"]
    assert (post["id"], post["content"], post["state"]) == (created["postId"], "Hello", "QUEUE")
    assert post["publishDate"] == DATE and post["integration"]["id"] == x_id(postiz)
    assert json.loads(post["settings"]) == {"__type": "x", "who_can_reply_post": "everyone"}
    later = {"startDate": "2027-01-01T00:00:00Z", "endDate": "2027-02-01T00:00:00Z"}
    _, answer, _ = await call(http, "GET", url, acme(postiz).api_key, params=later)
    assert answer == {"posts": []}


async def test_delete_answers_error_true_and_removes_the_post(
    postiz: RunningPostiz, http: Any
) -> None:
    _, [created], _ = await create(http, postiz, body(x_id(postiz)))
    url = f"{postiz.base_url}/public/v1/posts/{created['postId']}"
    globex_key = postiz.org("Globex").api_key
    status, _, _ = await call(http, "DELETE", url, globex_key)
    assert status == 500  # another organization's post is unknown to this key
    status, answer, _ = await call(http, "DELETE", url, acme(postiz).api_key)
    assert (status, answer) == (200, {"error": True})
    assert postiz.state.live_posts(acme(postiz).id) == []
    status, answer, _ = await call(http, "DELETE", url, acme(postiz).api_key)
    assert (status, answer) == (500, {"statusCode": 500, "message": "Internal server error"})


# --- rate limit -------------------------------------------------------------------------


async def test_rate_limit_counts_every_post_and_answers_429(
    postiz: RunningPostiz, http: Any
) -> None:
    remaining = []
    for payload in (body(x_id(postiz)), body("bad"), {}):  # failed posts count too
        _, _, response = await create(http, postiz, payload)
        assert response.headers["X-RateLimit-Limit"] == "3"
        assert 0 < int(response.headers["X-RateLimit-Reset"]) <= 3600
        remaining.append(response.headers["X-RateLimit-Remaining"])
    assert remaining == ["2", "1", "0"]
    status, answer, response = await create(http, postiz, body(x_id(postiz)))
    assert (status, answer) == (
        429,
        {"statusCode": 429, "message": "ThrottlerException: Too Many Requests"},
    )
    assert 0 < int(response.headers["Retry-After"]) <= 3600
    assert len(postiz.state.posts) == 1


async def test_rate_limit_is_per_organization_and_resettable(
    postiz: RunningPostiz, http: Any
) -> None:
    for _ in range(4):
        await create(http, postiz, {})
    globex = postiz.org("Globex")
    status, _, _ = await create(http, postiz, body(x_id(postiz, "Globex")), key=globex.api_key)
    assert status == 201
    postiz.state.reset_rate_limit(acme(postiz).id)
    status, _, _ = await create(http, postiz, body(x_id(postiz)))
    assert status == 201


async def test_other_endpoints_are_not_throttled(postiz: RunningPostiz, http: Any) -> None:
    for _ in range(4):
        await create(http, postiz, {})
    url = f"{postiz.base_url}/public/v1/integrations"
    status, _, response = await call(http, "GET", url, acme(postiz).api_key)
    assert status == 200 and "X-RateLimit-Limit" not in response.headers


async def test_rate_limit_window_can_be_short(http: Any) -> None:
    async with postiz_server(rate_limit=1, rate_window_seconds=0.2) as server:
        assert (await create(http, server, body(x_id(server))))[0] == 201
        assert (await create(http, server, body(x_id(server))))[0] == 429
        await asyncio.sleep(0.25)
        assert (await create(http, server, body(x_id(server))))[0] == 201


def test_rate_limiter_window_opens_on_first_hit() -> None:
    now = [100.0]
    limiter = RateLimiter(limit=2, window_seconds=60, clock=lambda: now[0])
    assert limiter.hit("org").reset_seconds == 60
    now[0] = 130.5
    decision = limiter.hit("org")
    assert (decision.allowed, decision.remaining, decision.reset_seconds) == (True, 0, 30)
    assert limiter.hit("org").headers()["Retry-After"] == "30"
    now[0] = 160.0
    assert limiter.hit("org").remaining == 1


# --- front (self-hosted nginx) mode -----------------------------------------------------


async def test_front_serves_html_outside_api(http: Any) -> None:
    async with postiz_server(front=True) as server:
        key = acme(server).api_key
        assert server.api_base_url == server.base_url + "/api"
        for method in ("GET", "POST", "DELETE"):
            url = f"{server.base_url}/public/v1/posts"
            status, page, response = await call(http, method, url, key, json=body(x_id(server)))
            assert status == 200 and response.content_type == "text/html"
            assert page.startswith("<!DOCTYPE html>")
        assert server.state.posts == {}


async def test_front_proxies_api_without_prefix(http: Any) -> None:
    async with postiz_server(front=True) as server:
        key = acme(server).api_key
        status, answer, _ = await create(http, server, body(x_id(server)), key=key)
        assert status == 201 and len(answer) == 1
        url = f"{server.base_url}/api/public/v1/nothing"
        status, answer, _ = await call(http, "GET", url, key)
        assert (status, answer["message"]) == (404, "Cannot GET /public/v1/nothing")
        [logged] = server.state.requests_to("POST", "/public/v1/posts")
        assert logged.path == "/api/public/v1/posts"


# --- command line -----------------------------------------------------------------------


async def test_cli_prints_its_address_and_organizations(http: Any) -> None:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "toolrelay.testing.postiz", "--port", "0", "--front"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        info = json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=20))
        [acme_info, _] = info["organizations"]
        assert info["api_base_url"] == info["base_url"] + "/api" and info["rate_limit"] == 30
        url = f"{info['public_url']}/integrations"
        status, answer, _ = await call(http, "GET", url, acme_info["api_key"])
        assert status == 200
        assert [i["id"] for i in answer] == [i["id"] for i in acme_info["integrations"]]
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0
