"""`toolrelay import openapi`: request bodies of every media type the dispatcher sends (JSON
of any JSON type, urlencoded and multipart forms), what the call asks for (``Accept``), HTTP
basic security, and parameter names that would share an input member (issue 15)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import parse_qsl

import pytest

from tests.export.test_openapi_mapping import json_body, param, render, skipped, tool
from tests.interop.test_import_robust import api, ok
from toolrelay.dispatch.http import SendSpec
from toolrelay.export.openapi import tools_from_openapi

THING = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
FILE = {"type": "string", "format": "binary"}


def sent(spec: Any, value: dict[str, Any]) -> SendSpec:
    """The request as the dispatcher sends it: headers and the encoded bytes."""
    rendered = render(spec, value)
    return SendSpec(rendered.method, rendered.url, dict(rendered.headers), rendered.body,
                    5.0, 5.0, 1 << 20, False)  # fmt: skip


def form(properties: dict[str, Any], required: list[str] | None = None, **media: Any) -> Any:
    schema = {"type": "object", "properties": properties} | (
        {"required": required} if required else {}
    )
    return {"schema": schema} | media


def body(kind: str, media: Any, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {kind: media}}


@pytest.mark.parametrize(
    ("types", "chosen"),
    [
        (["application/xml", "application/json"], "application/json"),
        (["application/json-patch+json", "application/merge-patch+json"],
         "application/merge-patch+json"),  # Kubernetes' PATCH: the object-shaped one
        (["application/vnd.api+json", "application/x-www-form-urlencoded"],
         "application/vnd.api+json"),
        (["multipart/form-data", "application/x-www-form-urlencoded"],
         "application/x-www-form-urlencoded"),
        (["text/plain", "multipart/form-data"], "multipart/form-data"),
    ],
)  # fmt: skip
def test_the_body_s_media_type_is_the_first_toolrelay_sends(types: list[str], chosen: str) -> None:
    doc = api({"/t": {"post": ok("t", requestBody={
        "required": True, "content": {t: {"schema": THING} for t in types}})}})  # fmt: skip
    spec = tool(doc, "t")
    headers = spec.request_template.get("headers", {})
    assert headers.get("Content-Type") == (None if chosen == "application/json" else chosen)
    request = sent(spec, {"name": "Ada"})
    assert request.headers["Content-Type"].split(";")[0] == chosen


def test_another_json_type_is_sent_as_declared() -> None:
    """Before: skipped ("toolrelay sends JSON bodies as application/json")."""
    doc = api({"/t/{id}": {"patch": ok("t", parameters=[param("id", "path")], requestBody=(
        json_body(THING, kind="application/merge-patch+json")))}})  # fmt: skip
    request = sent(tool(doc, "t"), {"id": "7", "name": "Ada"})
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert request.payload == b'{"name": "Ada"}'


def test_a_urlencoded_form_s_fields_are_input_members_sent_as_a_form() -> None:
    """Stripe's shape: scalars, an array (the key repeated), a deepObject map in brackets."""
    fields = {
        "email": {"type": "string"},
        "expand": {"type": "array", "items": {"type": "string"}},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "balance": {"type": "integer"},
    }
    encoding = {"expand": {"style": "deepObject", "explode": True},
                "metadata": {"style": "deepObject", "explode": True}}  # fmt: skip
    media = form(fields, ["email"], encoding=encoding)
    doc = api({"/v1/customers": {"post": ok("create", requestBody=body(
        "application/x-www-form-urlencoded", media, required=False))}})  # fmt: skip
    plan = tools_from_openapi(doc)
    spec = next(s for s in plan.tools if s.key == "create")
    assert plan.skipped == [] and plan.warnings == []
    assert spec.request_template["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert spec.request_template["body"] == {n: "{{input." + n + "}}" for n in fields}
    assert "required" not in spec.schema_input  # the body itself is optional
    request = sent(spec, {"email": "a+b@x.test", "expand": ["x", "y"],
                          "metadata": {"k": "v w"}, "balance": 5})  # fmt: skip
    assert parse_qsl((request.payload or b"").decode()) == [
        ("email", "a+b@x.test"), ("expand", "x"), ("expand", "y"), ("metadata[k]", "v w"),
        ("balance", "5"),
    ]  # fmt: skip


def test_a_required_form_field_is_required_and_names_that_are_not_members_use_body() -> None:
    required = api(
        {
            "/a": {
                "post": ok(
                    "a",
                    requestBody=body(
                        "application/x-www-form-urlencoded",
                        form({"text": {"type": "string"}}, ["text"]),
                    ),
                )
            }
        }
    )
    assert tool(required, "a").schema_input["required"] == ["text"]
    odd = api(
        {
            "/b": {
                "post": ok(
                    "b",
                    requestBody=body(
                        "application/x-www-form-urlencoded",
                        form({"filter[id]": {"type": "string"}}),
                    ),
                )
            }
        }
    )
    spec = tool(odd, "b")
    assert spec.request_template["body"] == "{{input.body}}"
    assert spec.schema_input["properties"]["body"] == {
        "type": "object", "properties": {"filter[id]": {"type": "string"}},
    }  # fmt: skip
    assert sent(spec, {"body": {"filter[id]": "7"}}).payload == b"filter%5Bid%5D=7"


def test_multipart_text_fields_are_sent_and_files_are_not() -> None:
    """An optional file is dropped with a warning; a required one skips the operation."""
    fields = {"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
              "attachment": FILE, "photos": {"type": "array", "items": FILE}}  # fmt: skip
    doc = api({
        "/notes": {"post": ok("note", requestBody=body("multipart/form-data", form(
            fields, ["title"], encoding={"tags": {"style": "pipeDelimited"}})))},
        "/avatar": {"post": ok("avatar", requestBody=body("multipart/form-data", form(
            {"pic": FILE, "alt": {"type": "string"}}, ["pic"])))},
        "/v31": {"post": ok("v31", requestBody=body("multipart/form-data", form(
            {"doc": {"type": "string", "contentMediaType": "application/pdf"}}, ["doc"])))},
    })  # fmt: skip
    plan = tools_from_openapi(doc)
    note = next(s for s in plan.tools if s.key == "note")
    assert set(note.schema_input["properties"]) == {"title", "tags"}
    assert plan.warnings == [
        "POST /notes: optional multipart field 'attachment' dropped: it is a file upload"
        " (toolrelay sends text fields, not files)",
        "POST /notes: optional multipart field 'photos' dropped: it is a file upload"
        " (toolrelay sends text fields, not files)",
    ]
    assert plan.skipped == [
        "POST /avatar: its multipart/form-data body's required field 'pic' is a file upload"
        " (toolrelay sends text fields, not files)",
        "POST /v31: its multipart/form-data body's required field 'doc' is a file upload"
        " (toolrelay sends text fields, not files)",
    ]
    request = sent(note, {"title": "Hi", "tags": ["a", "b"]})  # style is for urlencoded only
    assert request.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    assert request.payload is not None and request.payload.count(b'name="tags"') == 2


def test_a_urlencoded_encoding_toolrelay_does_not_produce() -> None:
    """``pipeDelimited`` or unexploded arrays (``a=1,2``): optional dropped, required skipped;
    an object field without deepObject is sent in brackets, with a warning saying so."""
    array = {"type": "array", "items": {"type": "string"}}
    encoding = {"ids": {"style": "pipeDelimited"}, "tags": {"explode": False}}
    doc = api({
        "/drop": {"post": ok("drop", requestBody=body("application/x-www-form-urlencoded",
            form({"ids": array, "tags": array, "name": {"type": "string"}}, encoding=encoding)))},
        "/skip": {"post": ok("skip", requestBody=body("application/x-www-form-urlencoded",
            form({"ids": array}, ["ids"], encoding=encoding)))},
        "/obj": {"post": ok("obj", requestBody=body("application/x-www-form-urlencoded",
            form({"card": {"type": "object", "properties": {"n": {"type": "string"}}}})))},
    })  # fmt: skip
    plan = tools_from_openapi(doc)
    assert set(tool(doc, "drop").schema_input["properties"]) == {"name"}
    assert plan.skipped == [
        "POST /skip: its application/x-www-form-urlencoded body's required field 'ids' is"
        " encoded pipeDelimited, which toolrelay's forms do not produce (an array repeats its key)"
    ]
    assert plan.warnings == [
        "POST /drop: optional form field 'ids' dropped: it is encoded pipeDelimited, which"
        " toolrelay's forms do not produce (an array repeats its key)",
        "POST /drop: optional form field 'tags' dropped: it is encoded form unexploded, which"
        " toolrelay's forms do not produce (an array repeats its key)",
        "POST /obj: form field(s) 'card' sent in brackets (deepObject style: card[number]=…),"
        " as the document does not say",
    ]
    assert sent(tool(doc, "obj"), {"card": {"n": "1"}}).payload == b"card%5Bn%5D=1"


def test_a_get_s_optional_empty_form_is_still_not_sent() -> None:
    """Stripe's GETs declare an empty form: with forms supported, still no body on a GET."""
    doc = api(
        {
            "/v1/account": {
                "get": ok(
                    "account",
                    requestBody=body("application/x-www-form-urlencoded", form({}), required=False),
                )
            }
        }
    )
    assert render(tool(doc, "account"), {}).body is None


@pytest.mark.parametrize(
    ("responses", "accept"),
    [
        ({"200": ["application/json"]}, "application/json"),
        ({"200": ["application/xml", "application/json"], "201": ["application/hal+json"]},
         "application/json, application/hal+json"),
        ({"200": ["text/csv"], "204": []}, "text/csv"),
        ({"200": ["application/json", "application/json;stream=watch", "application/yaml"]},
         "application/json"),  # Kubernetes: JSON, not protobuf or a watch stream
        ({"2XX": ["application/json"]}, "application/json"),  # a range, not a number
        ({"200": ["*/*"]}, None),
        ({"204": []}, None),
        ({"400": ["application/json"]}, None),  # an error's type is not what the call is for
    ],
)  # fmt: skip
def test_accept_asks_for_what_the_success_responses_declare(
    responses: dict[str, list[str]], accept: str | None
) -> None:
    declared = {
        code: {"description": "x"} | ({"content": {t: {} for t in types}} if types else {})
        for code, types in responses.items()
    }
    spec = tool(api({"/r": {"get": {"operationId": "r", "responses": declared}}}), "r")
    assert spec.request_template.get("headers", {}).get("Accept") == accept
    if accept is not None:
        assert render(spec, {}).headers["Accept"] == accept


SECURITY = {"components": {"securitySchemes": {
    "basic": {"type": "http", "scheme": "basic"},
    "bearer": {"type": "http", "scheme": "bearer"},
    "digest": {"type": "http", "scheme": "digest"},
}}}  # fmt: skip


def test_http_basic_security_is_placed_as_basic() -> None:
    doc = api({"/b": {"get": ok("b", security=[{"basic": []}])}}, **SECURITY)
    spec = tool(doc, "b")
    placed = (spec.auth_method, spec.auth_placement, spec.auth_param_name, spec.auth_param_prefix)
    assert placed == ("basic", "header", "Authorization", None)
    ref = uuid.uuid4()
    both = api({"/x": {"get": ok("x", security=[{"bearer": []}, {"basic": []}])}}, **SECURITY)
    by_kind = {
        kind: next(s for s in tools_from_openapi(both, credential_ref=ref,
                                                 credential_kind=kind).tools if s.key == "x")
        for kind in ("basic", "api_key")
    }  # fmt: skip
    assert (by_kind["basic"].auth_method, by_kind["basic"].credential_ref) == ("basic", ref)
    assert (by_kind["api_key"].auth_method, by_kind["api_key"].auth_param_prefix) == (
        "api_key", "Bearer ",
    )  # fmt: skip
    assert skipped(api({"/d": {"get": ok("d", security=[{"digest": []}])}}, **SECURITY)) == [
        "GET /d: its security (digest) needs a scheme toolrelay cannot place (an apiKey in a"
        " cookie, an HTTP scheme other than bearer and basic, mutual TLS, or several schemes"
        " at once)"
    ]


def test_auth_basic_states_it_where_the_document_declares_none() -> None:
    spec = tool(api({}), "good")
    assert spec.auth_method == "none"
    stated = tool_with(api({}), auth="basic")
    assert (stated.auth_method, stated.auth_param_name) == ("basic", "Authorization")


def tool_with(doc: dict[str, Any], **options: Any) -> Any:
    return tools_from_openapi(doc, **options).tools[0]


def test_parameters_that_would_share_a_member_are_spelled_out() -> None:
    """Twilio's ``StartTime>`` and ``StartTime<`` (before: the operation was skipped)."""
    params = [param("StartTime>", "query"), param("StartTime<", "query"), param("To", "query")]
    spec = tool(api({"/calls": {"get": ok("calls", parameters=params)}}), "calls")
    assert set(spec.schema_input["properties"]) == {"StartTime_gt", "StartTime_lt", "To"}
    url = render(spec, {"StartTime_gt": "2026-01-01", "StartTime_lt": "2026-02-01"}).url
    assert url == ("https://api.example.com/calls?StartTime%3E=2026-01-01&StartTime%3C=2026-02-01")


def test_a_media_type_cannot_inject_a_header() -> None:
    """The document's media type keys become header values: CR/LF in one never becomes a
    second header (the operation is skipped), nor a second line of the import's output."""
    evil = "application/vnd.x+json\r\nX-Injected: 1"
    doc = api({
        "/body": {"post": ok("body", requestBody=json_body(THING, kind=evil))},
        "/reply": {"get": {"operationId": "reply", "responses": {
            "200": {"description": "x", "content": {evil: {}}}}}},
    })  # fmt: skip
    plan = tools_from_openapi(doc)
    assert [s.key for s in plan.tools] == ["good"]
    assert [line.split(":")[0].split(" (")[0] for line in plan.skipped] == [
        "POST /body",
        "GET /reply",
    ]
    assert "control character" in plan.skipped[1]
    assert all("\r" not in line and "\n" not in line for line in plan.skipped)
    assert "application/vnd.x+json\\r\\nX-Injected" in plan.skipped[0]
