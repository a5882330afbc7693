"""`toolrelay import openapi` on documents shaped like real ones (issue 15): one operation that
cannot be mapped is skipped with the reason and the rest imports (``--strict`` refuses the
document instead); ``$ref`` pointers are percent-decoded."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.interop.conftest import Owner
from tests.interop.test_import_openapi import PETSTORE, broken_documents, write
from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi import load_openapi, tools_from_openapi


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
        "a '#' in the path key (Box)",
        {"/files/{id}#shared": {"get": ok("shared", parameters=[string("id", "path")])}},
        "GET /files/{id}#shared: the path has a '#' or '?', which cannot be part of a URL path",
    ),
    (
        "a query and a path parameter with the same name (Kubernetes, Trello)",
        {"/cards/{id}": {"get": ok("card", parameters=[string("id", "path"), string("id", "query")])}},
        "GET /cards/{id}: query parameter 'id' and path parameter 'id' both become the input"
        " member 'id'",
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
