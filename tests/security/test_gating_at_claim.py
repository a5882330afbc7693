"""Finding 4: gating is decided again at claim time and before every retry.

A call made while its tool was ungated was still sent after the owner gated the tool, also
during a Retry-After wait (a window the upstream controls). Now such a call goes back to
pending approval: nothing leaves until a human approves it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]


async def test_a_call_made_ungated_waits_for_approval_once_the_tool_is_gated(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/items")
    inv_id = registry.invoke(agent, tool["key"], {"text": "x"})
    assert registry.get_invocation(inv_id)["approval_status"] == "not_required"
    # The owner turns the read into a gated DELETE before any worker claimed the call.
    registry.update_tool(tool["key"], {"http_method": "DELETE", "egress_class": "write"})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["approval_status"]) == ("pending", "pending")
    assert inv["approval_expires_at"] is not None
    assert upstream.seen == []
    assert [q["id"] for q in registry.review_queue()] == [inv_id]

    registry.approve(inv_id)
    await drain()
    inv = registry.get_invocation(inv_id)
    assert inv["status"] == "completed", inv["error"]
    assert [s.method for s in upstream.seen] == ["DELETE"]


async def test_gating_during_a_retry_after_wait_stops_the_retry(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/slow")

    async def gate_then_refuse(_request: web.Request, hit: int) -> web.StreamResponse:
        if hit == 1:  # the owner gates the tool while the call waits out Retry-After
            registry.update_tool(tool["key"], {"requires_approval": True})
        return web.json_response({"error": "busy"}, status=429, headers={"Retry-After": "1"})

    upstream.routes["/slow"] = gate_then_refuse
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["approval_status"]) == ("pending", "pending")
    assert upstream.hits["/slow"] == 1  # the retry was not sent
    assert [a["status_code"] for a in inv["attempts"]] == [429, None]
    assert inv["attempts"][-1]["error_code"] == "approval_required"


async def test_an_ungated_tool_still_sends_under_the_configuration_of_the_moment(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    """Ungated stays ungated: a changed template applies, nothing waits."""
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/a")
    inv_id = registry.invoke(agent, tool["key"], {"text": "x"})
    registry.update_tool(tool["key"], {"endpoint_url": f"{upstream.base_url}/b"})
    await drain()
    assert registry.get_invocation(inv_id)["status"] == "completed"
    assert [s.path for s in upstream.seen] == ["/b"]


async def test_the_claim_that_waited_for_approval_costs_no_attempt(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    """A tool allowed one attempt: the claim that put the call back to pending sent nothing,
    so the approved call still has its one attempt (it used to fail "gave up after 1
    attempts" unsent, the owner's approval wasted)."""
    agent, tool = agent_with_tool(
        registry, endpoint_url=f"{upstream.base_url}/items", max_attempts=1
    )
    inv_id = registry.invoke(agent, tool["key"], {"text": "x"})
    registry.update_tool(tool["key"], {"requires_approval": True})
    await drain()
    assert registry.get_invocation(inv_id)["status"] == "pending"
    registry.approve(inv_id)
    await drain()
    inv = registry.get_invocation(inv_id)
    assert inv["status"] == "completed", inv["error"]
    assert len(upstream.seen) == 1
    assert [a["error_code"] for a in inv["attempts"]] == ["approval_required", None]


async def test_an_approved_call_keeps_the_retries_left_when_it_was_gated(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    """Two attempts: the first was refused (429), the tool was gated during the wait; after
    the approval the second attempt is still the call's to make, and no third."""
    agent, tool = agent_with_tool(
        registry, endpoint_url=f"{upstream.base_url}/slow", max_attempts=2
    )

    async def gate_then_refuse(_request: web.Request, hit: int) -> web.StreamResponse:
        if hit == 1:
            registry.update_tool(tool["key"], {"requires_approval": True})
        return web.json_response({"error": "busy"}, status=429, headers={"Retry-After": "0"})

    upstream.routes["/slow"] = gate_then_refuse
    inv_id = registry.invoke(agent, tool["key"], {})
    await drain()
    assert registry.get_invocation(inv_id)["status"] == "pending"
    registry.approve(inv_id)
    await drain()
    inv = registry.get_invocation(inv_id)
    # sent once more (refused again: the budget of two sends is spent), never a third time
    assert upstream.hits["/slow"] == 2
    assert (inv["status"], inv["http_status"]) == ("failed", 429)
    assert [a["status_code"] for a in inv["attempts"]] == [429, None, 429]
