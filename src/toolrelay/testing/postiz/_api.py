"""The /public/v1 endpoints: thin handlers over PostizState."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from . import _errors as errors
from ._models import INVOCATION_HEADER, Integration, Organization, Post, new_id
from ._state import PostizState
from ._validation import (
    create_post_problems,
    date_problems,
    parse_iso_date,
    x_settings_problems,
)
from ._xtext import is_too_long_for_x

STATE = web.AppKey("postiz_state", PostizState)
API_PREFIX = web.AppKey("postiz_api_prefix", str)  # "/api" behind the front proxy, else ""
PUBLIC = "/public/v1"
_POST_STATE = {"draft": "DRAFT", "schedule": "QUEUE", "now": "QUEUE"}


def add_api_routes(app: web.Application, prefix: str) -> None:
    """Routes under `prefix`, then a Nest-style JSON 404 for anything else under it."""
    base = prefix + PUBLIC
    app.router.add_get(base + "/is-connected", is_connected)
    app.router.add_get(base + "/integrations", list_integrations)
    app.router.add_post(base + "/posts", create_posts)
    app.router.add_get(base + "/posts", list_posts)
    app.router.add_delete(base + "/posts/{id}", delete_post)
    app.router.add_route("*", prefix + "/{tail:.*}", unknown_route)


async def is_connected(request: web.Request) -> web.Response:
    _authenticate(request)
    return web.json_response({"connected": True})


async def list_integrations(request: web.Request) -> web.Response:
    org = _authenticate(request)
    return web.json_response([i.to_json() for i in org.integrations])


async def list_posts(request: web.Request) -> web.Response:
    org = _authenticate(request)
    problems = date_problems(dict(request.query), ("startDate", "endDate"))
    if problems:
        raise errors.bad_request(problems)
    start, end = _instant(request.query["startDate"]), _instant(request.query["endDate"])
    posts = [p for p in request.app[STATE].live_posts(org.id) if start <= p.publish_date <= end]
    posts.sort(key=lambda p: p.publish_date)
    return web.json_response({"posts": [_post_json(p) for p in posts]})


async def delete_post(request: web.Request) -> web.Response:
    org = _authenticate(request)
    if not request.app[STATE].delete_post_group(org.id, request.match_info["id"]):
        raise errors.internal_error()  # Postiz dereferences the missing post and crashes
    return web.json_response({"error": True})  # sic: Postiz's answer to a successful delete


async def create_posts(request: web.Request) -> web.Response:
    """Throttled before anything else is looked at; the limit headers go on every answer."""
    org = _authenticate(request)
    decision = request.app[STATE].limiter.hit(org.id)
    try:
        if not decision.allowed:
            raise errors.too_many_requests()
        response = await _create_posts(request, org)
    except errors.ApiError as exc:
        response = exc.response()
    response.headers.update(decision.headers())
    return response


async def unknown_route(request: web.Request) -> web.Response:
    path = request.path.removeprefix(request.app[API_PREFIX])
    raise errors.not_found(request.method, path)


def _authenticate(request: web.Request) -> Organization:
    """The raw header is the key: `Bearer <key>` is just an unknown key."""
    api_key = request.headers.get("Authorization", "")
    if not api_key:
        raise errors.unauthorized("No API Key found")
    org = request.app[STATE].org_by_key(api_key)
    if org is None:
        raise errors.unauthorized("Invalid API key")
    return org


async def _create_posts(request: web.Request, org: Organization) -> web.Response:
    body = await _json_body(request)
    problems = create_post_problems(body)
    if problems:
        raise errors.bad_request(problems)
    channels = [_channel(org, entry) for entry in body["posts"]]
    _check_provider_rules(body, channels)
    invocation = request.headers.get(INVOCATION_HEADER)
    posts = _build_posts(body, org, channels, invocation)
    request.app[STATE].add_posts(posts, invocation)
    created = [{"postId": p.id, "integration": p.integration.id} for p in posts]
    return web.json_response(created, status=201)


async def _json_body(request: web.Request) -> Any:
    if request.content_type != "application/json":
        return {}  # Express's JSON parser skips other types; Nest then validates an empty DTO
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise errors.bad_request(f"Unexpected token in JSON at position {_error_pos(exc)}") from exc


def _error_pos(exc: ValueError) -> int:
    return exc.pos if isinstance(exc, json.JSONDecodeError) else 0


def _channel(org: Organization, entry: dict[str, Any]) -> Integration:
    integration_id = entry["integration"]["id"]
    channel = org.integration(integration_id)
    if channel is None:
        raise errors.bad_request(f"Integration with id {integration_id} not found")
    return channel


def _check_provider_rules(body: dict[str, Any], channels: list[Integration]) -> None:
    problems: list[str] = []
    for index, (entry, channel) in enumerate(zip(body["posts"], channels, strict=True)):
        if channel.identifier == "x":
            problems += x_settings_problems(index, entry.get("settings"))
    if problems:
        raise errors.bad_request(problems)
    if body["type"] == "draft":
        return  # drafts are never length-checked
    for entry, channel in zip(body["posts"], channels, strict=True):
        if channel.identifier == "x" and any(_too_long(value) for value in entry["value"]):
            raise errors.post_too_long("x", channel.name)


def _too_long(value: dict[str, Any]) -> bool:
    return is_too_long_for_x(value.get("content") or "")


def _build_posts(
    body: dict[str, Any], org: Organization, channels: list[Integration], invocation: str | None
) -> list[Post]:
    group = new_id()
    publish_date = _instant(body["date"])
    return [
        Post(
            id=new_id(),
            organization_id=org.id,
            integration=channel,
            group=entry.get("group") or group,
            values=entry["value"],
            publish_date=publish_date,
            state=_POST_STATE[body["type"]],
            settings=entry.get("settings") or {},
            invocation_id=invocation,
        )
        for entry, channel in zip(body["posts"], channels, strict=True)
    ]


def _instant(validated_date: str) -> datetime:
    moment = parse_iso_date(validated_date)
    assert moment is not None, "dates are validated before use"
    return moment


def _iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _post_json(post: Post) -> dict[str, Any]:
    return {
        "id": post.id,
        "content": post.content,
        "publishDate": _iso_utc(post.publish_date),
        "releaseURL": None,
        "state": post.state,
        "group": post.group,
        "settings": json.dumps(post.settings),  # a JSON string, as Postiz stores it
        "image": json.dumps(post.values[0].get("image", [])),
        "intervalInDays": None,
        "integration": {
            "id": post.integration.id,
            "name": post.integration.name,
            "providerIdentifier": post.integration.identifier,
            "picture": post.integration.picture,
        },
    }
