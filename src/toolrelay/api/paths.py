"""Path and query parameters shared by the routes, and the invocation cursor."""

from __future__ import annotations

import asyncio
import base64
import time
from datetime import datetime
from typing import Annotated
from uuid import UUID

from fastapi import Path, Query, Request
from starlette.concurrency import run_in_threadpool

from toolrelay.db.connect import Row
from toolrelay.errors import InvalidArgument
from toolrelay.registry import Registry

TOOL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
NAME_PATTERN = r"^[^\x00]{1,200}$"
MAX_WAIT = 60.0  # seconds a long poll may last
WAIT_POLL_INTERVAL = 0.2  # seconds between looks at the database while waiting
FINISHED = frozenset({"completed", "failed", "rejected", "expired"})

ToolKey = Annotated[str, Path(pattern=TOOL_KEY_PATTERN, description="A tool key (or id).")]
AgentRef = Annotated[str, Path(pattern=NAME_PATTERN, description="An agent name or id.")]
Wait = Annotated[
    float,
    Query(
        ge=0,
        description=f"Seconds to wait for the invocation to finish (long poll; at most {MAX_WAIT:g}).",
    ),
]


def encode_cursor(row: Row) -> str:
    raw = f"{row['created_at'].isoformat()}|{row['id']}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, _, ident = raw.partition("|")
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None:
            raise ValueError("naive time")
        return when, UUID(ident)
    except ValueError:
        raise InvalidArgument("cursor is not one this API handed out") from None


async def wait_for_invocation(
    request: Request, registry: Registry, invocation_id: UUID, wait: float, agent: str | None
) -> Row:
    """The invocation, once finished or when ``wait`` seconds (capped) have passed."""
    deadline = time.monotonic() + min(wait, MAX_WAIT)
    while True:
        row = await run_in_threadpool(registry.get_invocation, invocation_id, agent=agent)
        if row["status"] in FINISHED or time.monotonic() >= deadline:
            return row
        if await request.is_disconnected():
            return row
        await asyncio.sleep(min(WAIT_POLL_INTERVAL, max(0.0, deadline - time.monotonic())))
