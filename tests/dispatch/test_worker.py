"""The dispatcher end to end against a real upstream on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]


def tool_at(upstream: Upstream, path: str, **fields: Any) -> dict[str, Any]:
    return {"endpoint_url": f"{upstream.base_url}{path}"} | fields


async def test_gated_write_is_sent_once_after_approval(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = agent_with_tool(
        registry,
        **tool_at(
            upstream,
            "/posts",
            http_method="POST",
            egress_class="write",
            request_template={"body": {"post": {"text": "{{input.text}}"}}},
        ),
    )
    inv_id = registry.invoke(agent, tool["key"], {"text": "hello"})
    await drain()
    assert upstream.seen == []  # pending: nothing is sent before approval
    assert registry.get_invocation(inv_id)["status"] == "pending"
    registry.approve(inv_id)
    await drain()
    inv = registry.get_invocation(inv_id)
    assert inv["status"] == "completed", inv["error"]
    assert inv["output"]["body"] == {"post": {"text": "hello"}}
    assert upstream.by_invocation == {str(inv_id): 1}
    assert [a["status_code"] for a in inv["attempts"]] == [200]


async def test_blocked_destination_is_refused_before_any_request(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/x"))
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain(egress=EgressPolicy.from_env({}))  # the default: nothing private allowed
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "egress_blocked")
    # The agent is told no address; the owner's attempt row says which and why.
    assert "destination not allowed" in inv["error"] and "127.0.0.1" not in inv["error"]
    detail = inv["attempts"][0]["error"]
    assert "127.0.0.1" in detail and "loopback" in detail
    assert upstream.seen == []


async def test_read_503_then_200_completes_after_a_retry(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def flaky(_: web.Request, hit: int) -> web.Response:
        if hit == 1:
            return web.json_response({"busy": True}, status=503)
        return web.json_response({"ok": hit})

    upstream.routes["/flaky"] = flaky
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/flaky"))
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["output"]) == ("completed", {"ok": 2})
    assert [a["status_code"] for a in inv["attempts"]] == [503, 200]


async def test_write_timing_out_after_sending_is_not_retried(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def slow(_: web.Request, _hit: int) -> web.Response:
        await asyncio.sleep(3)
        return web.json_response({})

    upstream.routes["/slow"] = slow
    agent, tool = agent_with_tool(
        registry, **tool_at(upstream, "/slow", http_method="POST", egress_class="read_only")
    )
    registry.update_tool(tool["key"], {"timeout_seconds": 0.5})
    inv_id = registry.invoke(agent, tool["key"], {"a": 1})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "outcome_unknown")
    assert "timeout" in inv["error"]
    assert upstream.hits["/slow"] == 1


async def test_429_with_retry_after_is_retried_after_the_delay(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    times: list[float] = []

    async def limited(_: web.Request, hit: int) -> web.Response:
        times.append(asyncio.get_running_loop().time())
        if hit == 1:
            return web.json_response({"slow down": True}, status=429, headers={"Retry-After": "1"})
        return web.json_response({"created": True}, status=201)

    upstream.routes["/limited"] = limited
    agent, tool = agent_with_tool(
        registry, **tool_at(upstream, "/limited", http_method="POST", egress_class="read_only")
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["output"]) == ("completed", {"created": True})
    assert times[1] - times[0] >= 0.9
    assert [a["status_code"] for a in inv["attempts"]] == [429, 201]


@pytest.mark.parametrize(
    ("status", "method"), [(429, "POST"), (503, "POST"), (429, "GET"), (503, "GET")]
)
async def test_a_retry_after_longer_than_the_cap_fails_instead_of_retrying_early(
    registry: Registry, upstream: Upstream, drain: Drain, status: int, method: str
) -> None:
    """An upstream asking for an hour's pause is not asked again a moment later (it was,
    after the backoff, as if it had said nothing: every attempt spent at once on a rate
    limit that can get the owner's key blocked). The call fails, saying how long it asked."""

    async def limited(_: web.Request, _hit: int) -> web.Response:
        return web.json_response(
            {"slow down": True}, status=status, headers={"Retry-After": "3600"}
        )

    upstream.routes["/limited"] = limited
    agent, tool = agent_with_tool(
        registry, **tool_at(upstream, "/limited", http_method=method, egress_class="read_only")
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "http_error")
    assert upstream.hits["/limited"] == 1
    assert "Retry-After 3600 s" in inv["error"], inv["error"]


