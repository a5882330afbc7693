"""``notifications/tools/list_changed``: a version stamp of the agent's tools, checked on
the reads each request already makes.

Why a stamp and not LISTEN: tools/call's lookup (``agents.agent_call_target``) returns a
digest of the agent's tools (key, updated_at, gated), so comparing it with the one this
session last saw costs no query (a LISTEN channel needs triggers on tools and
assignments, and a listener per process fanning out to sessions). The price: a change is announced on the session's next
request, not the moment it happens. Handshake-era sessions only: from 2026-07-28 change
notifications travel on ``subscriptions/listen`` streams, which toolrelay does not serve.
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

__all__ = ["ListWatch"]


class ListWatch:
    """The stamp each session last saw; a different one is announced to that session."""

    def __init__(self) -> None:
        self._seen: WeakKeyDictionary[Any, str] = WeakKeyDictionary()

    async def seen(
        self, ctx: ServerRequestContext[Any, Any], current: str, *, notify: bool = True
    ) -> None:
        """Record the stamp of the tools this request saw (``agents.agent_tools_stamp``, the
        agent's tools version, migration 0035); if it changed since the session's last request (and ``notify``:
        not for tools/list, which answers the new list), say so."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        # ServerSession is made per request; the connection it wraps is the MCP session
        # (the SDK exposes no public accessor for it).
        session = getattr(ctx.session, "_connection", ctx.session)
        previous = self._seen.get(session)
        self._seen[session] = current
        if notify and previous is not None and previous != current:
            await ctx.session.send_notification(
                types.ToolListChangedNotification(), related_request_id=ctx.request_id
            )
