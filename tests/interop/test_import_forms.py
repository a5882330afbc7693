"""An imported API whose writes are forms and whose credential is HTTP basic, dispatched for
real (issue 15): `toolrelay import openapi` on a Stripe/Twilio-shaped document, the calls
approved and sent by a worker to a loopback server that parses them (aiohttp's form parser;
the standard library's MIME parser for multipart, as the upstream fixture has read the
stream already)."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.dispatch.test_bodies import multipart_fields
from tests.dispatch.upstream import Upstream
from tests.interop.conftest import Owner
from toolrelay.credentials import CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.dispatch.worker import Worker

USER, PASSWORD = "AC123", "tw-secret-9f1e"
ARRAY = {"type": "array", "items": {"type": "string"}}


def document(base: str) -> dict[str, Any]:
    ok = {"200": {"description": "ok", "content": {"application/json": {"schema": {}}}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "forms", "version": "1"},
        "servers": [{"url": base}],
        "security": [{"basic": []}],
        "components": {"securitySchemes": {"basic": {"type": "http", "scheme": "basic"}}},
        "paths": {
            "/Messages.json": {"post": {
                "operationId": "send", "responses": ok,
                "requestBody": {"required": True, "content": {
                    "application/x-www-form-urlencoded": {
                        "schema": {"type": "object", "required": ["To", "Body"], "properties": {
                            "To": {"type": "string"}, "Body": {"type": "string"},
                            "MediaUrl": ARRAY,
                            "metadata": {"type": "object",
                                         "additionalProperties": {"type": "string"}},
                        }},
                        "encoding": {"metadata": {"style": "deepObject", "explode": True}},
                    }}},
            }},
            "/notes": {"post": {
                "operationId": "note", "responses": ok,
                "requestBody": {"required": True, "content": {"multipart/form-data": {
                    "schema": {"type": "object", "required": ["title"], "properties": {
                        "title": {"type": "string"}, "tags": ARRAY,
                        "extra": {"type": "object", "properties": {"n": {"type": "integer"}}},
                        "file": {"type": "string", "format": "binary"},
                    }},
                }}},
            }},
            "/things/{id}": {"patch": {
                "operationId": "patch", "responses": ok,
                "parameters": [{"name": "id", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "requestBody": {"content": {"application/merge-patch+json": {"schema": {
                    "type": "object", "properties": {"name": {"type": ["string", "null"]}}}}}},
            }},
        },
    }  # fmt: skip


async def test_forms_and_basic_reach_the_upstream_as_the_document_says(
    owner: Owner,
    db: Database,
    upstream: Upstream,
    drain: Callable[[], Awaitable[Worker]],
    interop_keyring: Keyring,
    tmp_path: Path,
) -> None:
    got: dict[str, dict[str, Any]] = {}

    async def parsed(request: web.Request, _hit: int) -> web.Response:
        if request.content_type == "multipart/form-data":
            fields = multipart_fields(request.headers["Content-Type"], await request.read())
        else:
            fields = [(k, str(v)) for k, v in (await request.post()).items()]
        got[request.path] = {
            "type": request.content_type,
            "auth": request.headers.get("Authorization"),
            "accept": request.headers.get("Accept"),
            "fields": sorted(fields, key=lambda kv: kv[0]),  # stable: an array keeps its order
            "body": None,
        }
        return web.json_response({"ok": True})

    async def patched(request: web.Request, _hit: int) -> web.Response:
        got[request.path] = {"type": request.content_type, "body": await request.json(),
                             "auth": request.headers.get("Authorization")}  # fmt: skip
        return web.json_response({"ok": True})

    upstream.routes |= {"/Messages.json": parsed, "/notes": parsed, "/things/7": patched}
    cred = str(
        CredentialStore(db, interop_keyring).add(
            owner.id, "basic", "twilio", json.dumps({"username": USER, "password": PASSWORD})
        )
    )
    path = tmp_path / "forms.json"
    path.write_text(json.dumps(document(upstream.base_url)))
    result = owner.cli("import", "openapi", str(path), "--credential", cred)
    assert result.exit_code == 0, result.output
    assert "warning: POST /notes: optional multipart field 'file' dropped" in result.stderr

    registry = owner.registry
    registry.create_agent("bot")
    for key in ("send", "note", "patch"):
        registry.assign("bot", key)
    made = [
        registry.invoke("bot", "send", {"To": "+1 555", "Body": "héllo & bye=1",
                                        "MediaUrl": ["https://a.test/1", "https://a.test/2"],
                                        "metadata": {"k": "v"}}),
        registry.invoke("bot", "note", {"title": "Hi", "tags": ["a", "b"], "extra": {"n": 2}}),
        registry.invoke("bot", "patch", {"id": "7", "name": None}),
    ]  # fmt: skip
    for invocation in made:
        assert registry.get_invocation(invocation)["status"] == "pending"  # writes wait
        registry.approve(invocation)
    await drain()
    for invocation in made:
        row = registry.get_invocation(invocation)
        assert row["status"] == "completed", row["error"]

    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert got["/Messages.json"] == {
        "type": "application/x-www-form-urlencoded", "auth": basic, "accept": "application/json",
        "fields": [("Body", "héllo & bye=1"), ("MediaUrl", "https://a.test/1"),
                   ("MediaUrl", "https://a.test/2"), ("To", "+1 555"), ("metadata[k]", "v")],
        "body": None,
    }  # fmt: skip
    assert got["/notes"] == {
        "type": "multipart/form-data", "auth": basic, "accept": "application/json",
        "fields": [("extra", '{"n": 2}'), ("tags", "a"), ("tags", "b"), ("title", "Hi")],
        "body": None,
    }  # fmt: skip
    assert got["/things/7"] == {
        "type": "application/merge-patch+json", "body": {"name": None}, "auth": basic,
    }  # fmt: skip
