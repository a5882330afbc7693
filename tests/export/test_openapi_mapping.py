"""`toolrelay import openapi`: the mappings the corpus (test_openapi_corpus.py) found wrong or
missing, each on a small document shaped like the real one it came from."""

from __future__ import annotations

import json
import uuid
from typing import Any

from tests.interop.test_import_robust import api, ok
from toolrelay.dispatch.executor import build_request
from toolrelay.export.openapi import OUTPUT_SCHEMA_BUDGET, tools_from_openapi
from toolrelay.registry import ToolSpec


def param(name: str, where: str, required: bool = False, **schema: Any) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": schema or {"type": "string"}}


def tool(doc: dict[str, Any], key: str) -> ToolSpec:
    plan = tools_from_openapi(doc)
    return next(spec for spec in plan.tools if spec.key == key)


def skipped(doc: dict[str, Any]) -> list[str]:
    return tools_from_openapi(doc).skipped


def render(spec: ToolSpec, value: dict[str, Any]) -> Any:
    row = spec.as_dict() | {"id": uuid.uuid4(), "input": value}
    row["auth_placement"] = spec.auth_placement or "header"  # the database's defaults
    row["auth_param_name"] = spec.auth_param_name or "Authorization"
    return build_request(row)


def json_body(schema: dict[str, Any], required: bool = True, kind: str = "application/json") -> Any:
    return {"required": required, "content": {kind: {"schema": schema}}}


def test_a_fragment_in_the_path_key_is_not_sent() -> None:
    """Box: ``PUT /files/{file_id}#add_shared_link`` is PUT /files/{file_id}."""
    doc = api({"/files/{id}#share": {"put": ok("share", parameters=[param("id", "path")])}})
    spec = tool(doc, "share")
    assert spec.endpoint_url == "https://api.example.com/files/{{input.id}}"
    assert render(spec, {"id": "a/b"}).url == "https://api.example.com/files/a%2Fb"


def test_a_query_parameter_named_like_a_path_parameter_gets_its_location_first() -> None:
    """Kubernetes' ``/proxy/{path}?path=``, SendGrid's ``list_id``."""
    params = [param("id", "path"), param("id", "query"), param("id", "header")]
    spec = tool(api({"/cards/{id}": {"get": ok("card", parameters=params)}}), "card")
    assert set(spec.schema_input["properties"]) == {"id", "query_id", "header_id"}
    sent = render(spec, {"id": "7", "query_id": "q", "header_id": "h"})
    assert sent.url == "https://api.example.com/cards/7?id=q"
    assert sent.headers["id"] == "h"


TRELLO_SECURITY = {
    "components": {
        "securitySchemes": {
            "api_key": {"type": "apiKey", "in": "query", "name": "key"},
            "api_token": {"type": "apiKey", "in": "query", "name": "token"},
        }
    },
    "security": [{"api_key": []}, {"api_token": []}],
}


def test_the_credentials_parameter_is_left_to_toolrelay_and_another_schemes_skips() -> None:
    """Trello declares ``key`` and ``token`` as required query parameters and as two security
    schemes: ``key`` carries the placed credential (not an input); ``token`` would need a
    second credential, so the operation is skipped, saying so (a secret as agent input is
    no way out)."""
    both = [param("id", "path"), param("key", "query", True), param("token", "query", True)]
    key_only = [param("id", "path"), param("key", "query", True), param("fields", "query")]
    doc = api(
        {"/cards/{id}": {"get": ok("card", parameters=both)},
         "/boards/{id}": {"get": ok("board", parameters=key_only)}},
        **TRELLO_SECURITY,
    )  # fmt: skip
    spec = tool(doc, "board")
    assert set(spec.schema_input["properties"]) == {"id", "fields"}
    assert (spec.auth_placement, spec.auth_param_name) == ("query", "key")
    assert skipped(doc) == [
        "GET /cards/{id}: query parameter 'token' carries the credential of security scheme"
        " 'api_token' too, and toolrelay places one credential per tool (query 'key')"
    ]


