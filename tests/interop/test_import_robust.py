"""`toolrelay import openapi` on documents shaped like real ones (issue 15): one operation that
cannot be mapped is skipped with the reason and the rest imports (``--strict`` refuses the
document instead); ``$ref`` pointers are percent-decoded; JSON read as JSON, YAML by libyaml;
``--server``, ``--auth`` and a credential's kind; shared schemas checked once."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from jsonschema import validators

from tests.interop.conftest import Owner
from tests.interop.test_import_openapi import PETSTORE, broken_documents, write
from toolrelay.api import ApiSettings, create_app
from toolrelay.credentials import CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi import load_openapi, tools_from_openapi
from toolrelay.registry import schemas
from toolrelay.registry.validation import check_json_schema


def ok(operation_id: str, **more: Any) -> dict[str, Any]:
    return {"operationId": operation_id, "responses": {"200": {"description": "ok"}}} | more


def api(paths: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "t", "version": "1"},
        "servers": [{"url": "https://api.example.com"}],
        "paths": {"/good": {"get": ok("good")}} | paths,
    } | more


def string(name: str, where: str, required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": {"type": "string"}}


# (what, paths added next to a good operation, the reason the bad one is skipped)
BAD_OPERATIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "a '?' in the path key",
        {"/files/{id}?shared": {"get": ok("shared", parameters=[string("id", "path")])}},
        "GET /files/{id}?shared: the path has a '?', which cannot be part of a URL path",
    ),
    (
        "two query parameters that become one input member",
        {"/cards": {"get": ok("card", parameters=[string("a[b]", "query"), string("a_b_", "query")])}},
        "GET /cards: query parameter 'a_b_' and query parameter 'a[b]' both become the input"
        " member 'a_b_'",
    ),
    (
        "a $ref that does not resolve",
        {"/nope": {"get": ok("nope", parameters=[{"$ref": "#/components/parameters/Nope"}])}},
        "GET /nope: $ref '#/components/parameters/Nope' does not resolve",
    ),
    (
        "a path item that is not an object",
        {"/broken": "oops"},
        "paths./broken: a path item must be an object under a '/...' key",
    ),
    (
        "a key another operation has",
        {"/again": {"get": ok("good")}},
        "GET /again: tool key 'good' is also GET /good's",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(BAD_OPERATIONS)), ids=[c[0] for c in BAD_OPERATIONS])
def test_an_operation_that_cannot_be_mapped_is_skipped_and_the_rest_imports(case: int) -> None:
    _, paths, reason = BAD_OPERATIONS[case]
    plan = tools_from_openapi(api(paths))
    assert [spec.key for spec in plan.tools] == ["good"]
    assert plan.skipped == [reason]
    with pytest.raises(InvalidArgument) as refused:
        tools_from_openapi(api(paths), strict=True)
    assert refused.value.message == reason


def test_an_empty_header_name_drops_the_parameter_not_the_document() -> None:
    """Notion: a header parameter named ''; optional, so the operation imports without it."""
    doc = api({"/pages": {"get": ok("pages", parameters=[string("", "header")])}})
    plan = tools_from_openapi(doc)
    assert sorted(spec.key for spec in plan.tools) == ["good", "pages"]
    assert plan.warnings == [
        "GET /pages: optional header parameter '' dropped: it is not a valid HTTP header name"
    ]
    required = api({"/pages": {"get": ok("pages", parameters=[string("", "header", True)])}})
    assert tools_from_openapi(required).skipped == [
        "GET /pages: header parameter '' is not a valid HTTP header name"
    ]


def test_percent_encoded_ref_pointers_are_decoded() -> None:
    """DigitalOcean: ``{`` and ``}`` of a path key written ``%7B`` / ``%7D`` in a $ref
    (RFC 6901 §6: a pointer in a URI fragment is percent-decoded before ``~1``/``~0``)."""
    shared = {"name": "app_id", "in": "path", "required": True, "schema": {"type": "string"}}
    doc = api({
        "/v2/apps/{app_id}": {"parameters": [shared], "get": ok("getApp")},
        "/v2/apps/{app_id}/logs": {
            "get": ok("getLogs", parameters=[
                {"$ref": "#/paths/~1v2~1apps~1%7Bapp_id%7D/parameters/0"},
            ], responses={"200": {"description": "ok", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Log%20Line"},
            }}}}),
        },
    }, components={"schemas": {"Log Line": {"type": "object", "properties": {
        "text": {"type": "string"}, "next": {"$ref": "#/components/schemas/Log%20Line"},
    }}}})  # fmt: skip
    plan = tools_from_openapi(doc, strict=True)
    logs = next(spec for spec in plan.tools if spec.key == "getLogs")
    assert logs.endpoint_url == "https://api.example.com/v2/apps/{{input.app_id}}/logs"
    assert logs.schema_input["required"] == ["app_id"]
    assert logs.schema_output["properties"]["next"] == {"$ref": "#/$defs/Log%20Line"}
    assert list(logs.schema_output["$defs"]) == ["Log Line"]


def test_a_document_with_nothing_importable_is_still_refused() -> None:
    doc = api({})
    doc["paths"] = {f"/p{i}": "oops" for i in range(8)}
    with pytest.raises(InvalidArgument, match=r"no operation toolrelay can import .*; and 3 more"):
        tools_from_openapi(doc)


@pytest.mark.parametrize("case", [0, 1, 3, 5])
def test_without_strict_the_cli_imports_the_rest_of_a_petstore_with_one_broken_operation(
    case: int, owner: Owner, tmp_path: Path
) -> None:
    doc = yaml.safe_load(PETSTORE.read_text())
    what, broken, message = broken_documents(copy.deepcopy(doc))[case]
    path = write(tmp_path, broken, "api.json")
    result = owner.cli("import", "openapi", str(path))
    assert result.exit_code == 0, (what, result.output)
    skipped = [line for line in result.stderr.splitlines() if message in line]
    assert len(skipped) == 1 and skipped[0].startswith("skipped "), (what, result.stderr)
    assert owner.registry.list_tools(), what
    assert json.loads(path.read_text()) == broken


# --- JSON as JSON, YAML with libyaml ----------------------------------------------------------


def sendgrid_like() -> dict[str, Any]:
    """Valid JSON with a C1 control character in a string, which YAML refuses (#x009f)."""
    doc = api({})
    doc["paths"]["/good"]["get"]["description"] = "Stats \x9f per day\u2028and more"
    return doc


@pytest.mark.parametrize("name", ["sendgrid.json", "sendgrid.txt"])
def test_json_is_parsed_as_json(name: str, tmp_path: Path) -> None:
    """A ``.json`` file, or any file whose text starts with ``{``."""
    path = tmp_path / name
    path.write_text("\ufeff" + json.dumps(sendgrid_like(), ensure_ascii=False), encoding="utf-8")
    doc = load_openapi(path)
    assert doc == sendgrid_like()
    (spec,) = tools_from_openapi(doc).tools
    assert spec.description == "Stats \x9f per day\u2028and more"


def test_broken_json_says_json_and_a_yaml_flow_mapping_still_loads(tmp_path: Path) -> None:
    broken = tmp_path / "api.json"
    broken.write_text('{"openapi": "3.0.3",\n  "paths": }')
    with pytest.raises(InvalidArgument, match=r"api.json: not valid JSON at line 2, column 12: "):
        load_openapi(broken)
    flow = tmp_path / "api.yaml"
    flow.write_text("{openapi: 3.0.3, paths: {}}")
    assert load_openapi(flow) == {"openapi": "3.0.3", "paths": {}}


def test_yaml_is_read_with_the_c_loader_when_pyyaml_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaders: list[Any] = []
    real = yaml.load

    def spy(stream: str, Loader: Any) -> Any:  # yaml.load's parameter name
        loaders.append(Loader)
        return real(stream, Loader=Loader)

    monkeypatch.setattr(yaml, "load", spy)
    path = write(tmp_path, api({}))
    assert load_openapi(path)["openapi"] == "3.0.3"
    assert loaders == [getattr(yaml, "CSafeLoader", yaml.SafeLoader)]


# --- --server, --auth, a credential's kind ----------------------------------------------------


def test_server_is_the_base_when_the_document_has_none_or_a_relative_one() -> None:
    bare = api({})
    del bare["servers"]
    with pytest.raises(InvalidArgument, match=r"no servers: .*\(--server\)"):
        tools_from_openapi(bare)
    (spec,) = tools_from_openapi(bare, server="http://127.0.0.1:8080/").tools
    assert spec.endpoint_url == "http://127.0.0.1:8080/good"
    relative = api({}, servers=[{"url": "/v1"}])
    with pytest.raises(InvalidArgument, match="not an absolute http.s. URL; .* or give --server"):
        tools_from_openapi(relative)
    (spec,) = tools_from_openapi(relative, server="https://staging.example.com/x").tools
    assert spec.endpoint_url == "https://staging.example.com/v1/good"
    (spec,) = tools_from_openapi(api({}), server="https://other.example.com").tools
    assert spec.endpoint_url == "https://api.example.com/good"  # an absolute one is kept
    with pytest.raises(InvalidArgument, match="--server 'localhost' is not an absolute"):
        tools_from_openapi(bare, server="localhost")


@pytest.mark.parametrize(
    ("auth", "placed"),
    [
        ("bearer", ("api_key", "header", "Authorization", "Bearer ")),
        ("oauth", ("oauth", "header", "Authorization", "Bearer ")),
        ("header:X-Api-Key", ("api_key", "header", "X-Api-Key", "")),
        ("query:access_token", ("api_key", "query", "access_token", "")),
    ],
)
def test_auth_states_the_scheme_when_the_document_declares_none(
    auth: str, placed: tuple[str, ...]
) -> None:
    """GitHub's document declares no security: --auth says how the credential goes."""
    ref = UUID(int=7)
    (spec,) = tools_from_openapi(api({}), auth=auth, credential_ref=ref).tools
    assert (
        spec.auth_method,
        spec.auth_placement,
        spec.auth_param_name,
        spec.auth_param_prefix,
    ) == (placed)
    assert spec.credential_ref == ref


def test_auth_does_not_override_declared_security_and_a_bad_one_is_refused() -> None:
    doc = api({"/open": {"get": ok("open", security=[])}})
    plan = tools_from_openapi(doc, auth="bearer")
    assert {s.key: s.auth_method for s in plan.tools} == {"good": "api_key", "open": "none"}
    with pytest.raises(InvalidArgument, match="--auth 'digest': expected bearer, oauth, basic,"):
        tools_from_openapi(doc, auth="digest")


def test_a_credential_no_tool_uses_is_a_warning() -> None:
    plan = tools_from_openapi(api({}), credential_ref=UUID(int=7))
    assert plan.tools[0].credential_ref is None
    assert plan.warnings == [
        "--credential is used by no tool: no operation declares a security scheme it fits"
        " (state one with --auth when the document declares none)"
    ]


def mixed_petstore(port: str) -> dict[str, Any]:
    """Petstore's security: some operations accept OAuth 2 or an API key, some OAuth 2 only."""
    oauth = {"petstore_auth": ["write:pets"]}
    return api({
        "/pet/{petId}": {"get": ok("getPetById", security=[oauth, {"api_key": []}],
                                   parameters=[string("petId", "path")])},
        "/pet": {"post": ok("addPet", security=[oauth])},
    }, servers=[{"url": f"http://127.0.0.1:{port}/v3"}], security=[oauth], components={
        "securitySchemes": {
            "api_key": {"type": "apiKey", "in": "header", "name": "api_key"},
            "petstore_auth": {"type": "oauth2", "flows": {"implicit": {
                "authorizationUrl": "https://petstore.example.com/oauth/authorize",
                "scopes": {"write:pets": "modify pets"},
            }}},
        },
    })  # fmt: skip


def test_a_credential_gets_the_scheme_its_kind_fits(
    owner: Owner, db: Database, interop_keyring: Keyring, tmp_path: Path
) -> None:
    store = CredentialStore(db, interop_keyring)
    cred = store.add(owner.id, "api_key", "petstore", "pk-1", ["127.0.0.1"])
    path = write(tmp_path, mixed_petstore("8080"), "petstore.json")
    result = owner.cli("import", "openapi", str(path), "--credential", str(cred))
    assert result.exit_code == 0, result.output
    assert (
        "warning: POST /pet: its security needs an oauth credential and --credential is api_key:"
        " imported without a credential"
    ) in result.stderr.splitlines()
    tools = {row["key"]: row for row in owner.registry.list_tools()}
    get_pet = tools["getPetById"]
    assert (get_pet["auth_method"], get_pet["auth_param_name"]) == ("api_key", "api_key")
    assert get_pet["credential_ref"] == cred
    assert (tools["addPet"]["auth_method"], tools["addPet"]["credential_ref"]) == ("oauth", None)


def test_cli_server_and_auth(
    owner: Owner, db: Database, interop_keyring: Keyring, tmp_path: Path
) -> None:
    """Our own /openapi.json has no servers and declares no security: --server and --auth."""
    store = CredentialStore(db, interop_keyring)
    cred = store.add(owner.id, "api_key", "self", "tr-1", ["127.0.0.1"])
    doc = api({})
    del doc["servers"]
    path = write(tmp_path, doc, "openapi.json")
    result = owner.cli(
        "import", "openapi", str(path), "--credential", str(cred),
        "--server", "http://127.0.0.1:8080", "--auth", "bearer",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (row,) = owner.registry.list_tools()
    assert row["endpoint_url"] == "http://127.0.0.1:8080/good"
    assert (row["auth_method"], row["auth_param_prefix"], row["credential_ref"]) == (
        "api_key", "Bearer ", cred,
    )  # fmt: skip


def test_an_http_bearer_scheme_takes_an_oauth_credential() -> None:
    doc = api({}, security=[{"token": []}])
    doc["components"] = {"securitySchemes": {"token": {"type": "http", "scheme": "bearer"}}}
    (spec,) = tools_from_openapi(doc, credential_ref=UUID(int=7), credential_kind="oauth").tools
    assert (spec.auth_method, spec.auth_param_prefix, spec.credential_ref) == (
        "oauth", "Bearer ", UUID(int=7),
    )  # fmt: skip


# --- size: shared schemas are checked once ----------------------------------------------------


def test_shared_component_schemas_are_checked_against_the_metaschema_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GitHub's tools share their component schemas: checking each tool's schemas whole
    against the metaschema checked them again in every tool (34 s of its import)."""
    calls: list[Any] = []
    draft = validators.Draft202012Validator
    real = draft.check_schema

    def counting(cls: Any, schema: Any, format_checker: Any = None) -> None:
        calls.append(schema)
        real(schema, format_checker=format_checker)

    monkeypatch.setattr(draft, "check_schema", classmethod(counting))
    cache_clear = getattr(schemas, "_part_problem", None)
    if cache_clear is not None:
        cache_clear.cache_clear()
    user = {
        "type": "object",
        "properties": {"login": {"type": "string"}, "id": {"type": "integer"}},
    }
    paths = {
        f"/users-{i}": {"get": ok(f"user{i}", responses={"200": {"description": "ok", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/User"}},
        }}})}
        for i in range(40)
    }  # fmt: skip
    plan = tools_from_openapi(api(paths, components={"schemas": {"User": user}}))
    assert len(plan.tools) == 41
    assert len(calls) <= 10, len(calls)  # 82 when each tool's two schemas are checked whole
    # checked part by part, a schema is refused where it was, naming the same place
    bad = {"$defs": {"A": {"properties": {"x": {"minLength": "one"}}}}}
    with pytest.raises(InvalidArgument) as refused:
        check_json_schema("schema_input", bad | {"properties": {"a": {"$ref": "#/$defs/A"}}})
    assert refused.value.message == (
        "schema_input is not a valid JSON Schema at $defs/A/properties/x/minLength:"
        " 'one' is not of type 'integer'"
    )


def test_toolrelays_own_openapi_json_imports_with_server_and_auth() -> None:
    """Our /openapi.json names a relative server ("/") and declares no security (issue 15)."""
    app = create_app(ApiSettings(database_url="postgresql:///unused", run_worker=False))
    doc = json.loads(json.dumps(app.openapi()))
    with pytest.raises(InvalidArgument, match="not an absolute http"):
        tools_from_openapi(doc)
    plan = tools_from_openapi(doc, server="http://127.0.0.1:8080", auth="bearer")
    assert plan.skipped == []
    operations = sum(
        1
        for item in doc["paths"].values()
        for m in item
        if m in ("get", "post", "put", "patch", "delete")
    )
    assert len(plan.tools) == operations
    assert all(spec.endpoint_url.startswith("http://127.0.0.1:8080/") for spec in plan.tools)
    assert {spec.auth_param_prefix for spec in plan.tools} == {"Bearer "}
