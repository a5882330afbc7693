"""Small builders for registry tests."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from toolrelay.db import Database
from toolrelay.registry import Registry, ToolSpec

ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


def add_tool(registry: Registry, key: str = "echo.get", **fields: Any) -> dict[str, Any]:
    spec = {
        "key": key,
        "name": key,
        "endpoint_url": "https://api.example.com/echo",
        "http_method": "GET",
        "egress_class": "read_only",
        "schema_input": ECHO_SCHEMA,
    } | fields
    return registry.register_tool(ToolSpec.from_mapping(spec))


def agent_with_tool(registry: Registry, **fields: Any) -> tuple[str, dict[str, Any]]:
    """An agent named 'bot' assigned one tool; returns (agent name, tool row)."""
    tool = add_tool(registry, **fields)
    registry.create_agent("bot")
    registry.assign("bot", tool["key"])
    return "bot", tool


def count_invocations(db: Database, owner: UUID) -> int:
    """How many calls ``owner``'s agents have made (each test's owner is its own)."""
    with db.connect(autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM agents.tool_invocations WHERE owner = %s", (owner,)
        ).fetchone()
    assert row is not None
    return int(row["n"])