def test_an_optional_body_that_declares_nothing_is_not_sent() -> None:
    """Stripe's GETs: an optional form body with no properties."""
    empty = {"type": "object", "properties": {}, "additionalProperties": False}
    doc = api(
        {"/v1/account": {"get": ok("account", requestBody=json_body(
            empty, required=False, kind="application/x-www-form-urlencoded"))}}
    )  # fmt: skip
    plan = tools_from_openapi(doc)
    assert [spec.key for spec in plan.tools] == ["good", "account"]
    assert plan.warnings == [
        "GET /v1/account: its optional request body (application/x-www-form-urlencoded)"
        " declares nothing: not sent"
    ]
    assert render(plan.tools[1], {}).body is None


def test_media_types_a_json_body_is_sent_for() -> None:
    """``*/*`` with a schema is JSON (Kubernetes), sent as application/json; without one the
    operation is skipped with the reason (other JSON types: test_openapi_bodies.py)."""
    thing = {"type": "object", "properties": {"name": {"type": "string"}}}
    doc = api({
        "/k8s": {"post": ok("k8s", requestBody=json_body(thing, kind="*/*"))},
        "/avatar": {"post": ok("avatar", requestBody=json_body({}, kind="*/*"))},
    })  # fmt: skip
    k8s = tool(doc, "k8s")
    assert "Content-Type" not in k8s.request_template.get("headers", {})
    assert render(k8s, {"name": "n"}).body == {"name": "n"}
    assert skipped(doc) == [
        "POST /avatar: its request body is */* with no schema: what to send is not said",
    ]


def test_path_parameter_styles_and_structured_path_parameters() -> None:
    label = param("id", "path") | {"style": "label"}
    matrix = param("id", "path") | {"style": "matrix"}
    listed = param("ids", "path", type="array", items={"type": "string"})
    doc = api({
        "/label/{id}": {"get": ok("label", parameters=[label])},
        "/matrix/{id}": {"get": ok("matrix", parameters=[matrix])},
        "/list/{ids}": {"get": ok("list", parameters=[listed])},
    })  # fmt: skip
    assert render(tool(doc, "label"), {"id": "a b"}).url.endswith("/label/.a%20b")
    assert render(tool(doc, "matrix"), {"id": "5"}).url.endswith("/matrix/;id=5")
    assert skipped(doc) == [
        "GET /list/{ids}: path parameter 'ids' is an array or object (a path value must be a"
        " string, number or boolean)"
    ]


def test_a_write_with_no_input_sends_no_body() -> None:
    """Without a placeholder the dispatcher merges the input into the body: ``{}``."""
    spec = tool(api({"/logout": {"post": ok("logout")}}), "logout")
    assert render(spec, {}).body is None


