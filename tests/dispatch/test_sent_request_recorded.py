"""Each attempt records the request it sent — method, URL, headers, body size and sha256 —
equal to what the upstream received, the credential masked and never stored in any form."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from uuid import UUID

from aiohttp import web

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool, agent_with_tool
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.executor import MASK
from toolrelay.dispatch.spellings import secret_forms
from toolrelay.dispatch.worker import Worker
from toolrelay.registry import Registry
from toolrelay.registry.preview import MASK as PAGE_MASK

Drain = Callable[..., Awaitable[Worker]]
# Headers aiohttp adds to every request; toolrelay does not set them, so does not record them.
CLIENT_HEADERS = {"host", "content-length", "user-agent", "accept", "accept-encoding"}
SECRET = "sk/live+Key=9Z&x"  # characters a URL encodes, so every spelling is checked
REQUEST_COLUMNS = (
    "request_method",
    "request_url",
    "request_headers",
    "request_body_bytes",
    "request_body_sha256",
)


@dataclass
class Received:
    method: str
    url: str  # scheme, host and the request target exactly as sent
    headers: dict[str, str]
    body: bytes


def capture(upstream: Upstream, path: str) -> list[Received]:
    got: list[Received] = []

    async def handler(request: web.Request, _hit: int) -> web.Response:
        body = await request.read()
        url = f"{upstream.base_url}{request.raw_path}"
        got.append(Received(request.method, url, dict(request.headers), body))
        return web.json_response({"ok": True})

    upstream.routes[path] = handler
    return got


def credential(db: Database, registry: Registry) -> tuple[Keyring, UUID]:
    keyring = Keyring.parse(generate_master_key())
    return keyring, CredentialStore(db, keyring).add(registry.owner, "api_key", "k", SECRET)


def stored_attempts(db: Database, inv: UUID) -> list[dict[str, Any]]:
    """The attempt rows as the database holds them, every column."""
    with db.connect(autocommit=True) as conn:
        rows = conn.execute(
            "SELECT to_jsonb(a) AS row FROM agents.tool_invocation_attempts a"
            " WHERE invocation_id = %s ORDER BY attempt",
            (inv,),
        ).fetchall()
    return [r["row"] for r in rows]


def assert_no_secret(db: Database, inv: UUID) -> None:
    text = json.dumps(stored_attempts(db, inv), ensure_ascii=False)
    text += json.dumps(stored_attempts(db, inv))  # and its ASCII-escaped form
    leaked = [form for form in secret_forms(SECRET) if len(form) >= 4 and form in text]
    assert leaked == []


def assert_sent_as_recorded(attempt: dict[str, Any], seen: Received, unmask: str) -> None:
    """``unmask``: the credential's place as sent, for comparing what the mask stands for."""
    assert attempt["request_method"] == seen.method
    assert attempt["request_url"].replace(MASK, unmask) == seen.url
    recorded = {k.lower(): v.replace(MASK, unmask) for k, v in attempt["request_headers"].items()}
    received = {k.lower(): v for k, v in seen.headers.items() if k.lower() not in CLIENT_HEADERS}
    assert recorded == received
    assert attempt["request_body_bytes"] == len(seen.body)
    assert attempt["request_body_sha256"] == hashlib.sha256(seen.body).hexdigest()


async def test_header_credential_is_masked_and_the_rest_is_what_the_upstream_received(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    got = capture(upstream, "/posts")
    keyring, cred = credential(db, registry)
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/posts?lang=en",
        http_method="POST",
        egress_class="read_only",
        auth_method="api_key",
        credential_ref=cred,
        auth_param_name="Authorization",
        auth_param_prefix="Bearer ",
        request_template={
            "headers": {"X-Trace": "t-{{input.text}}"},
            "body": {"post": {"text": "{{input.text}}", "n": 1}},
        },
    )
    inv = registry.invoke(agent, tool["key"], {"text": "héllo wörld"})
    await drain(keyring=keyring)
    [seen] = got
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"  # what went out
    [attempt] = registry.get_invocation(inv)["attempts"]
    assert attempt["request_headers"]["Authorization"] == f"Bearer {PAGE_MASK}"
    assert attempt["request_headers"]["Content-Type"] == "application/json"
    assert attempt["request_url"] == f"{upstream.base_url}/posts?lang=en"
    assert_sent_as_recorded(attempt, seen, SECRET)
    assert attempt["request_body_bytes"] > 0
    assert_no_secret(db, inv)


async def test_query_credential_is_masked_and_other_query_values_are_kept(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    got = capture(upstream, "/search")
    keyring, cred = credential(db, registry)
    agent, tool = agent_with_tool(
        registry,
        endpoint_url=f"{upstream.base_url}/search?lang=en",
        auth_method="api_key",
        credential_ref=cred,
        auth_placement="query",
        auth_param_name="api_key",
    )
    inv = registry.invoke(agent, tool["key"], {"text": "cats & dogs"})
    await drain(keyring=keyring)
    [seen] = got
    sent_secret = quote(SECRET, safe="")
    assert f"api_key={sent_secret}" in seen.url  # it went out in the query
    [attempt] = registry.get_invocation(inv)["attempts"]
    assert attempt["request_url"].endswith(f"&api_key={PAGE_MASK}")
    assert "lang=en" in attempt["request_url"] and "text=cats" in attempt["request_url"]
    assert_sent_as_recorded(attempt, seen, sent_secret)
    # no body: zero bytes, and the digest of zero bytes
    assert (attempt["request_body_bytes"], attempt["request_body_sha256"]) == (
        0,
        hashlib.sha256(b"").hexdigest(),
    )
    assert_no_secret(db, inv)


async def test_attempts_refused_before_sending_record_no_request(
    registry: Registry, upstream: Upstream, drain: Drain, db: Database
) -> None:
    agent, tool = agent_with_tool(registry, endpoint_url=f"{upstream.base_url}/blocked")
    blocked = registry.invoke(agent, tool["key"], {})
    await drain(egress=EgressPolicy.from_env({}))  # the default: loopback refused
    keyless = add_tool(registry, key="keyless.get", endpoint_url=f"{upstream.base_url}/keyless",
                       auth_method="api_key")  # fmt: skip
    registry.assign(agent, keyless["key"])
    missing = registry.invoke(agent, keyless["key"], {})
    await drain()
    assert upstream.seen == []
    for inv, code in ((blocked, "egress_blocked"), (missing, "credential_missing")):
        [attempt] = registry.get_invocation(inv)["attempts"]
        assert attempt["error_code"] == code
        assert [attempt[c] for c in REQUEST_COLUMNS] == [None] * len(REQUEST_COLUMNS)
