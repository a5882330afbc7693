"""`toolrelay import openapi FILE`: petstore.yaml becomes tools that dispatch correctly to a
loopback server; re-importing changes nothing; a broken file writes nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.interop.conftest import Owner
from toolrelay.credentials import CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker
from toolrelay.errors import InvalidArgument, NotFound
from toolrelay.export.openapi import tools_from_openapi
from toolrelay.registry import ToolSpec

PETSTORE = Path(__file__).with_name("petstore.yaml")
SECRET = "pk-live-7d2c9a41"
IMPORTED = ["petstore.createPet", "petstore.getPet", "petstore.get_health", "petstore.listPets"]


def petstore(upstream: Upstream) -> dict[str, Any]:
    """petstore.yaml with its server pointed at the upstream's port."""
    doc: dict[str, Any] = yaml.safe_load(PETSTORE.read_text())
    port = upstream.base_url.rsplit(":", 1)[1]
    doc["servers"][0]["variables"]["port"]["default"] = port
    return doc


def write(tmp_path: Path, doc: dict[str, Any], name: str = "api.yaml") -> Path:
    path = tmp_path / name
    path.write_text(
        yaml.safe_dump(doc, sort_keys=False) if name.endswith(".yaml") else json.dumps(doc)
    )
    return path


def credential(db: Database, owner: Owner, keyring: Keyring) -> str:
    store = CredentialStore(db, keyring)
    return str(store.add(owner.id, "api_key", "petstore", SECRET, ["127.0.0.1"]))


async def get_pet(request: web.Request, _hit: int) -> web.StreamResponse:
    return web.json_response({"id": 7, "name": "Rex", "tag": "dog"})


async def create_pet(request: web.Request, _hit: int) -> web.StreamResponse:
    body = await request.json()
    return web.json_response({"id": 8} | body, status=201)


def headers(seen: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in seen.headers.items()}


def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "updated_at"} for row in rows]


