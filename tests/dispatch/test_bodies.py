"""Form bodies: the template's Content-Type decides the bytes (dispatch/bodies.py), and an
upstream that parses them (aiohttp's own form and multipart parsers) gets the fields."""

from __future__ import annotations

import email
import email.policy
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay import errors
from toolrelay.dispatch.bodies import FORM, MULTIPART, encode_body, form_pairs
from toolrelay.dispatch.executor import build_request, request_digest
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry
from toolrelay.registry.preview import preview_request

Drain = Callable[..., Awaitable[Worker]]
OPEN_SCHEMA = {"type": "object"}


def parsed(upstream: Upstream, path: str) -> list[dict[str, Any]]:
    """What the upstream's form parser made of each request: fields, content type, raw."""
    got: list[dict[str, Any]] = []

    async def handler(request: web.Request, _hit: int) -> web.Response:
        raw = await request.read()  # the upstream fixture has read it already: from bytes
        header = request.headers.get("Content-Type", "")
        if request.content_type == MULTIPART:
            fields = multipart_fields(header, raw)
        else:
            fields = [(k, str(v)) for k, v in (await request.post()).items()]
        got.append({"fields": fields, "type": request.content_type, "raw": raw, "header": header})
        return web.json_response({"ok": True})

    upstream.routes[path] = handler
    return got


def multipart_fields(header: str, raw: bytes) -> list[tuple[str, str]]:
    """The parts of a multipart body, by the standard library's MIME parser."""
    message = email.message_from_bytes(
        f"Content-Type: {header}\r\n\r\n".encode() + raw, policy=email.policy.HTTP
    )
    assert message.is_multipart() and not message.defects, message.defects
    fields = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        assert isinstance(name, str) and isinstance(payload, bytes)
        fields.append((name, payload.decode()))
    return fields


def form_tool(registry: Registry, upstream: Upstream, content_type: str, **template: Any) -> str:
    agent, _tool = agent_with_tool(
        registry,
        key="form.post",
        endpoint_url=f"{upstream.base_url}/form",
        http_method="POST",
        schema_input=OPEN_SCHEMA,
        request_template={"headers": {"Content-Type": content_type}} | template,
    )
    return agent


