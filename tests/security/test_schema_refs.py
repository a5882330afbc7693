"""Finding 1 of issue 12: nothing in a tool's schema reaches the network or the filesystem.

Remote and file references (``$ref``, ``$dynamicRef``, a base changed by ``$id``, ``$schema``)
are refused at registration with the JSON Pointer of the keyword. A schema stored past
registration (plain SQL as the owner) is refused again wherever it is applied — invoke, the
worker's precheck and output check, MCP — and never fetched: a counting loopback server
(on its own thread) sees no request, and no file is opened.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from psycopg.types.json import Jsonb
from referencing.exceptions import NoSuchResource

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool, agent_with_tool
from tests.security.tripwires import CountingServer, io_events
from toolrelay.dispatch.worker import Worker
from toolrelay.errors import InvalidArgument, InvalidInput
from toolrelay.mcp.server import invocation_result, mcp_tool
from toolrelay.registry import Registry
from toolrelay.registry.schemas import REGISTRY
from toolrelay.registry.validation import check_json_schema, validate_input, validator

Drain = Callable[..., Awaitable[Worker]]
OUTSIDE = "is outside the schema; only references inside the document ('#…') are allowed"


@pytest.fixture
def counter() -> Iterator[CountingServer]:
    server = CountingServer()
    yield server
    server.close()


@pytest.fixture
def marker_file(tmp_path: Path) -> tuple[Path, str]:
    """A schema file whose text would show in an error if it were ever read and applied."""
    marker = f"MARKER-{uuid.uuid4().hex}"
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"const": marker}))
    return path, marker


def with_ref(ref: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": {"$ref": ref}}}


def store_past_registration(registry: Registry, key: str, column: str, schema: Any) -> None:
    """What plain SQL as the owner can do: no application check runs."""
    with registry.db.as_owner(registry.owner) as conn:
        conn.execute(
            f"UPDATE agents.tools_registry SET {column} = %s WHERE key = %s", (Jsonb(schema), key)
        )


def register_in_sql(registry: Registry, key: str, endpoint: str, **schemas: Any) -> None:
    with registry.db.as_owner(registry.owner) as conn:
        conn.execute(
            "SELECT fn_register_tool(p_key => %s, p_name => %s, p_endpoint_url => %s,"
            " p_http_method => 'GET', p_egress_class => 'read_only',"
            " p_schema_input => %s, p_schema_output => %s)",
            (
                key,
                key,
                endpoint,
                Jsonb(schemas.get("schema_input", {})),
                Jsonb(schemas.get("schema_output", {})),
            ),
        )


def files_opened(events: list[tuple[str, tuple[Any, ...]]], path: Path) -> list[Any]:
    return [args for event, args in events if event == "open" and str(path) in str(args[0])]


# --- registration -------------------------------------------------------------------------


@pytest.mark.parametrize("column", ["schema_input", "schema_output"])
def test_remote_ref_is_refused_at_registration_naming_the_pointer(
    registry: Registry, counter: CountingServer, column: str
) -> None:
    url = counter.url("/x.json")
    with pytest.raises(InvalidArgument) as info:
        add_tool(registry, **{column: with_ref(url)})
    assert info.value.message == f"{column} at /properties/x/$ref: reference '{url}' {OUTSIDE}"
    assert registry.list_tools() == []  # nothing written

    add_tool(registry)
    with pytest.raises(InvalidArgument, match=r"at /properties/x/\$ref: reference"):
        registry.update_tool("echo.get", {column: with_ref(url)})
    assert counter.requests == []


@pytest.mark.parametrize(
    ("schema", "pointer", "says"),
    [
        ({"$id": "{url}/root.json", "properties": {"a": {"$ref": "other.json"}}},
         "/properties/a/$ref", "reference 'other.json' ({url}/other.json) " + OUTSIDE),
        ({"allOf": [{"$ref": "//127.0.0.1:{port}/x"}]}, "/allOf/0/$ref", OUTSIDE),
        ({"$defs": {"d": {"$dynamicRef": "{url}/meta#meta"}}}, "/$defs/d/$dynamicRef", OUTSIDE),
        ({"items": {"$ref": "{url}/items.json#/definitions/x"}}, "/items/$ref", OUTSIDE),
        # a reference into a place no keyword applies is followed there, and checked there
        ({"x-lib": {"$ref": "{url}/lib.json"}, "$ref": "#/x-lib"}, "/x-lib/$ref", OUTSIDE),
        ({"$schema": "{url}/meta"}, "/$schema", "unknown $schema '{url}/meta'"),
        ({"$defs": {"d": {"$schema": "http://json-schema.org/draft-07/schema#"}}},
         "/$defs/d/$schema", "$schema is only allowed at the root"),
        ({"$schema": "https://json-schema.org/draft/2019-09/schema", "$recursiveRef": "{url}/"},
         "/$recursiveRef", "only '#' is allowed"),
        ({"properties": {"x": {"$ref": "#/$defs/missing"}}}, "/properties/x/$ref",
         "reference '#/$defs/missing' does not resolve inside the schema"),
        ({"$ref": "https://json-schema.org/draft/2020-12/schema"}, "/$ref", OUTSIDE),
    ],
)  # fmt: skip
def test_references_leaving_the_document_are_refused(
    counter: CountingServer, schema: dict[str, Any], pointer: str, says: str
) -> None:
    port = counter.base_url.rsplit(":", 1)[1]
    text = json.dumps(schema).replace("{url}", counter.base_url).replace("{port}", port)
    with pytest.raises(InvalidArgument) as info:
        check_json_schema("schema_input", json.loads(text))
    message = info.value.message
    assert message.startswith(f"schema_input at {pointer}: "), message
    assert says.replace("{url}", counter.base_url) in message
    assert counter.requests == []


def test_file_refs_are_refused_and_never_read(
    registry: Registry, marker_file: tuple[Path, str]
) -> None:
    path, marker = marker_file
    schemas = [
        with_ref(path.as_uri()),
        with_ref(f"file://localhost{path}"),
        with_ref(f"{path.as_uri()}#/const"),
        {"$id": f"{path.parent.as_uri()}/", "properties": {"x": {"$ref": path.name}}},
    ]
    with io_events() as events:
        for schema in schemas:
            with pytest.raises(InvalidArgument) as info:
                add_tool(registry, schema_input=schema)
            assert "/properties/x/$ref" in info.value.message and OUTSIDE in info.value.message
            assert marker not in info.value.message
            compiled = validator(schema)
            errors = [e.message for e in compiled.iter_errors({"x": "anything"})]
            assert compiled.refusal is not None and errors
            assert all(marker not in e for e in errors)
    assert files_opened(events, path) == []


# --- past registration: refused where applied, never fetched ------------------------------


async def test_stored_remote_schema_input_is_never_fetched_on_invoke_or_dispatch(
    registry: Registry, upstream: Upstream, drain: Drain, counter: CountingServer
) -> None:
    url = counter.url("/input.json")
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/echo")
    queued = registry.invoke(agent, tool["key"], {"text": "made before the schema went bad"})
    store_past_registration(registry, tool["key"], "schema_input", with_ref(url))

    with pytest.raises(InvalidInput) as info:
        registry.invoke(agent, tool["key"], {"x": "y"})
    assert "schema_input at /properties/x/$ref" in info.value.message
    assert OUTSIDE in info.value.message

    await drain()
    inv = registry.get_invocation(queued)
    assert (inv["status"], inv["error_code"]) == ("failed", "invalid_input")
    assert "schema_input at /properties/x/$ref" in inv["error"]
    assert upstream.seen == []  # refused before sending
    assert counter.requests == []


async def test_stored_remote_schema_output_is_never_fetched_and_nothing_is_sent(
    registry: Registry, upstream: Upstream, drain: Drain, counter: CountingServer
) -> None:
    url = counter.url("/output.json")
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/echo")
    store_past_registration(registry, tool["key"], "schema_output", with_ref(url))
    inv_id = registry.invoke(agent, tool["key"], {"text": "hi"})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "schema_error")
    assert "at /properties/x/$ref" in inv["error"] and OUTSIDE in inv["error"]
    assert upstream.seen == []  # refused before anything left: a bad tool sends nothing

    # MCP checks the same output against the same schema when it answers tools/call.
    answer = invocation_result(inv, with_ref(url), 0.0)
    assert answer.is_error
    assert counter.requests == []


async def test_tool_registered_in_plain_sql_with_file_refs_never_reads_them(
    registry: Registry,
    upstream: Upstream,
    drain: Drain,
    marker_file: tuple[Path, str],
) -> None:
    path, marker = marker_file

    async def answer(_: web.Request, _hit: int) -> web.Response:
        return web.json_response({"x": "from upstream"})

    upstream.routes["/file"] = answer
    register_in_sql(
        registry, "file.in", f"{upstream.base_url}/file", schema_input=with_ref(path.as_uri())
    )
    register_in_sql(
        registry, "file.out", f"{upstream.base_url}/file", schema_output=with_ref(path.as_uri())
    )
    registry.create_agent("bot")
    registry.assign("bot", "file.in")
    registry.assign("bot", "file.out")

    with io_events() as events:
        with pytest.raises(InvalidInput) as info:
            registry.invoke("bot", "file.in", {"x": "y"})
        inv_id = registry.invoke("bot", "file.out", {})
        await drain()
    assert marker not in info.value.message
    inv = registry.get_invocation(inv_id)
    assert (inv["status"], inv["error_code"]) == ("failed", "schema_error")
    assert OUTSIDE in inv["error"] and marker not in inv["error"]
    assert files_opened(events, path) == []


async def test_stored_remote_dollar_schema_is_never_fetched(
    registry: Registry, upstream: Upstream, drain: Drain, counter: CountingServer
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/echo")
    queued = registry.invoke(agent, tool["key"], {})
    meta = counter.url("/meta")
    store_past_registration(registry, tool["key"], "schema_input", {"$schema": meta})
    with pytest.raises(InvalidInput, match=r"schema_input at /\$schema: unknown \$schema"):
        registry.invoke(agent, tool["key"], {})
    await drain()
    inv = registry.get_invocation(queued)
    assert (inv["status"], inv["error_code"]) == ("failed", "invalid_input")
    assert upstream.seen == [] and counter.requests == []


# --- what keeps working -------------------------------------------------------------------


def test_remote_id_alone_fetches_nothing_and_validates(counter: CountingServer) -> None:
    schema = {
        "$id": counter.url("/root.json"),
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/a"}, "b": {"$ref": "#b"}},
        "$defs": {"a": {"type": "string"}, "b": {"$anchor": "b", "type": "integer"}},
    }
    check_json_schema("schema_input", schema)
    with io_events() as events:
        validate_input(schema, {"a": "ok", "b": 1})
        with pytest.raises(InvalidInput, match=r"input\.a: 1 is not of type 'string'"):
            validate_input(schema, {"a": 1})
        with pytest.raises(InvalidInput, match=r"input\.b: 'x' is not of type 'integer'"):
            validate_input(schema, {"b": "x"})
    assert events == [] and counter.requests == []


def test_in_document_id_and_ref_pair_resolves_inside() -> None:
    schema = {
        "$id": "https://example.com/root.json",
        "$defs": {"A": {"$id": "a.json", "type": "string"}},
        "properties": {"x": {"$ref": "a.json"}, "y": {"$ref": "https://example.com/a.json"}},
    }
    check_json_schema("schema_input", schema)
    with io_events() as events:
        validate_input(schema, {"x": "s", "y": "t"})
        with pytest.raises(InvalidInput, match=r"input\.y: 1 is not of type 'string'"):
            validate_input(schema, {"y": 1})
    assert events == []


def test_dynamic_and_recursive_refs_inside_the_document_work() -> None:
    tree_2020 = {
        "$dynamicAnchor": "node",
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$dynamicRef": "#node"}}},
        "required": ["name"],
    }
    tree_2019 = {
        "$schema": "https://json-schema.org/draft/2019-09/schema",
        "$recursiveAnchor": True,
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$recursiveRef": "#"}}},
        "required": ["name"],
    }
    for schema in (tree_2020, tree_2019):
        check_json_schema("schema_input", schema)
        with io_events() as events:
            validate_input(schema, {"name": "a", "children": [{"name": "b", "children": []}]})
            with pytest.raises(InvalidInput, match=r"input\.children\[0\]: 'name' is a required"):
                validate_input(schema, {"name": "a", "children": [{}]})
        assert events == []


@pytest.mark.parametrize(
    "uri",
    [
        "http://json-schema.org/draft-07/schema#",
        "http://json-schema.org/draft-07/schema",
        "https://json-schema.org/draft/2020-12/schema",
        "http://json-schema.org/draft-04/schema#",
    ],
)
def test_known_drafts_keep_working_offline(uri: str) -> None:
    schema = {"$schema": uri, "type": "object", "properties": {"n": {"type": "integer"}}}
    with io_events() as events:
        check_json_schema("schema_input", schema)
        with pytest.raises(InvalidInput, match=r"input\.n: 'x' is not of type 'integer'"):
            validate_input(schema, {"n": "x"})
    assert events == []


def test_the_registry_schemas_compile_against_never_retrieves(counter: CountingServer) -> None:
    """The second line: past the check, what compiled schemas resolve against has the
    metaschemas in memory and refuses anything else."""
    assert REGISTRY.get_or_retrieve("https://json-schema.org/draft/2020-12/schema").value
    for uri in (counter.url("/x.json"), "file:///etc/passwd", "x.json"):
        with io_events() as events, pytest.raises(NoSuchResource):
            REGISTRY.get_or_retrieve(uri)
        assert events == []
    assert counter.requests == []


def test_mcp_never_hands_a_client_a_schema_with_a_remote_reference() -> None:
    """A client that validates against inputSchema/outputSchema could fetch it itself."""
    remote = with_ref("http://127.0.0.1:9/schema.json")
    row = {"key": "t.x", "name": "X", "schema_input": remote, "schema_output": remote,
           "egress_class": "read_only", "gated": False}  # fmt: skip
    tool = mcp_tool(row)
    assert tool.input_schema == {"type": "object"}
    assert tool.output_schema is None
    assert "127.0.0.1:9" not in tool.model_dump_json()
    assert "127.0.0.1:9" not in mcp_tool(row | {"gated": True}).model_dump_json()
