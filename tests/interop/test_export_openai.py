"""`toolrelay export openai --agent ID`: the agent's tools as function-calling definitions."""

from __future__ import annotations

import json

import pytest

from tests.interop.conftest import Owner
from toolrelay.errors import InvalidArgument
from toolrelay.export.openai import openai_name, openai_names, openai_tools
from toolrelay.registry import ToolSpec

SEARCH_INPUT = {
    "type": "object",
    "properties": {"q": {"type": "string"}, "limit": {"type": "integer", "maximum": 50}},
    "required": ["q"],
}


def register(owner: Owner, key: str, **fields: object) -> None:
    values = {"key": key, "name": key.title(), "endpoint_url": "https://api.example.com/x",
              "http_method": "GET", "egress_class": "read_only"} | fields  # fmt: skip
    owner.registry.register_tool(ToolSpec.from_mapping(values))


def test_export_lists_exactly_the_assigned_active_tools(owner: Owner) -> None:
    register(owner, "search.web", description="Search the web.", schema_input=SEARCH_INPUT)
    register(owner, "postiz.create_post", name="Postiz: Create Post", http_method="POST",
             egress_class="write")  # fmt: skip
    register(owner, "plain")
    register(owner, "not.assigned")
    register(owner, "off.tool")
    register(owner, "denied.tool")
    agent_id = owner.registry.create_agent("bot")
    for key in ("search.web", "postiz.create_post", "plain", "off.tool"):
        owner.registry.assign("bot", key)
    owner.registry.assign("bot", "denied.tool", allowed=False)
    owner.registry.set_tool_status("off.tool", "disabled")

    by_name = owner.cli("export", "openai", "--agent", "bot")
    assert by_name.exit_code == 0, by_name.output
    by_id = owner.cli("export", "openai", "--agent", str(agent_id))
    assert by_id.stdout == by_name.stdout
    exported = json.loads(by_name.stdout)
    assert exported == [
        {
            "type": "function",
            "function": {
                "name": "plain",
                "description": "Plain",  # no description: the name
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "postiz__create_post",
                "description": "Postiz: Create Post",
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "search__web",
                "description": "Search the web.",
                "parameters": SEARCH_INPUT,
            },
        },
    ]


def test_export_errors_are_one_line(owner: Owner) -> None:
    unknown = owner.cli("export", "openai", "--agent", "ghost")
    assert unknown.exit_code == 1
    assert unknown.stderr == "error: agent ghost not found\n"
    register(owner, "a.b")
    register(owner, "a__b")
    owner.registry.create_agent("bot")
    owner.registry.assign("bot", "a.b")
    owner.registry.assign("bot", "a__b")
    clash = owner.cli("export", "openai", "--agent", "bot")
    assert clash.exit_code == 1
    assert "both become the OpenAI function name 'a__b'" in clash.stderr
    assert clash.stdout == ""


def test_names_map_dots_and_are_checked() -> None:
    assert openai_name("postiz.create_post") == "postiz__create_post"
    assert openai_name("a-b_c") == "a-b_c"
    with pytest.raises(InvalidArgument, match="at most 64"):
        openai_name("x" * 65)
    assert openai_names(["x.y", "x__z"]) == {"x__y": "x.y", "x__z": "x__z"}
    # the reverse mapping is the table, not a string replacement
    assert openai_names(["my__tool"]) == {"my__tool": "my__tool"}
    tools = openai_tools([{"key": "k.v", "name": "K", "schema_input": {"type": "object"}}])
    assert tools[0]["function"]["parameters"] == {"type": "object", "properties": {}}