def test_read_only_beside_a_ref_write_only_and_nullable_refs() -> None:
    """Asana: ``{"$ref": ..., "readOnly": true}`` is not an input; writeOnly is not in the
    output; ``{"$ref": ..., "nullable": true}`` admits null."""
    user = {"type": "object", "properties": {"gid": {"type": "string"}}}
    task = {
        "type": "object",
        "required": ["name", "created_by", "secret"],
        "properties": {
            "name": {"type": "string"},
            "created_by": {"$ref": "#/components/schemas/User", "readOnly": True},
            "assignee": {"$ref": "#/components/schemas/User", "nullable": True},
            "secret": {"type": "string", "writeOnly": True},
        },
    }
    body = {"properties": {"data": {"$ref": "#/components/schemas/Task"}}, "type": "object"}
    response = {"200": {"description": "ok", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Task"}}}}}  # fmt: skip
    doc = api(
        {"/tasks": {"post": ok("task", requestBody=json_body(body), responses=response)}},
        components={"schemas": {"User": user, "Task": task}},
    )
    spec = tool(doc, "task")
    written = spec.schema_input["$defs"]["Task"]
    assert set(written["properties"]) == {"name", "assignee", "secret"}
    assert written["required"] == ["name", "secret"]
    assert written["properties"]["assignee"]["anyOf"][1] == {"type": "null"}
    read = spec.schema_output
    assert set(read["properties"]) == {"name", "created_by", "assignee"}
    assert read["required"] == ["name", "created_by"]


def test_a_discriminator_is_required_one_of_its_values_and_its_one_of_reads_as_any_of() -> None:
    """Scalar Galaxy: two branches may accept one payload; the discriminator picks, by the
    mapping's keys or the branches' schema names."""
    planet = {"type": "object", "properties": {"type": {"type": "string"}, "name": {}}}
    body = {"oneOf": [{"$ref": "#/components/schemas/Planet"}, {"$ref": "#/components/schemas/Moon"}],
            "discriminator": {"propertyName": "type"}}  # fmt: skip
    doc = api(
        {"/bodies": {"post": ok("bodies", requestBody=json_body(body))}},
        components={"schemas": {"Planet": planet, "Moon": planet}},
    )
    member = tool(doc, "bodies").schema_input["properties"]["body"]
    assert "oneOf" not in member and len(member["anyOf"]) == 2
    assert member["required"] == ["type"]
    assert member["properties"] == {"type": {"enum": ["Planet", "Moon"]}}  # implicit mapping
    body["discriminator"]["mapping"] = {"planet": "#/components/schemas/Planet"}
    member = tool(doc, "bodies").schema_input["properties"]["body"]
    assert member["properties"] == {"type": {"enum": ["planet", "Moon"]}}


def test_schema_and_id_below_the_root_are_dropped() -> None:
    """``$schema`` is allowed at a resource's root only; an ``$id`` below it would move the
    base the ``#/$defs/...`` references resolve against."""
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "$id": "urn:x",
              "type": "integer", "minimum": 1, "exclusiveMinimum": True}  # fmt: skip
    spec = tool(api({"/n": {"get": ok("n", parameters=[param("n", "query", **draft4)])}}), "n")
    assert spec.schema_input["properties"]["n"] == {"type": "integer", "exclusiveMinimum": 1}


def test_a_query_parameter_of_scalar_or_object_keeps_the_scalar_forms() -> None:
    """Stripe's ``created``: a timestamp, or a range object."""
    created = {"anyOf": [{"type": "object", "properties": {"gt": {"type": "integer"}}},
                         {"type": "integer"}]}  # fmt: skip
    doc = api(
        {"/coupons": {"get": ok("coupons", parameters=[param("created", "query", **created)])}}
    )
    plan = tools_from_openapi(doc)
    schema = plan.tools[1].schema_input["properties"]["created"]
    assert schema == {"anyOf": [{"type": "integer"}]}
    assert plan.warnings == [
        "GET /coupons: query parameter 'created': its array or object forms dropped (a query"
        " value is a string, number or boolean)"
    ]


def test_a_huge_response_schema_keeps_what_is_near_its_root() -> None:
    """Stripe: each response refers to most of the API (670 kB a tool)."""
    names = [f"S{i}" for i in range(60)]
    schemas = {
        name: {"type": "object", "description": "x" * 2000, "properties": {
            "next": {"$ref": f"#/components/schemas/{names[min(i + 1, 59)]}"}}}
        for i, name in enumerate(names)
    }  # fmt: skip
    response = {"200": {"description": "ok", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/S0"}}}}}  # fmt: skip
    doc = api({"/big": {"get": ok("big", responses=response)}}, components={"schemas": schemas})
    plan = tools_from_openapi(doc)
    output = plan.tools[1].schema_output
    assert len(json.dumps(output)) <= OUTPUT_SCHEMA_BUDGET
    assert 10 < len(output["$defs"]) < 60
    last = output["$defs"][max(output["$defs"], key=lambda n: int(n[1:]))]
    assert last["properties"]["next"] == {}  # a reference past the budget: any value
    assert "schema_output cut to 64 KiB" in plan.warnings[0]


def test_a_component_that_fails_to_convert_fails_every_tool_using_it() -> None:
    """Component schemas are converted once per document: one that cannot be converted
    must not be left behind as ``true`` for the next tool."""
    bad = {"type": "object", "properties": {"x": "not a schema"}}
    body = json_body({"type": "array", "items": {"$ref": "#/components/schemas/Bad"}})
    paths = {f"/{n}": {"post": ok(n, requestBody=body)} for n in ("one", "two")}
    plan = tools_from_openapi(api(paths, components={"schemas": {"Bad": bad}}))
    assert [spec.key for spec in plan.tools] == ["good"]
    assert [line.split(":")[0] for line in plan.skipped] == ["POST /one", "POST /two"]
