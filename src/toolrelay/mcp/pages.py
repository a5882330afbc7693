"""tools/list in pages: keyset on the tool key, behind an opaque cursor.

A page holds at most ``PAGE_TOOLS`` tools and about ``PAGE_BYTES`` of JSON, so no
streamable-HTTP event nears the SDK client's 1 MiB limit (a GitHub-sized import is 6 MB
listed whole). The cursor names the last key sent, not an offset: tools added or removed
between pages neither repeat nor skip the others.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Final

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

__all__ = ["PAGE_BYTES", "PAGE_TOOLS", "after_key", "cursor_for", "page"]

PAGE_TOOLS: Final = 100
PAGE_BYTES: Final = 512 * 1024  # half the SDK client's event limit, for the envelope
CURSOR_VERSION: Final = "k1"


def cursor_for(key: str) -> str:
    raw = json.dumps([CURSOR_VERSION, key], ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def after_key(cursor: str | None) -> str | None:
    """The key a cursor continues after; a cursor not made by ``cursor_for`` is refused."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        version, key = json.loads(raw)
        if version != CURSOR_VERSION or not isinstance(key, str):
            raise ValueError(version)
    except (binascii.Error, ValueError, TypeError, RecursionError):  # nested too deep too
        raise MCPError(INVALID_PARAMS, f"invalid cursor: {cursor[:80]!r}") from None
    return key


def page(tools: Sequence[types.Tool], cursor: str | None) -> tuple[list[types.Tool], str | None]:
    """The tools after the cursor (``tools`` sorted by name), and the next page's cursor."""
    after = after_key(cursor)
    rest = [tool for tool in tools if after is None or tool.name > after]
    taken: list[types.Tool] = []
    size = 0
    for tool in rest:
        size += len(tool.model_dump_json(by_alias=True, exclude_none=True))
        if taken and (len(taken) == PAGE_TOOLS or size > PAGE_BYTES):
            break
        taken.append(tool)
    more = len(taken) < len(rest)
    return taken, cursor_for(taken[-1].name) if more else None
