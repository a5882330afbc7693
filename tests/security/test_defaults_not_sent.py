"""Finding 12: a JSON Schema ``default`` is an annotation, never a value sent.

An imported GitHub ``repos/update`` called with ``{owner, repo, description}`` sent 17 more
fields from the spec's defaults (``private: false``…), and every imported GET added
``per_page=30&page=1``. Now a member the caller omitted is omitted, unless the owner's
template states it as a constant.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import agent_with_tool
from toolrelay.dispatch.worker import Worker
from toolrelay.export.openapi import tools_from_openapi
from toolrelay.registry import Registry

Drain = Callable[..., Awaitable[Worker]]

REPO_SCHEMA = {
    "type": "object",
    "properties": {
        "description": {"type": "string"},
        "private": {"type": "boolean", "default": False},
        "archived": {"type": "boolean", "default": False},
        "visibility": {"enum": ["public", "private"], "default": "public"},
    },
}


async def sent_body(registry: Registry, upstream: Upstream, drain: Drain, **tool: Any) -> Any:
    agent, row = agent_with_tool(registry, **tool)
    inv_id = registry.invoke(agent, row["key"], {"description": "new words"})
    await drain()
    inv = registry.get_invocation(inv_id)
    assert inv["status"] == "completed", inv["error"]
    [seen] = upstream.seen
    return seen.body


async def test_merged_input_sends_only_what_the_caller_gave(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    body = await sent_body(registry, upstream, drain, endpoint_url=f"{upstream.base_url}/r",
                           http_method="PATCH", egress_class="read_only",
                           schema_input=REPO_SCHEMA)  # fmt: skip
    assert body == {"description": "new words"}


async def test_placeholders_for_omitted_members_are_omitted(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    template = {"body": {"description": "{{input.description}}",
                         "private": "{{input.private}}", "archived": "{{input.archived}}"}}  # fmt: skip
    body = await sent_body(registry, upstream, drain, endpoint_url=f"{upstream.base_url}/r",
                           http_method="PATCH", egress_class="read_only",
                           schema_input=REPO_SCHEMA, request_template=template)  # fmt: skip
    assert body == {"description": "new words"}


async def test_a_constant_in_the_template_is_sent(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    template = {"body": {"visibility": "private"}}
    body = await sent_body(registry, upstream, drain, endpoint_url=f"{upstream.base_url}/r",
                           http_method="PATCH", egress_class="read_only",
                           schema_input=REPO_SCHEMA, request_template=template)  # fmt: skip
    assert body == {"visibility": "private", "description": "new words"}


def github_like(base: str) -> dict[str, Any]:
    repo = {"name": "repo", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "GitHub-like", "version": "1"},
        "servers": [{"url": base}],
        "paths": {
            "/repos/{repo}": {
                "patch": {
                    "operationId": "repos/update",
                    "parameters": [repo],
                    "requestBody": {"content": {"application/json": {"schema": REPO_SCHEMA}}},
                    "responses": {"200": {"description": "ok"}},
                }
            },
            "/repos/{repo}/issues": {
                "get": {
                    "operationId": "issues/list",
                    "parameters": [
                        repo,
                        {
                            "name": "per_page",
                            "in": "query",
                            "schema": {"type": "integer", "default": 30},
                        },
                        {
                            "name": "page",
                            "in": "query",
                            "schema": {"type": "integer", "default": 1},
                        },
                    ],
                    "responses": {"200": {"description": "ok"}},
                }
            },
        },
    }


async def test_imported_operations_send_no_defaults(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    plan = tools_from_openapi(github_like(upstream.base_url), key_prefix="gh.")
    for spec in plan.tools:
        registry.register_tool(spec)
    registry.create_agent("bot")
    for spec in plan.tools:
        registry.assign("bot", spec.key)
    update = registry.invoke("bot", "gh.repos_update", {"repo": "r", "description": "hi"})
    listing = registry.invoke("bot", "gh.issues_list", {"repo": "r"})
    registry.approve(update)
    await drain()
    for inv_id in (update, listing):
        inv = registry.get_invocation(inv_id)
        assert inv["status"] == "completed", inv["error"]
    sent = {s.method: s for s in upstream.seen}
    assert sent["PATCH"].path == "/repos/r" and sent["PATCH"].body == {"description": "hi"}
    assert sent["GET"].path == "/repos/r/issues" and sent["GET"].query == {}