async def test_a_form_body_reaches_the_upstream_as_fields(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    got = parsed(upstream, "/form")
    agent = form_tool(registry, upstream, FORM)
    card = {"number": "4242 4242", "exp": {"month": 12, "year": 2030}}
    inv = registry.invoke(agent, "form.post", {
        "amount": 2000, "currency": "eur", "capture": False, "note": None, "tags": ["a", "b&c"],
        "card": card, "items": [{"price": "p_1", "quantity": 2}], "expand[]": ["customer"],
        "name": "Zoë + Ann=1",
    })  # fmt: skip
    await drain()
    assert registry.get_invocation(inv)["status"] == "completed"
    [request] = got
    assert request["type"] == FORM
    # In the order jsonb keeps the input's members; a key's repeats in the array's order.
    assert sorted(request["fields"]) == sorted([
        ("amount", "2000"), ("currency", "eur"), ("capture", "false"), ("tags", "a"),
        ("tags", "b&c"), ("card[number]", "4242 4242"), ("card[exp][month]", "12"),
        ("card[exp][year]", "2030"), ("items[0][price]", "p_1"), ("items[0][quantity]", "2"),
        ("expand[]", "customer"), ("name", "Zoë + Ann=1"),
    ])  # fmt: skip
    tags = [v for k, v in request["fields"] if k == "tags"]
    assert tags == ["a", "b&c"]
    assert b" " not in request["raw"] and b"note" not in request["raw"]  # null: left out


async def test_a_multipart_body_reaches_the_upstream_as_parts(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    got = parsed(upstream, "/form")
    agent = form_tool(registry, upstream, MULTIPART)
    inv = registry.invoke(agent, "form.post", {
        "title": "Release\r\nnotes", "draft": True, "labels": ["x", "y"], "meta": {"k": [1, 2]},
        'odd"name': "v",
    })  # fmt: skip
    await drain()
    assert registry.get_invocation(inv)["status"] == "completed"
    [request] = got
    assert request["type"] == MULTIPART and "boundary=toolrelay-" in request["header"]
    assert sorted(request["fields"]) == sorted([
        ("title", "Release\r\nnotes"), ("draft", "true"), ("labels", "x"), ("labels", "y"),
        ("meta", '{"k": [1, 2]}'), ("odd%22name", "v"),
    ])  # fmt: skip


async def test_the_declared_json_type_is_sent_as_declared(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    got = parsed(upstream, "/form")
    agent = form_tool(registry, upstream, "application/merge-patch+json")
    await_id = registry.invoke(agent, "form.post", {"title": None, "state": "open"})
    await drain()
    assert registry.get_invocation(await_id)["status"] == "completed"
    assert got[0]["header"] == "application/merge-patch+json"
    assert json.loads(got[0]["raw"]) == {"title": None, "state": "open"}  # nulls kept


async def test_a_form_body_that_is_not_an_object_is_not_sent(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    got = parsed(upstream, "/form")
    agent = form_tool(registry, upstream, FORM, body="{{input.text}}")
    inv = registry.invoke(agent, "form.post", {"text": "just a string"})
    await drain()
    row = registry.get_invocation(inv)
    assert (row["status"], row["error_code"]) == ("failed", "template_error")
    assert "must render to a JSON object, got a string" in row["error"]
    assert got == []


def test_the_approval_binds_the_encoding() -> None:
    """Switching a JSON body to a form one (or back) changes what the approval bound to."""
    row = {"id": "00000000-0000-0000-0000-000000000001", "endpoint_url": "https://x.test/a",
           "http_method": "POST", "input": {"a": 1}, "auth_placement": "header",
           "auth_param_name": "Authorization", "idempotency_header": None}  # fmt: skip
    as_json = build_request(row | {"request_template": {}})
    as_form = build_request(row | {"request_template": {"headers": {"Content-Type": FORM}}})
    assert as_json.body == as_form.body == {"a": 1}
    assert request_digest(as_json) != request_digest(as_form)


def test_multipart_bytes_are_the_same_for_the_same_body() -> None:
    one, two = {"Content-Type": MULTIPART}, {"content-type": MULTIPART}
    assert encode_body({"a": "1"}, one) == encode_body({"a": "1"}, two)
    assert one["Content-Type"] == two["content-type"]  # the boundary added where it was set


def test_form_pairs_refuse_what_has_no_form() -> None:
    for body in ([1, 2], "text", 3, None):
        with pytest.raises(errors.TemplateError, match="must render to a JSON object"):
            form_pairs(body)


_keys = st.text(st.characters(codec="utf-8", exclude_characters="[]"), min_size=1, max_size=8)
_scalars = st.one_of(st.text(max_size=12), st.integers(), st.booleans())


@given(st.dictionaries(_keys, st.one_of(_scalars, st.lists(_scalars, max_size=3)), max_size=6))
def test_flat_form_bodies_round_trip_through_a_standard_parser(body: dict[str, Any]) -> None:
    headers = {"Content-Type": FORM}
    decoded = parse_qsl(encode_body(body, headers).decode(), keep_blank_values=True)
    assert decoded == form_pairs(body)


def test_the_approvals_preview_shows_the_form_as_sent(registry: Registry) -> None:
    """One Content-Type, the declared one; each pair percent-encoded on its own line, so a
    value holding '&' or a newline cannot pass for another field."""
    agent, _tool = agent_with_tool(
        registry, key="form.write", http_method="POST", egress_class="write",
        endpoint_url="https://api.example.com/charges", schema_input=OPEN_SCHEMA,
        request_template={"headers": {"Content-Type": FORM}},
    )  # fmt: skip
    registry.invoke(agent, "form.write", {"amount": 5, "note": "ok&\namount=999999"})
    [row] = registry.review_queue()
    shown = preview_request(row)
    assert [v for k, v in shown.headers if k.lower() == "content-type"] == [FORM]
    assert sorted((shown.body or "").split("&\n")) == ["amount=5", "note=ok%26%0Aamount%3D999999"]
    registry.update_tool(
        "form.write", {"request_template": {"headers": {"Content-Type": MULTIPART}}}
    )
    [row] = registry.review_queue()
    parts = json.loads(preview_request(row).body or "")
    assert sorted(parts) == [["amount", "5"], ["note", "ok&\namount=999999"]]