async def test_hanging_upstream_ends_in_a_timeout(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def hang(_: web.Request, _hit: int) -> web.Response:
        await asyncio.sleep(30)
        return web.json_response({})

    upstream.routes["/hang"] = hang
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/hang"))
    registry.update_tool(tool["key"], {"timeout_seconds": 0.3, "max_attempts": 1})
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "timeout")


async def test_oversized_response_hits_the_size_cap(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def huge(request: web.Request, _hit: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b"x" * 1024 * 1024
        for _ in range(50):  # 50 MB, streamed without a Content-Length
            await response.write(chunk)
        return response

    upstream.routes["/huge"] = huge
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/huge"))
    registry.update_tool(tool["key"], {"max_attempts": 1})
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "response_too_large")


async def test_a_compressed_response_is_capped_at_its_decompressed_size(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    """A gzip body of ~250 KB that inflates to 256 MB: its Content-Length is far under the
    cap, so only counting what decompression yields stops it, and only reading it in pieces
    keeps the worker's memory near the cap (5 MB) rather than the bomb's size."""
    inflated = 256 * 1024 * 1024
    packed = gzip.compress(b'{"x": "' + b"a" * inflated + b'"}', compresslevel=9)

    async def bomb(_request: web.Request, _hit: int) -> web.Response:
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        return web.Response(body=packed, headers=headers)

    upstream.routes["/bomb"] = bomb
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/bomb"))
    registry.update_tool(tool["key"], {"max_attempts": 1})
    assert len(packed) < tool["max_response_bytes"] < inflated
    inv_id = registry.invoke(agent, tool["key"], {})
    tracemalloc.start()
    try:
        await drain()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "response_too_large")
    assert peak < 8 * tool["max_response_bytes"], f"{peak / 2**20:.0f} MiB at the peak"


@pytest.mark.parametrize("change", ["disable", "revoke", "edit"])
async def test_change_after_approval_stops_the_request(
    registry: Registry, upstream: Upstream, drain: Drain, change: str
) -> None:
    agent, tool = agent_with_tool(
        registry, **tool_at(upstream, "/w", http_method="POST", egress_class="write")
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    registry.approve(inv_id)
    if change == "disable":
        registry.set_tool_status(tool["key"], "disabled")
    elif change == "revoke":
        registry.revoke(agent, tool["key"])
    else:
        registry.update_tool(tool["key"], {"endpoint_url": f"{upstream.base_url}/elsewhere"})
    await drain()
    inv = registry.get_invocation(inv_id)
    expected = {"disable": "tool_inactive", "revoke": "not_assigned", "edit": "tool_changed"}
    assert (inv["status"], inv["error_code"]) == ("failed", expected[change])
    assert upstream.seen == []


async def test_html_where_json_is_expected_fails_clearly(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def html(_: web.Request, _hit: int) -> web.Response:
        return web.Response(text="<!doctype html><html>app</html>", content_type="text/html")

    upstream.routes["/page"] = html
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/page"))
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "invalid_output")
    assert "text/html" in inv["error"]


async def test_response_pointer_and_output_mismatch(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def created(_: web.Request, _hit: int) -> web.Response:
        return web.json_response([{"postId": 42, "integration": "i"}], status=201)

    upstream.routes["/created"] = created
    agent, tool = agent_with_tool(
        registry,
        **tool_at(
            upstream,
            "/created",
            response_pointer="/0",
            schema_output={"type": "object", "properties": {"postId": {"type": "string"}}},
        ),
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert inv["status"] == "completed"  # the side effect happened
    assert inv["output"] == {"postId": 42, "integration": "i"}
    assert "42 is not of type 'string'" in inv["output_mismatch"]


async def test_an_output_mismatch_quoting_a_large_answer_is_trimmed(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    """jsonschema's message quotes the whole value that failed: a 1 MB answer where an
    object was expected made a 1 MB output_mismatch, stored beside the output itself."""
    big = ["x" * 100] * 10_000

    async def listing(_: web.Request, _hit: int) -> web.Response:
        return web.json_response(big)

    upstream.routes["/big"] = listing
    agent, tool = agent_with_tool(
        registry, **tool_at(upstream, "/big", schema_output={"type": "object"})
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["output"]) == ("completed", big)
    mismatch = inv["output_mismatch"]
    assert mismatch.startswith("output at (root): ['xxx")
    assert mismatch.endswith("is not of type 'object'") and len(mismatch) <= 600, len(mismatch)


async def test_non_2xx_fails_with_status_and_trimmed_body(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    async def bad(_: web.Request, _hit: int) -> web.Response:
        return web.json_response({"message": "nope " * 500}, status=400)

    upstream.routes["/bad"] = bad
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/bad"))
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"], inv["http_status"]) == ("failed", "http_error", 400)
    assert inv["error"].startswith("HTTP 400 from upstream: ")
    assert len(inv["error"]) < 600


async def test_worker_whose_lease_was_taken_cannot_write(
    registry: Registry, database_url: str, db: Database
) -> None:
    from toolrelay.dispatch.store import DispatchStore, open_pool

    agent, tool = agent_with_tool(registry)
    inv_id = registry.invoke(agent, tool["key"], {})
    pool = open_pool(database_url)
    await pool.open()
    try:
        first, second = DispatchStore(pool, "worker-a"), DispatchStore(pool, "worker-b")
        claimed = [r for r in await first.claim(1000, 30) if r["id"] == inv_id]
        assert claimed
        with db.connect(autocommit=True) as conn:  # worker-a stalls past its lease
            conn.execute(
                "UPDATE agents.tool_invocations SET lease_expires_at = now() - interval '1 s'"
                " WHERE id = %s",
                (inv_id,),
            )
        retaken = [r for r in await second.claim(1000, 30) if r["id"] == inv_id]
        assert retaken and retaken[0]["attempt"] == claimed[0]["attempt"] + 1
        stale = {
            "id": str(inv_id),
            "attempt": claimed[0]["attempt"],
            "status": "completed",
            "output": {"stale": True},
            "error": None,
            "error_code": None,
            "http_status": 200,
            "output_mismatch": None,
            "retry_in_ms": 0,
            "clear_sent": False,
        }
        assert await first.finish([stale], []) == {}
        fresh = stale | {"attempt": retaken[0]["attempt"], "output": {"fresh": True}}
        assert set(await second.finish([fresh], [])) == {inv_id}
    finally:
        await pool.close()
    assert registry.get_invocation(inv_id)["output"] == {"fresh": True}


async def test_api_key_is_placed_verbatim_after_the_prefix_and_scrubbed(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    from toolrelay.credentials import CredentialStore, Keyring, generate_master_key

    keyring = Keyring.parse(generate_master_key())
    secret = "sk-live-0123456789abcdef"
    cred = CredentialStore(db, keyring).add(registry.owner, "api_key", "svc", secret)

    async def leaky(request: web.Request, _hit: int) -> web.Response:
        return web.json_response({"echo": request.headers.get("X-Api-Key")}, status=500)

    upstream.routes["/leaky"] = leaky
    agent, tool = agent_with_tool(
        registry,
        **tool_at(
            upstream,
            "/secure",
            auth_method="api_key",
            credential_ref=cred,
            auth_param_name="X-Api-Key",
            auth_param_prefix="Token ",
        ),
    )
    inv_id = registry.invoke(agent, tool["key"], {})
    leak = add_leaky(registry, upstream, cred, agent)
    leak_id = registry.invoke(agent, leak, {})
    await drain(keyring=keyring)
    secure = next(s for s in upstream.seen if s.path == "/secure")
    assert secure.headers["X-Api-Key"] == f"Token {secret}"
    assert registry.get_invocation(inv_id)["status"] == "completed"
    leaked = registry.get_invocation(leak_id)
    assert leaked["status"] == "failed"
    assert secret not in (leaked["error"] or "") and "[redacted]" in leaked["error"]


def add_leaky(registry: Registry, upstream: Upstream, cred: Any, agent: str) -> str:
    from tests.registry.helpers import add_tool

    tool = add_tool(
        registry,
        key="echo.leaky",
        endpoint_url=f"{upstream.base_url}/leaky",
        auth_method="api_key",
        credential_ref=cred,
        auth_param_name="X-Api-Key",
        max_attempts=1,
    )
    registry.assign(agent, tool["key"])
    return str(tool["key"])


async def test_tool_with_auth_but_no_credential_is_not_dispatched(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = agent_with_tool(registry, **tool_at(upstream, "/x", auth_method="api_key"))
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "credential_missing")
    assert upstream.seen == []
