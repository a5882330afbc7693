"""The body checks of POST /posts and GET /posts, worded like NestJS's class-validator.

Each problem is "<field path> <problem>", the path dotted with list indexes
(`posts.0.value.0.content should not be empty`), as Nest's ValidationPipe reports nested
errors. One message per failing field: the first rule it breaks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

POST_TYPES = ("draft", "schedule", "now")
X_REPLY_SETTINGS = ("everyone", "following", "mentionedUsers", "subscribers", "verified")
_X_COMMUNITY = re.compile(r"https://x\.com/i/communities/\d+")

_UNDEFINED = "should not be null or undefined"
_NOT_ARRAY = "must be an array"
_NOT_OBJECT = "must be an object"
_NOT_STRING = "must be a string"
_EMPTY = "should not be empty"
_NOT_DATE = "must be a valid ISO 8601 date string"
_NO_ELEMENTS = "must contain at least 1 elements"

_ItemCheck = Callable[[dict[str, Any], str], list[str]]


def parse_iso_date(value: Any) -> datetime | None:
    """The instant an ISO 8601 string names (UTC when it has no offset), or None."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def date_problems(query: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    return [f"{name} {_NOT_DATE}" for name in names if parse_iso_date(query.get(name)) is None]


def create_post_problems(body: Any) -> list[str]:
    """Everything wrong with a POST /posts body that does not depend on the channel."""
    fields = body if isinstance(body, dict) else {}  # Nest validates a non-object as empty
    problems = [*_type_problems(fields), *_short_link_problems(fields)]
    if "date" not in fields or fields["date"] is None:
        problems.append(f"date {_UNDEFINED}")
    else:
        problems += date_problems(fields, ("date",))
    problems += _array_problems(fields, "tags", "tags", _tag_problems, min_size=0)
    problems += _array_problems(fields, "posts", "posts", _post_problems, min_size=1)
    return problems


def x_settings_problems(index: int, settings: Any) -> list[str]:
    """The settings an X channel insists on, for every post type including drafts."""
    fields = settings if isinstance(settings, dict) else {}
    path = f"posts.{index}.settings"
    problems = []
    if fields.get("who_can_reply_post") not in X_REPLY_SETTINGS:
        allowed = ", ".join(X_REPLY_SETTINGS)
        problems.append(f"{path}.who_can_reply_post must be one of the following values: {allowed}")
    community = fields.get("community")
    if community not in (None, "") and not _is_x_community(community):
        problems.append(
            f"{path}.community must be empty or a URL like https://x.com/i/communities/<digits>"
        )
    return problems


def _is_x_community(value: Any) -> bool:
    return isinstance(value, str) and _X_COMMUNITY.fullmatch(value) is not None


def _type_problems(fields: dict[str, Any]) -> list[str]:
    if fields.get("type") is None:
        return [f"type {_UNDEFINED}"]
    if fields["type"] not in POST_TYPES:
        return [f"type must be one of the following values: {', '.join(POST_TYPES)}"]
    return []


def _short_link_problems(fields: dict[str, Any]) -> list[str]:
    if fields.get("shortLink") is None:
        return [f"shortLink {_UNDEFINED}"]
    if not isinstance(fields["shortLink"], bool):
        return ["shortLink must be a boolean value"]
    return []


def _array_problems(
    fields: dict[str, Any], key: str, path: str, item_problems: _ItemCheck, *, min_size: int
) -> list[str]:
    """Checks `fields[key]` is an array of objects, then each item with `item_problems`."""
    items = fields.get(key)
    if items is None:
        return [f"{path} {_UNDEFINED}"]
    if not isinstance(items, list):
        return [f"{path} {_NOT_ARRAY}"]
    if len(items) < min_size:
        return [f"{path} {_NO_ELEMENTS}"]
    problems: list[str] = []
    for index, item in enumerate(items):
        item_path = f"{path}.{index}"
        if isinstance(item, dict):
            problems += item_problems(item, item_path)
        else:
            problems.append(f"{item_path} {_NOT_OBJECT}")
    return problems


def _string_problems(fields: dict[str, Any], key: str, path: str) -> list[str]:
    value = fields.get(key)
    if value is None:
        return [f"{path}.{key} {_UNDEFINED}"]
    return [] if isinstance(value, str) else [f"{path}.{key} {_NOT_STRING}"]


def _tag_problems(tag: dict[str, Any], path: str) -> list[str]:
    return _string_problems(tag, "value", path) + _string_problems(tag, "label", path)


def _post_problems(post: dict[str, Any], path: str) -> list[str]:
    problems = _integration_problems(post.get("integration"), f"{path}.integration")
    problems += _array_problems(post, "value", f"{path}.value", _value_problems, min_size=1)
    if post.get("group") is not None and not isinstance(post["group"], str):
        problems.append(f"{path}.group {_NOT_STRING}")
    if post.get("settings") is not None and not isinstance(post["settings"], dict):
        problems.append(f"{path}.settings {_NOT_OBJECT}")
    return problems


def _integration_problems(integration: Any, path: str) -> list[str]:
    if integration is None:
        return [f"{path} {_UNDEFINED}"]
    if not isinstance(integration, dict):
        return [f"{path} {_NOT_OBJECT}"]
    integration_id = integration.get("id")
    if not isinstance(integration_id, str) and integration_id is not None:
        return [f"{path}.id {_NOT_STRING}"]
    return [] if integration_id else [f"{path}.id {_EMPTY}"]


def _value_problems(value: dict[str, Any], path: str) -> list[str]:
    images = value.get("image")
    problems = _array_problems(value, "image", f"{path}.image", _image_problems, min_size=0)
    content = value.get("content")
    if content is not None and not isinstance(content, str):
        problems.append(f"{path}.content {_NOT_STRING}")
    elif not content and not (isinstance(images, list) and images):
        problems.append(f"{path}.content {_EMPTY}")
    return problems


def _image_problems(image: dict[str, Any], path: str) -> list[str]:
    return _string_problems(image, "path", path)
