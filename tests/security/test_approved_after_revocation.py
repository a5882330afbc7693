"""A call waiting for approval is not sent once its agent may no longer make it.

An owner who sees an agent misbehave revokes (or denies) its tool, or disables the tool,
while its calls wait for approval; an approver who then approves one of them (from an older
page, a bulk approval, a chat link) must not send it. Decided at the claim, against the
assignment and the tool as they are then (`precheck`), not as they were at the call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r, agent, key: r.revoke(agent, key), "assignment of notes.create was revoked"),
        (lambda r, agent, key: r.assign(agent, key, allowed=False), "was denied"),
        (lambda r, agent, key: r.set_tool_status(key, "disabled"), "is disabled"),
        (lambda r, agent, key: r.set_tool_status(key, "deprecated"), "is deprecated"),
    ],
    ids=["revoked", "denied", "tool_disabled", "tool_deprecated"],
)
async def test_an_approval_after_the_agent_lost_the_tool_sends_nothing(
    registry: Registry,
    upstream: Upstream,
    drain: Drain,
    change: Callable[[Registry, str, str], object],
    says: str,
) -> None:
    agent, tool = agent_with_tool(
        registry, key="notes.create", endpoint_url=f"{upstream.base_url}/notes",
        http_method="POST", egress_class="write",
    )  # fmt: skip
    call = registry.invoke(agent, tool["key"], {"text": "x"})
    assert registry.get_invocation(call)["status"] == "pending"
    change(registry, agent, tool["key"])
    registry.approve(call)
    await drain()
    done = registry.get_invocation(call)
    assert done["status"] == "failed" and says in done["error"], done["error"]
    assert done["error_code"] in ("not_assigned", "tool_inactive")
    assert upstream.seen == []
