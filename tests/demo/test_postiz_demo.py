"""The demo's scenarios end to end against the Postiz-compatible server, both sides checked."""

from __future__ import annotations

import io

from rich.console import Console

from toolrelay.credentials import Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.demo.postiz import TOOL_KEY, Demo, _failure_cases, _happy_path, run_demo
from toolrelay.testing.postiz import start_postiz


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


async def test_demo_passes_end_to_end(db: Database) -> None:
    out = quiet()
    assert await run_demo(db, Keyring.parse(generate_master_key()), out) is True
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert "posts created twice: 0" in text


async def test_approved_post_reaches_postiz_once_with_raw_key_and_nested_body(
    db: Database,
) -> None:
    demo = Demo(db, Keyring.parse(generate_master_key()), quiet())
    postiz = await start_postiz(front=True)
    try:
        assert await _happy_path(demo, postiz) is True
        posts = postiz.state.requests_to("POST", "/posts")
        assert len(posts) == 1
        sent = posts[0]
        assert sent.path == "/api/public/v1/posts"
        assert sent.headers["Authorization"] == postiz.org("Acme").api_key
        body = sent.body
        assert body["type"] == "draft" and body["shortLink"] is False and body["tags"] == []
        entry = body["posts"][0]
        assert entry["integration"] == {"id": postiz.org("Acme").by_identifier("x").id}
        assert entry["value"] == [{"content": "Hello from toolrelay", "image": []}]
        assert entry["settings"] == {"__type": "x", "who_can_reply_post": "everyone"}
        inv = demo.registry.list_invocations()[0]
        assert inv["output"]["postId"] in postiz.state.posts
        assert set(postiz.state.creations_by_invocation.values()) == {1}
    finally:
        await postiz.close()


async def test_failure_cases_each_end_in_their_own_outcome(db: Database) -> None:
    demo = Demo(db, Keyring.parse(generate_master_key()), quiet())
    postiz = await start_postiz(front=True)
    limited = await start_postiz(front=True, rate_limit=1, rate_window_seconds=2)
    try:
        await _happy_path(demo, postiz)
        scenarios = await _failure_cases(demo, postiz, limited)
        got = {s.name: s.status for s in scenarios}
        assert got == {
            "key from another organization": "http_error",
            "bare /public/v1 URL behind the front": "invalid_output",
            "template without who_can_reply_post": "http_error",
            "rate limit: 429 then retried after Retry-After": "completed",
        }
        details = {s.name: s.detail for s in scenarios}
        assert "Integration with id" in details["key from another organization"]
        assert "text/html" in details["bare /public/v1 URL behind the front"]
        assert "who_can_reply_post" in details["template without who_can_reply_post"]
        assert "[429, 201]" in details["rate limit: 429 then retried after Retry-After"]
        # the HTML front answered; nothing reached the API for the bare URL
        bare = [r for r in postiz.state.requests if r.path == "/public/v1/posts"]
        assert [r.status for r in bare] == [200]
        for server in (postiz, limited):
            assert all(n == 1 for n in server.state.creations_by_invocation.values())
        assert demo.registry.get_tool(TOOL_KEY)["egress_class"] == "write"
    finally:
        await postiz.close()
        await limited.close()