async def test_import_dispatch_reimport(
    owner: Owner,
    db: Database,
    upstream: Upstream,
    interop_keyring: Keyring,
    drain: Callable[[], Awaitable[Worker]],
    tmp_path: Path,
) -> None:
    cred = credential(db, owner, interop_keyring)
    path = write(tmp_path, petstore(upstream))
    result = owner.cli(
        "import", "openapi", str(path), "--credential", cred, "--prefix", "petstore."
    )
    assert result.exit_code == 0, result.output
    base = upstream.base_url
    assert result.stdout.splitlines() == [
        f"created petstore.getPet (GET {base}/v1/pets/{{{{input.petId}}}})",
        f"created petstore.listPets (GET {base}/v1/pets)",
        f"created petstore.createPet (POST {base}/v1/pets)",
        f"created petstore.get_health (GET {base}/v1/health)",
    ]
    assert result.stderr.splitlines() == [
        "skipped PUT /pets/{petId}/photo: its request body is image/png, not JSON or a form",
        "warning: GET /pets/{petId}: optional query parameter 'tags' dropped: it is an array"
        " or object (a query value must be a string, number or boolean)",
    ]
    tools = {row["key"]: row for row in owner.registry.list_tools()}
    assert sorted(tools) == IMPORTED

    get = tools["petstore.getPet"]
    assert (get["http_method"], get["egress_class"], get["requires_approval"]) == (
        "GET", "read_only", False,
    )  # fmt: skip
    assert (get["name"], get["description"], get["category"]) == (
        "Find a pet by id", "Returns one pet, with only the fields asked for.", "pets",
    )  # fmt: skip
    assert get["request_template"] == {
        "query": {"fields": "{{input.fields}}"},
        "headers": {"X-Request-Id": "{{input.X-Request-Id}}", "Accept": "application/json"},
    }
    assert get["schema_input"]["required"] == ["petId"]
    assert get["schema_input"]["properties"]["petId"] == {
        "type": "integer", "minimum": 1, "description": "The pet's id.",
    }  # fmt: skip
    assert get["schema_output"]["properties"]["tag"] == {"type": ["string", "null"]}
    auth = ("auth_method", "auth_placement", "auth_param_name", "auth_param_prefix")
    assert tuple(get[k] for k in auth) == ("api_key", "header", "X-API-Key", "")
    assert str(get["credential_ref"]) == cred

    create = tools["petstore.createPet"]
    assert (create["http_method"], create["egress_class"], create["requires_approval"]) == (
        "POST", "write", True,
    )  # fmt: skip
    assert create["request_template"] == {
        "headers": {"Accept": "application/json"},
        "body": {"name": "{{input.name}}", "tag": "{{input.tag}}"},
    }
    assert create["schema_input"]["required"] == ["name"]
    assert "id" not in create["schema_input"]["properties"]  # readOnly: not sent
    assert str(create["credential_ref"]) == cred

    health = tools["petstore.get_health"]  # x-openai-isConsequential: a GET that is a write
    assert (health["egress_class"], health["auth_method"], health["credential_ref"]) == (
        "write", "none", None,
    )  # fmt: skip
    assert tools["petstore.listPets"]["schema_input"]["properties"]["limit"] == {
        "type": "integer", "exclusiveMaximum": 100,
    }  # fmt: skip

    # the tools dispatch: path, query, header, body and the credential where the API wants it
    upstream.routes["/v1/pets/7"] = get_pet
    upstream.routes["/v1/pets"] = create_pet
    registry = owner.registry
    registry.create_agent("bot")
    for key in IMPORTED:
        registry.assign("bot", key)
    read = registry.invoke("bot", "petstore.getPet",
                           {"petId": 7, "fields": "name,tag", "X-Request-Id": "req-1"})  # fmt: skip
    made = registry.invoke("bot", "petstore.createPet", {"name": "Rex", "tag": "dog"})
    assert registry.get_invocation(made)["status"] == "pending"
    registry.approve(made)
    await drain()

    got, posted = (registry.get_invocation(i) for i in (read, made))
    assert (got["status"], got["output"]) == ("completed", {"id": 7, "name": "Rex", "tag": "dog"})
    assert got["output_mismatch"] is None
    assert (posted["status"], posted["output"]) == (
        "completed", {"id": 8, "name": "Rex", "tag": "dog"},
    )  # fmt: skip
    by_method = {seen.method: seen for seen in upstream.seen}
    assert sorted(by_method) == ["GET", "POST"] and len(upstream.seen) == 2
    sent_get, sent_post = by_method["GET"], by_method["POST"]
    assert sent_get.path == "/v1/pets/7"
    assert sent_get.query == {"fields": "name,tag"}
    assert sent_get.headers["X-API-Key"] == SECRET
    assert headers(sent_get)["x-request-id"] == "req-1"  # names are case-insensitive
    assert sent_post.path == "/v1/pets"
    assert sent_post.query == {}
    assert sent_post.body == {"name": "Rex", "tag": "dog"}
    assert sent_post.headers["X-API-Key"] == SECRET

    # importing again is idempotent: same tools, same ids, same configuration
    before = comparable(registry.list_tools())
    written = registry.list_tools()
    again = owner.cli("import", "openapi", str(path), "--credential", cred, "--prefix", "petstore.")
    assert again.exit_code == 0, again.output
    assert {line.split()[0] for line in again.stdout.splitlines()} == {"unchanged"}
    assert registry.list_tools() == written  # updated_at too: nothing was written
    # ... and without --credential the stored one is kept
    keep = owner.cli("import", "openapi", str(path), "--prefix", "petstore.")
    assert keep.exit_code == 0, keep.output
    assert comparable(registry.list_tools()) == before


