"""Registering tools again says what it did, and writes nothing for a tool that did not
change (migration 0041): before, `tool apply` of the same file bumped every tool's
updated_at and told every agent holding one that its tool list had changed, and an import
reported a hand-made tool it overwrote as "imported", like a new one."""

from __future__ import annotations

from dataclasses import replace

from toolrelay.registry import Registry, ToolSpec

SPEC = ToolSpec.from_mapping({
    "key": "a.get", "name": "a", "endpoint_url": "https://api.example.com/a",
    "http_method": "GET", "egress_class": "read_only", "max_concurrency": 4,
})  # fmt: skip


def test_register_tools_says_created_updated_or_unchanged(registry: Registry) -> None:
    (created,) = registry.register_tools([SPEC])
    assert (created["change"], created["changed"]) == ("created", [])
    (same,) = registry.register_tools([SPEC])
    assert (same["change"], same["changed"]) == ("unchanged", [])
    assert same["updated_at"] == created["updated_at"]  # nothing written
    moved = replace(SPEC, endpoint_url="https://api.example.com/b", description="moved")
    (updated,) = registry.register_tools([moved])
    assert (updated["change"], updated["changed"]) == ("updated", ["description", "endpoint_url"])
    assert updated["updated_at"] > created["updated_at"]
    (limited,) = registry.register_tools([replace(moved, max_concurrency=2)])
    assert (limited["change"], limited["changed"]) == ("updated", ["max_concurrency"])


def test_an_unchanged_tool_is_not_news_to_its_agents(registry: Registry) -> None:
    registry.register_tools([SPEC])
    registry.create_agent("bot")
    registry.assign("bot", "a.get")
    as_agent = Registry(registry.db, registry.owner, agent_id=registry.get_agent("bot")["id"])
    stamp = as_agent.tools_stamp()
    registry.register_tools([SPEC])  # the same file applied again
    registry.update_tool("a.get", {"name": "a"})  # a PATCH with the value it has
    assert as_agent.tools_stamp() == stamp
    registry.update_tool("a.get", {"name": "renamed"})
    assert as_agent.tools_stamp() != stamp
