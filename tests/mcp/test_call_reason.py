"""tools/call's ``_meta["toolrelay/reason"]``: the agent's stated reason, kept with the call
(issue 16, item 5; docs/mcp.md)."""

from __future__ import annotations

from tests.mcp.conftest import World
from tests.mcp.test_spec_items import Make
from toolrelay.mcp.server import REASON_META
from toolrelay.registry import Registry


async def test_the_reason_in_meta_is_kept_with_the_call(inproc: Make, world: World) -> None:
    async with inproc() as client:
        pending = await client.call_tool(
            "notes.create", {"text": "hello"}, meta={REASON_META: "the user asked for it"}
        )
        bare = await client.call_tool("notes.create", {"text": "again"})
    ids = [r.structured_content["invocation_id"] for r in (pending, bare) if r.structured_content]
    owner = Registry(world.db, world.caller.owner)
    assert [owner.get_invocation(i)["reason"] for i in ids] == ["the user asked for it", None]