def broken_documents(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(what, document, the error it gives) for documents that must write nothing."""
    cases: list[tuple[str, dict[str, Any], str]] = []

    bad_ref = copy.deepcopy(doc)  # the last operation is the broken one
    bad_ref["paths"]["/health"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"
    ] = {"$ref": "#/components/schemas/Nope"}
    cases.append(
        ("bad $ref", bad_ref, "GET /health: $ref '#/components/schemas/Nope' does not resolve")
    )

    duplicate = copy.deepcopy(doc)
    duplicate["paths"]["/health"]["get"]["operationId"] = "getPet"
    cases.append(
        ("duplicate key", duplicate, "GET /health: tool key 'getPet' is also GET /pets/{petId}'s")
    )

    relative = copy.deepcopy(doc)
    relative["servers"] = [{"url": "/v1"}]
    cases.append(("relative server", relative, "is not an absolute http(s) URL"))

    undeclared = copy.deepcopy(doc)
    del undeclared["paths"]["/pets/{petId}"]["parameters"]
    cases.append(
        ("undeclared path parameter", undeclared, "path parameter(s) ['petId'] are not declared")
    )

    swagger = {"swagger": "2.0", "paths": {}}
    cases.append(("swagger 2", swagger, "Swagger 2.0 is not supported"))

    bad_schema = copy.deepcopy(doc)
    bad_schema["components"]["schemas"]["NewPet"]["properties"]["name"]["minLength"] = "one"
    cases.append(
        (
            "invalid JSON Schema",
            bad_schema,
            "GET /pets/{petId} (tool getPet): schema_output is not a valid JSON Schema at properties/name/minLength",
        )
    )
    return cases  # fmt: skip


@pytest.mark.parametrize("case", range(6))
def test_with_strict_a_broken_document_gives_one_error_and_writes_nothing(
    case: int, owner: Owner, tmp_path: Path
) -> None:
    doc = yaml.safe_load(PETSTORE.read_text())
    what, broken, message = broken_documents(doc)[case]
    path = write(tmp_path, broken, "api.json")
    result = owner.cli("import", "openapi", str(path), "--strict")
    assert result.exit_code == 1, what
    assert result.stdout == "", what
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {path}: "), line
    assert message in line, line
    assert owner.registry.list_tools() == []


def test_unreadable_files_are_one_clear_error(owner: Owner, tmp_path: Path) -> None:
    missing = owner.cli("import", "openapi", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 1 and "cannot read" in missing.stderr
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("openapi: [3.0\n  paths: {")
    bad = owner.cli("import", "openapi", str(garbage))
    assert bad.exit_code == 1
    assert bad.stderr.startswith(f"error: {garbage}: not valid YAML or JSON at line ")
    assert owner.registry.list_tools() == []


def test_a_database_refusal_rolls_back_every_tool(owner: Owner, tmp_path: Path) -> None:
    """The credential does not exist: the last tool needing it fails in the database, after
    the first ones were written in the same transaction; none of them stays."""
    doc = yaml.safe_load(PETSTORE.read_text())
    path = write(tmp_path, doc)
    ghost = "00000000-0000-4000-8000-000000000000"
    result = owner.cli("import", "openapi", str(path), "--credential", ghost)
    assert result.exit_code == 1
    *notes, line = result.stderr.splitlines()
    assert all(n.startswith(("skipped ", "warning: ")) for n in notes), notes
    assert line.startswith("error: tool getPet: "), line
    assert owner.registry.list_tools() == []
    with pytest.raises(NotFound):
        owner.registry.get_tool("getPet")


def test_register_tools_names_the_tool_and_refuses_duplicates(owner: Owner) -> None:
    good = ToolSpec(key="a.one", name="One")
    with pytest.raises(InvalidArgument, match=r"\['a.one'\] appear more than once"):
        owner.registry.register_tools([good, good])
    bad = ToolSpec(key="a.two", name="Two", endpoint_url="ftp://x", http_method="GET")
    with pytest.raises(InvalidArgument, match="^tool a.two: endpoint_url .ftp://x. is not allowed"):
        owner.registry.register_tools([good, bad])
    assert owner.registry.list_tools() == []
    rows = owner.registry.register_tools([good])
    assert [row["key"] for row in rows] == ["a.one"]


# --- the mapping, without a database ------------------------------------------------------------


def document(**operation: Any) -> dict[str, Any]:
    op = {"operationId": "op", "responses": {"200": {"description": "ok"}}} | operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "servers": [{"url": "https://api.example.com/"}],
        "paths": {"/things": {"post": op}},
        "components": {"securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "basic": {"type": "http", "scheme": "basic"},
            "q": {"type": "apiKey", "in": "query", "name": "key"},
            "cookie": {"type": "apiKey", "in": "cookie", "name": "sid"},
        }},
    }  # fmt: skip


def only(doc: dict[str, Any]) -> ToolSpec:
    (spec,) = tools_from_openapi(doc).tools
    return spec


def json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


def test_an_array_body_is_the_body_member() -> None:
    spec = only(document(requestBody=json_body({"type": "array", "items": {"type": "string"}})))
    assert spec.request_template == {"body": "{{input.body}}"}
    assert spec.schema_input["properties"] == {
        "body": {"type": "array", "items": {"type": "string"}}
    }
    assert spec.schema_input["required"] == ["body"]
    assert spec.endpoint_url == "https://api.example.com/things"


def test_a_body_property_clashing_with_a_parameter_falls_back_to_the_body_member() -> None:
    body = json_body({"type": "object", "properties": {"id": {"type": "string"}}}, required=False)
    spec = only(document(requestBody=body, parameters=[
        {"name": "id", "in": "query", "schema": {"type": "string"}},
    ]))  # fmt: skip
    assert spec.request_template == {"query": {"id": "{{input.id}}"}, "body": "{{input.body}}"}
    assert "required" not in spec.schema_input


@pytest.mark.parametrize(
    ("security", "expected"),
    [
        ([{"bearer": []}], ("api_key", "header", "Authorization", "Bearer ")),
        ([{"basic": []}, {"q": []}], ("basic", "header", "Authorization", None)),
        ([{"cookie": []}, {"q": []}], ("api_key", "query", "key", "")),
        ([{"cookie": []}, {}], ("none", None, None, None)),
    ],
)
def test_security_schemes(security: list[Any], expected: tuple[Any, ...]) -> None:
    spec = only(document(security=security))
    placed = (spec.auth_method, spec.auth_placement, spec.auth_param_name, spec.auth_param_prefix)
    assert placed == expected


def test_operations_toolrelay_cannot_express_are_skipped_with_the_reason() -> None:
    doc = document(security=[{"cookie": []}])
    doc["paths"]["/other"] = {"get": {"operationId": "other", "responses": {}}}
    plan = tools_from_openapi(doc)
    assert [s.key for s in plan.tools] == ["other"]
    assert plan.skipped == [
        "POST /things: its security (cookie) needs a scheme toolrelay cannot place"
        " (an apiKey in a cookie, an HTTP scheme other than bearer and basic, mutual TLS, or"
        " several schemes at once)"
    ]
    with pytest.raises(InvalidArgument, match="no operation toolrelay can import"):
        tools_from_openapi(document(security=[{"cookie": []}]))


def test_parameter_names_become_template_safe_input_members() -> None:
    spec = only(document(parameters=[
        {"name": "filter[status]", "in": "query", "required": True, "schema": {"type": "string"}},
    ]))  # fmt: skip
    assert spec.request_template == {"query": {"filter[status]": "{{input.filter_status_}}"}}
    assert spec.schema_input["required"] == ["filter_status_"]


def test_the_key_prefix_and_a_key_without_operation_id() -> None:
    doc = document()
    del doc["paths"]["/things"]["post"]["operationId"]
    plan = tools_from_openapi(doc, key_prefix="ex.")
    assert [s.key for s in plan.tools] == ["ex.post_things"]
    with pytest.raises(InvalidArgument, match="is not valid"):
        tools_from_openapi(document(), key_prefix="-bad")


def test_dry_run_writes_nothing_and_prints_a_tool_apply_file(
    owner: Owner, tmp_path: Path, upstream: Upstream
) -> None:
    path = write(tmp_path, petstore(upstream))
    dry = owner.cli("import", "openapi", str(path), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert owner.registry.list_tools() == []
    plan = yaml.safe_load(dry.stdout)
    assert [t["key"] for t in plan["tools"]] == ["getPet", "listPets", "createPet", "get_health"]
    tool_file = tmp_path / "tools.yaml"
    tool_file.write_text(dry.stdout)
    applied = owner.cli("tool", "apply", str(tool_file))
    assert applied.exit_code == 0, applied.output
    imported_elsewhere = owner.cli("import", "openapi", str(path))  # the same tools, by key
    assert imported_elsewhere.exit_code == 0, imported_elsewhere.output
    assert sorted(row["key"] for row in owner.registry.list_tools()) == [
        "createPet", "getPet", "get_health", "listPets",
    ]  # fmt: skip
