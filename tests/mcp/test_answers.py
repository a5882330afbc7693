"""What tools/call and toolrelay_invocation_status answer in every state, against the real
database and worker, through the SDK's in-process client (the transports are covered in
test_transports.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError

from tests.mcp.conftest import World
from toolrelay.errors import ConfigurationError
from toolrelay.mcp.server import (
    META_INVOCATION,
    STATUS_TOOL,
    McpSettings,
    annotations_for,
    input_schema_for,
    mcp_tool,
    output_schema_for,
)
from toolrelay.registry import ToolSpec

Make = Callable[..., Client]


def text_of(result: Any) -> str:
    (block,) = result.content
    return str(block.text)


async def test_invalid_input_is_a_tool_error_naming_where(inproc: Make) -> None:
    async with inproc() as client:
        result = await client.call_tool("weather.current", {"city": ""})
    assert result.is_error is True
    assert text_of(result).startswith("invalid_input: input.city:")
    assert result.meta is not None
    assert result.meta[META_INVOCATION]["error_code"] == "invalid_input"


@pytest.mark.parametrize(
    "name", ["secret.unassigned", "notes.denied", "notes.disabled", "no.such.tool"]
)
async def test_tools_the_agent_may_not_call_are_unknown(inproc: Make, name: str) -> None:
    async with inproc() as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert name not in listed
        with pytest.raises(MCPError, match=f"Unknown tool: {name}"):
            await client.call_tool(name, {})


async def test_a_failed_call_is_an_error_with_its_code_and_message(inproc: Make) -> None:
    async with inproc() as client:
        result = await client.call_tool("weather.current", {"city": "Atlantis"})
    assert result.is_error is True
    assert result.meta is not None
    invocation = result.meta[META_INVOCATION]
    assert (invocation["status"], invocation["error_code"]) == ("failed", "http_error")
    assert text_of(result).startswith("The call to weather.current failed (http_error): ")
    assert "500" in text_of(result)


async def test_output_not_matching_the_output_schema_is_reported_not_hidden(
    inproc: Make,
) -> None:
    async with inproc() as client:
        result = await client.call_tool("weather.current", {"city": "Nowhere"})
    assert result.is_error is True  # so clients do not reject it against outputSchema
    assert result.structured_content is None
    assert "does not match the tool's outputSchema" in text_of(result)
    assert '"warm"' in text_of(result)
    assert result.meta is not None
    assert result.meta[META_INVOCATION]["status"] == "completed"


async def test_a_slow_call_answers_still_running_within_the_bound(
    inproc: Make, world: World
) -> None:
    started = time.monotonic()
    async with inproc(wait_seconds=0.5) as client:
        result = await client.call_tool("weather.current", {"city": "Slowtown"})
        assert time.monotonic() - started < 1.9
        # not an error (issue 15): a status the declared outputSchema admits, and the text
        # says it is running and how to learn the outcome
        assert result.is_error is False
        assert result.meta is not None
        invocation = result.meta[META_INVOCATION]
        assert invocation["status"] == "running"
        assert "still running" in text_of(result)
        assert STATUS_TOOL in text_of(result)
        done = await client.call_tool(
            STATUS_TOOL, {"invocation_id": invocation["invocation_id"], "wait_seconds": 10}
        )
    assert done.is_error is False
    assert done.structured_content is not None
    assert done.structured_content["status"] == "completed"
    assert done.structured_content["output"] == {"city": "Slowtown", "temperature_c": 21.5}


async def test_a_rejected_call_reports_the_reason(inproc: Make, world: World) -> None:
    async with inproc() as client:
        pending = await client.call_tool("notes.create", {"text": "spam"})
        assert pending.meta is not None
        ident = pending.meta[META_INVOCATION]["invocation_id"]
        await asyncio.to_thread(world.registry.reject, ident, "not today")
        result = await client.call_tool(STATUS_TOOL, {"invocation_id": ident})
    assert result.is_error is True
    assert result.structured_content is not None
    assert result.structured_content["status"] == "rejected"
    assert "A human rejected the call to notes.create" in text_of(result)
    assert "not today" in text_of(result)
    assert not [s for s in world.requests_to("/notes") if s.body == {"text": "spam"}]


async def test_status_of_someone_elses_or_a_malformed_invocation(
    inproc: Make, world: World
) -> None:
    other = await asyncio.to_thread(
        world.registry.invoke, "other-bot", "weather.current", {"city": "Oslo"}
    )
    async with inproc() as client:
        foreign = await client.call_tool(STATUS_TOOL, {"invocation_id": str(other)})
        unknown = await client.call_tool(STATUS_TOOL, {"invocation_id": str(uuid.uuid4())})
        malformed = await client.call_tool(STATUS_TOOL, {"invocation_id": "42"})
        negative = await client.call_tool(
            STATUS_TOOL, {"invocation_id": str(other), "wait_seconds": -1}
        )
    for result in (foreign, unknown):
        assert result.is_error is True
        assert text_of(result).startswith("not_found: invocation ")
    assert text_of(foreign).count(str(other)) == 1  # the id asked about, nothing of its content
    assert malformed.is_error is True and "not an invocation id" in text_of(malformed)
    assert negative.is_error is True and "wait_seconds" in text_of(negative)


async def test_a_tool_disabled_after_listing_is_unknown_to_calls(
    inproc: Make, world: World
) -> None:
    async with inproc() as client:
        assert "weather.current" in {t.name for t in (await client.list_tools()).tools}
        await asyncio.to_thread(world.registry.set_tool_status, "weather.current", "disabled")
        with pytest.raises(MCPError, match="Unknown tool"):
            await client.call_tool("weather.current", {"city": "Rome"})


async def test_a_registry_tool_named_like_the_status_tool_is_shadowed(
    inproc: Make, world: World
) -> None:
    await asyncio.to_thread(
        world.registry.register_tool,
        ToolSpec(key=STATUS_TOOL, name="impostor", endpoint_url="https://example.com/x",
                 http_method="GET", egress_class="read_only"),
    )  # fmt: skip
    await asyncio.to_thread(world.registry.assign, "bot", STATUS_TOOL)
    async with inproc() as client:
        tools = [t for t in (await client.list_tools()).tools if t.name == STATUS_TOOL]
    assert len(tools) == 1 and tools[0].title == "Invocation status"


# --- definitions, without a database -------------------------------------------------------------


def row(**fields: Any) -> dict[str, Any]:
    return {"key": "a.b", "name": "A", "description": None, "schema_input": {},
            "schema_output": {}, "egress_class": "write", "gated": True} | fields  # fmt: skip


@pytest.mark.parametrize(
    ("egress", "hints"),
    [
        ("read_only", {"read_only_hint": True, "destructive_hint": False, "open_world_hint": True}),
        ("write", {"read_only_hint": False, "destructive_hint": True, "open_world_hint": True}),
        ("none", {"read_only_hint": True, "destructive_hint": None, "open_world_hint": False}),
    ],
)
def test_annotations_of_ungated_tools_follow_egress_class(
    egress: str, hints: dict[str, Any]
) -> None:
    annotations = annotations_for(row(egress_class=egress, gated=False))
    assert annotations.title == "A"
    for hint, value in hints.items():
        assert getattr(annotations, hint) == value


def test_output_schema_only_for_object_schemas_with_properties_of_ungated_tools() -> None:
    with_properties = {"type": "object", "properties": {"x": {"type": "integer"}}}
    assert output_schema_for(row(schema_output=with_properties, gated=False)) == with_properties
    assert output_schema_for(row(schema_output=with_properties, gated=True)) is None
    assert output_schema_for(row(schema_output={"type": "object"}, gated=False)) is None
    assert output_schema_for(row(schema_output={"type": "array"}, gated=False)) is None
    assert output_schema_for(row(schema_output={}, gated=False)) is None


def test_input_schema_gets_type_object_and_keys_keep_their_dots() -> None:
    assert input_schema_for(row()) == {"type": "object"}
    schema = {"properties": {"q": {"type": "string"}}}
    assert input_schema_for(row(schema_input=schema)) == {"type": "object"} | schema
    tool = mcp_tool(row(key="postiz.create_post", description="Post it"))
    assert tool.name == "postiz.create_post"
    assert tool.description == "Post it"
    assert mcp_tool(row()).description == "A"  # falls back to the name


def test_wait_bound_is_configurable_and_checked() -> None:
    assert McpSettings.from_env({}).wait_seconds == 30.0
    assert McpSettings.from_env({"TOOLRELAY_MCP_WAIT_SECONDS": "5"}).wait_seconds == 5.0
    with pytest.raises(ConfigurationError, match="not a number"):
        McpSettings.from_env({"TOOLRELAY_MCP_WAIT_SECONDS": "soon"})
    with pytest.raises(ConfigurationError, match="between 0 and 300"):
        McpSettings(wait_seconds=301)
