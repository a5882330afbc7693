"""The MCP server for agents: an agent's tools as MCP tools, and tool calls as invocations.

One low-level ``mcp.server.lowlevel.Server`` serves one door (stdio or streamable HTTP).
Every request resolves its caller first (``CallerFor``): over stdio the agent token is
checked again on each request, so revoking it takes effect at once; over HTTP the bearer
header of the request that carried the message decides (``toolrelay.mcp.http``). The work
is then done by ``Registry(db, owner, agent_id=...)``, as for the HTTP API, so the SQL
functions and row-level security see the agent.

- ``tools/list``: the agent's assigned, allowed, active tools. ``inputSchema`` is the tool's
  ``schema_input``; ``outputSchema`` its ``schema_output`` when that is an object schema with
  properties and a call can answer with it (not for tools whose calls wait for approval);
  annotations follow whether a call is gated, then ``egress_class``. Plus
  ``toolrelay_invocation_status``. In pages (``toolrelay.mcp.pages``).
- ``tools/call``: ``Registry.invoke`` as the agent, then wait up to ``wait_seconds`` for the
  outcome, woken by its NOTIFY (``toolrelay.dispatch.outcomes``); the dispatcher runs
  elsewhere (``toolrelay serve``'s in-process worker or ``toolrelay worker``). docs/mcp.md
  describes every answer.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeVar
from uuid import UUID

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST

from toolrelay import __version__
from toolrelay.db import Database
from toolrelay.db.connect import Row
from toolrelay.dispatch.handoff import HandOff
from toolrelay.dispatch.outcomes import Outcomes
from toolrelay.errors import (
    ConfigurationError,
    InvalidArgument,
    PermissionDenied,
    ToolrelayError,
)
from toolrelay.export.names import key_for, may_be_exported
from toolrelay.mcp.changes import ListWatch
from toolrelay.mcp.limits import (
    DEFAULT_SESSIONS_PER_AGENT,
    DEFAULT_SESSIONS_PER_OWNER,
    DEFAULT_WAIT_SECONDS,
    MAX_SESSIONS,
    MAX_SESSIONS_PER_OWNER,
    MAX_WAIT_SECONDS,
    SESSIONS_PER_AGENT_ENV,
    SESSIONS_PER_OWNER_ENV,
    WAIT_ENV,
)
from toolrelay.mcp.pages import after_key, page
from toolrelay.registry import Registry
from toolrelay.registry.service import Called, Claim
from toolrelay.registry.validation import validator
from toolrelay.tokens import Authenticator, Caller, Unauthenticated

__all__ = [
    "FINISHED",
    "STATUS_TOOL",
    "WAIT_ENV",
    "CallerFor",
    "McpSettings",
    "annotations_for",
    "build_server",
    "input_schema_for",
    "mcp_tool",
    "output_schema_for",
    "token_caller",
]

STATUS_TOOL: Final = "toolrelay_invocation_status"
MAX_STATUS_WAIT: Final = 30.0  # the most one toolrelay_invocation_status call waits
FINISHED: Final = frozenset({"completed", "failed", "rejected", "expired"})
META_INVOCATION: Final = "toolrelay/invocation"
META_REQUIRES_APPROVAL: Final = "toolrelay/requiresApproval"
META_OUTPUT_SCHEMA: Final = "toolrelay/outputSchema"
# When an unfinished call is worth asking about again: a running one is woken by its
# outcome (the status tool waits), a pending one waits for a human (it answers at once).
RETRY_RUNNING_SECONDS: Final = 1.0
RETRY_PENDING_SECONDS: Final = 30.0

INSTRUCTIONS: Final = (
    "toolrelay tools. A call that writes to the world waits for a human's approval: its "
    "answer says so and gives an invocation id; nothing has been sent yet, so do not call "
    f"the tool again for the same action. Use {STATUS_TOOL} with that id (and wait_seconds) "
    "to learn the outcome."
)

CallerFor = Callable[[ServerRequestContext[Any, Any]], Awaitable[Caller]]
"""Who sends this request: an agent, or an MCPError that refuses it."""

T = TypeVar("T")
log = logging.getLogger("toolrelay.mcp")


@dataclass(frozen=True)
class McpSettings:
    """How long ``tools/call`` waits for an outcome; how many MCP sessions (streamable
    HTTP) each agent, and each owner (all its agents together), may have open at once in a
    process."""

    wait_seconds: float = DEFAULT_WAIT_SECONDS
    sessions_per_agent: int = DEFAULT_SESSIONS_PER_AGENT
    sessions_per_owner: int = DEFAULT_SESSIONS_PER_OWNER

    def __post_init__(self) -> None:
        if not 0 <= self.wait_seconds <= MAX_WAIT_SECONDS:
            raise ConfigurationError(
                f"the MCP wait must be between 0 and {MAX_WAIT_SECONDS:g} seconds,"
                f" got {self.wait_seconds:g}"
            )
        if not 1 <= self.sessions_per_agent <= MAX_SESSIONS:
            raise ConfigurationError(
                f"{SESSIONS_PER_AGENT_ENV} must be between 1 and {MAX_SESSIONS} (the sessions"
                f" a process holds), got {self.sessions_per_agent}"
            )
        if not 1 <= self.sessions_per_owner <= MAX_SESSIONS_PER_OWNER:
            raise ConfigurationError(
                f"{SESSIONS_PER_OWNER_ENV} must be between 1 and {MAX_SESSIONS_PER_OWNER} (half"
                f" the {MAX_SESSIONS} sessions a process holds: one tenant never takes them"
                f" all), got {self.sessions_per_owner}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> McpSettings:
        """TOOLRELAY_MCP_WAIT_SECONDS, TOOLRELAY_MCP_SESSIONS_PER_AGENT and
        TOOLRELAY_MCP_SESSIONS_PER_OWNER, else defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        raw = env.get(WAIT_ENV, "").strip()
        if raw:
            try:
                values["wait_seconds"] = float(raw)
            except ValueError:
                raise ConfigurationError(f"{WAIT_ENV} is not a number: {raw!r}") from None
        for name, field_name in (
            (SESSIONS_PER_AGENT_ENV, "sessions_per_agent"),
            (SESSIONS_PER_OWNER_ENV, "sessions_per_owner"),
        ):
            raw = env.get(name, "").strip()
            if raw:
                try:
                    values[field_name] = int(raw)
                except ValueError:
                    raise ConfigurationError(f"{name} is not a whole number: {raw!r}") from None
        return cls(**values)


# --- tool definitions ---------------------------------------------------------------------


def input_schema_for(row: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's schema_input; MCP needs ``type: object`` at the root, added when absent."""
    schema: dict[str, Any] = dict(row.get("schema_input") or {})
    if validator(schema).refusal is not None:
        # Stored past registration with a remote reference: never hand it to a client,
        # which might fetch it. Calls are refused (invalid_input) anyway.
        return {"type": "object"}
    schema.setdefault("type", "object")
    return schema


def _object_schema(schema: Any) -> bool:
    return (
        isinstance(schema, Mapping)
        and schema.get("type") == "object"
        and isinstance(schema.get("properties"), Mapping)
        and bool(schema["properties"])
    )


def output_schema_for(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """schema_output when it is an object schema with properties and the call can answer
    with it: a gated tool's call first answers "waiting for approval", which a client would
    check against outputSchema and refuse, so gated tools declare none."""
    schema = row.get("schema_output")
    if not isinstance(schema, Mapping) or not _object_schema(schema) or row.get("gated"):
        return None
    if validator(schema).refusal is not None:
        return None
    return dict(schema)


def annotations_for(row: Mapping[str, Any]) -> types.ToolAnnotations:
    """Hints from whether a call is gated, then egress_class: a call that waits for a human
    (a write, or an endpoint with egress left at none) is announced as a write, never as
    read-only; an ungated read_only tool reads, an ungated none stays inside."""
    egress = row.get("egress_class")
    title = row.get("name") or None
    if row.get("gated") or egress not in ("read_only", "none"):
        return types.ToolAnnotations(
            title=title,
            read_only_hint=False,
            destructive_hint=True,
            open_world_hint=egress != "none",
        )
    if egress == "read_only":
        return types.ToolAnnotations(
            title=title, read_only_hint=True, destructive_hint=False, open_world_hint=True
        )
    return types.ToolAnnotations(title=title, read_only_hint=True, open_world_hint=False)


UNFINISHED_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "The call has not finished yet: ask toolrelay_invocation_status again.",
    "properties": {
        "invocation_id": {"type": "string"},
        "tool": {"type": "string"},
        "status": {"type": "string"},
        "approval_status": {"type": "string"},
        "retry_after_seconds": {"type": "number"},
        "next": {"type": "object"},
        "message": {"type": "string"},
    },
    "required": ["invocation_id", "status", "retry_after_seconds", "next"],
}
ROOT_KEYWORDS: Final = ("$schema", "$id", "$defs", "definitions")


def declared_output_schema(schema: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What tools/list announces: the output, or the "not finished yet" status a call still
    running when the wait ends answers (not an error, so the client checks it against this).
    Root keywords stay at the root so the schema's ``#/$defs/...`` references still resolve."""
    if schema is None:
        return None
    root = {k: schema[k] for k in ROOT_KEYWORDS if k in schema}
    output = {k: v for k, v in schema.items() if k not in ROOT_KEYWORDS}
    return root | {"type": "object", "anyOf": [output, UNFINISHED_SCHEMA]}


def mcp_tool(row: Mapping[str, Any]) -> types.Tool:
    """One registry tool (a row of ``Registry.agent_tools``) as an MCP tool."""
    meta: dict[str, Any] = {META_REQUIRES_APPROVAL: bool(row.get("gated"))}
    schema_output = row.get("schema_output")
    if (
        row.get("gated")
        and isinstance(schema_output, Mapping)
        and _object_schema(schema_output)
        and validator(schema_output).refusal is None
    ):
        meta[META_OUTPUT_SCHEMA] = schema_output  # what a completed call will hold
    return types.Tool(
        name=row["key"],
        title=row.get("name") or None,
        description=row.get("description") or row.get("name") or None,
        input_schema=input_schema_for(row),
        output_schema=declared_output_schema(output_schema_for(row)),
        annotations=annotations_for(row),
        _meta=meta,
    )


STATUS_OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "invocation_id": {"type": "string"},
        "tool": {"type": "string"},
        "status": {"enum": ["pending", "running", "completed", "failed", "rejected", "expired"]},
        "approval_status": {"type": "string"},
        "output": {"description": "The tool's output, once completed."},
        "error_code": {"type": ["string", "null"]},
        "error": {"type": ["string", "null"]},
        "message": {"type": "string"},
        "retry_after_seconds": {"type": "number", "description": "Until finished."},
        "next": {"type": "object", "description": "Until finished: the call to make then."},
    },
    "required": ["invocation_id", "tool", "status", "approval_status", "message"],
}


def status_tool() -> types.Tool:
    return types.Tool(
        name=STATUS_TOOL,
        title="Invocation status",
        description=(
            "The state of one of your earlier tool calls, by the invocation id its answer "
            "gave: waiting for a human's approval, running, completed (with the output), "
            "failed, rejected or expired. wait_seconds (at most "
            f"{MAX_STATUS_WAIT:g}) waits that long for it to finish."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "invocation_id": {"type": "string", "format": "uuid"},
                "wait_seconds": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_STATUS_WAIT,
                    "default": 0,
                },
            },
            "required": ["invocation_id"],
            "additionalProperties": False,
        },
        output_schema=STATUS_OUTPUT_SCHEMA,
        annotations=types.ToolAnnotations(
            title="Invocation status",
            read_only_hint=True,
            idempotent_hint=True,
            open_world_hint=False,
        ),
    )


# --- answers ------------------------------------------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, indent=2)


def _status(row: Row) -> dict[str, Any]:
    return {
        "invocation_id": str(row["id"]),
        "tool": row["tool_key"],
        "status": row["status"],
        "approval_status": row["approval_status"],
        "error_code": row.get("error_code"),
        "error": row.get("error"),
    }


def _describe(row: Row, waited: float) -> str:
    """One sentence for the model, saying what happened and what to do next."""
    tool, ident, status = row["tool_key"], row["id"], row["status"]
    poll = f'call {STATUS_TOOL} with {{"invocation_id": "{ident}"}}'
    if status == "pending":
        return (
            f"The call to {tool} awaits a human's approval (invocation {ident}). Nothing has "
            f"been sent yet; do not call {tool} again for this. To learn the outcome, {poll}, "
            'optionally with "wait_seconds".'
        )
    if status == "running":
        return (
            f"The call to {tool} was accepted and is still running after {waited:g} s "
            f"(invocation {ident}); do not call it again for this. To learn the outcome, {poll}."
        )
    if status == "completed":
        return f"The call to {tool} completed (invocation {ident})."
    if status == "rejected":
        reason = row.get("reject_reason")
        return f"A human rejected the call to {tool} (invocation {ident})" + (
            f": {reason}" if reason else "."
        )
    if status == "expired":
        return (
            f"The call to {tool} was not approved in time and expired (invocation {ident}); "
            "nothing was sent."
        )
    return f"The call to {tool} failed ({row.get('error_code')}): {row.get('error')}"


def _text(text: str) -> list[types.ContentBlock]:
    return [types.TextContent(text=text)]


def error_result(
    code: str, message: str, meta: dict[str, Any] | None = None
) -> types.CallToolResult:
    return types.CallToolResult(
        content=_text(f"{code}: {message}"),
        is_error=True,
        _meta={META_INVOCATION: {"error_code": code, "error": message}} | (meta or {}),
    )


def unfinished(row: Row, waited: float) -> dict[str, Any]:
    """A call not finished yet, as structured content: when and how to ask again."""
    retry = RETRY_PENDING_SECONDS if row["status"] == "pending" else RETRY_RUNNING_SECONDS
    arguments = {"invocation_id": str(row["id"]), "wait_seconds": MAX_STATUS_WAIT}
    return _status(row) | {
        "retry_after_seconds": retry,
        "next": {"tool": STATUS_TOOL, "arguments": arguments},
        "message": _describe(row, waited),
    }


def invocation_result(
    row: Row, output_schema: Mapping[str, Any] | None, waited: float
) -> types.CallToolResult:
    """What ``tools/call`` answers for the invocation as it now stands."""
    meta = {META_INVOCATION: _status(row)}
    status = row["status"]
    if status not in FINISHED:
        # Awaiting approval or still running is not a failure: a status the tool's declared
        # outputSchema admits (declared_output_schema), saying when to ask again.
        state = unfinished(row, waited)
        return types.CallToolResult(
            content=_text(state["message"]),
            structured_content=state,
            _meta=meta,
        )
    if status != "completed":
        return types.CallToolResult(
            content=_text(_describe(row, waited)), is_error=True, _meta=meta
        )
    output = row.get("output")
    if output_schema is not None and not validator(output_schema).is_valid(output):
        # The call was made (its side effect, if any, happened): say so, and show the output.
        return types.CallToolResult(
            content=_text(
                f"The call to {row['tool_key']} completed (invocation {row['id']}) but its "
                "output does not match the tool's outputSchema; do not repeat the call for "
                f"this. Output:\n{_json(output)}"
            ),
            is_error=True,
            _meta=meta,
        )
    structured = output if isinstance(output, dict) else None
    return types.CallToolResult(
        content=_text(_json(output)),
        structured_content=structured,
        _meta=meta,
    )


def status_result(row: Row, waited: float) -> types.CallToolResult:
    """What ``toolrelay_invocation_status`` answers: the state, and the output when done."""
    status = _status(row)
    message = _describe(row, waited)
    if row["status"] == "completed":
        status["output"] = row.get("output")
        text = f"{message} Output:\n{_json(row.get('output'))}"
    elif row["status"] not in FINISHED:
        status = unfinished(row, waited)
        text = message
    else:
        text = message
    status["message"] = message
    return types.CallToolResult(
        content=_text(text),
        structured_content=status,
        is_error=row["status"] in ("failed", "rejected", "expired"),
        _meta={META_INVOCATION: _status(row)},
    )


# --- the server ---------------------------------------------------------------------------


async def _run(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Database work is synchronous: run it in a worker thread."""
    return await anyio.to_thread.run_sync(partial(func, *args, **kwargs))


async def _protocol_error(func: Callable[..., T], *args: Any) -> T:
    """Run database work; a failure (the database is down) is a JSON-RPC error."""
    try:
        return await _run(func, *args)
    except ToolrelayError as exc:
        log.warning("MCP request failed: %s", exc.message, extra={"action": "mcp_error"})
        message = (
            exc.message
            if exc.code != ToolrelayError.code
            else "internal error (see the server log)"
        )
        raise MCPError(INTERNAL_ERROR, f"toolrelay: {message}") from None


def _tools_and_stamp(registry: Registry, agent: str) -> tuple[list[Row], str]:
    return registry.agent_tools(agent), registry.tools_stamp()


def unknown_tool(name: str) -> MCPError:
    return MCPError(INVALID_PARAMS, f"Unknown tool: {name}")


class _Handlers:
    def __init__(
        self,
        db: Database,
        caller_for: CallerFor,
        settings: McpSettings,
        outcomes: Outcomes,
        handoff: HandOff | None = None,
        forget: Callable[[Caller], None] | None = None,
    ) -> None:
        self.db = db
        self.caller_for = caller_for
        self.settings = settings
        self.outcomes = outcomes
        self.handoff = handoff or HandOff()
        self.forget = forget  # a remembered token the call's check refused (migration 0039)
        self.watch = ListWatch()

    async def _caller(self, ctx: ServerRequestContext[Any, Any], calling: bool = False) -> Caller:
        """``calling``: the request makes a call, which may check an unchecked token."""
        caller = await self.caller_for(ctx)
        if caller.agent_id is None:  # the caller sources refuse owners; never act as one
            raise MCPError(INVALID_REQUEST, "MCP serves agents only")
        if caller.unchecked is not None and not calling:  # the door defers only calls
            raise MCPError(INTERNAL_ERROR, "this request's token was not checked")
        return caller

    async def _registry(
        self, ctx: ServerRequestContext[Any, Any], calling: bool = False
    ) -> tuple[Registry, str]:
        caller = await self._caller(ctx, calling)
        registry = Registry(
            self.db, caller.owner, agent_id=caller.agent_id, token_check=caller.token_check
        )
        return registry, str(caller.agent_id)

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        after_key(cursor)  # a bad cursor is refused before any database work
        registry, agent = await self._registry(ctx)
        rows, stamp = await _protocol_error(_tools_and_stamp, registry, agent)
        # Sorted here, not by the database's collation: the cursor compares keys in Python.
        tools = sorted(
            (*(mcp_tool(row) for row in rows if row["key"] != STATUS_TOOL), status_tool()),
            key=lambda tool: tool.name,
        )
        await self.watch.seen(ctx, stamp, notify=False)
        taken, next_cursor = page(tools, cursor)
        return types.ListToolsResult(
            tools=taken, next_cursor=next_cursor, ttl_ms=0, cache_scope="private"
        )

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        registry, agent = await self._registry(ctx, calling=params.name != STATUS_TOOL)
        arguments = dict(params.arguments or {})
        if params.name == STATUS_TOOL:
            return await self._status(registry, agent, arguments)
        mark = self.outcomes.mark()  # before the call: its first read may be skipped

        async def making(claim: Claim | None) -> Called:
            # In the event loop (db/aio.py): a hand-off to a thread cost more than the trip.
            called = await registry.call_async(params.name, arguments, _reason(params), claim)
            if called.tool is None and may_be_exported(params.name):  # another client's name
                rows = await _run(registry.agent_tools, agent)
                key = key_for(params.name, (r["key"] for r in rows))
                if key is not None and key != params.name:
                    called = await registry.call_async(key, arguments, _reason(params), claim)
            return called

        try:  # with a slot of the in-process worker, if there is one (dispatch/handoff.py)
            called = await self.handoff.make(
                making, lambda called: called.invocation_id, registry.owner
            )
        except Unauthenticated as exc:  # a remembered token the call's check refused
            if self.forget is not None:
                self.forget(await self.caller_for(ctx))  # the next request is a 401
            raise MCPError(INVALID_REQUEST, exc.message) from None
        except ToolrelayError as exc:  # invalid_input, the database is down, ...
            return error_result(exc.code, exc.message)
        await self.watch.seen(ctx, called.stamp)
        if called.tool is None or called.invocation_id is None:
            raise unknown_tool(params.name)  # unassigned, denied, disabled or unknown
        row, invocation_id = called.tool, called.invocation_id
        started = time.monotonic()
        try:
            invocation = await self._wait(
                registry, agent, invocation_id, self.settings.wait_seconds, mark, own=True
            )
        except ToolrelayError as exc:  # the call is recorded; say how to find it again
            return error_result(
                exc.code,
                f"{exc.message} (the call was recorded as invocation {invocation_id};"
                f" ask {STATUS_TOOL} later)",
            )
        return invocation_result(invocation, output_schema_for(row), time.monotonic() - started)

    async def _status(
        self, registry: Registry, agent: str, arguments: dict[str, Any]
    ) -> types.CallToolResult:
        try:
            invocation_id, wait = _status_arguments(arguments)
            started = time.monotonic()
            invocation = await self._wait(registry, agent, invocation_id, wait)
        except ToolrelayError as exc:
            return error_result(exc.code, exc.message)
        return status_result(invocation, time.monotonic() - started)

    async def _wait(
        self,
        registry: Registry,
        agent: str,
        invocation_id: UUID,
        wait: float,
        mark: int | None = None,
        own: bool = False,
    ) -> Row:
        """The invocation once finished, waiting for a human, or when ``wait`` s have passed.
        ``mark``: taken before this agent made the call (see Outcomes.wait_for); ``own``:
        this request made it, so an outcome handed over in process is its answer (the
        status tool's ids are anyone's: those are always read, as the agent)."""
        return await self.outcomes.wait_for(
            invocation_id,
            partial(_run, registry.get_invocation, invocation_id, agent=agent),
            lambda row: row["status"] in FINISHED or row["status"] == "pending",
            wait,
            unread_since=mark,
            take_handed=own,
            agent=agent,
        )


REASON_META: Final = "toolrelay/reason"  # tools/call _meta: the agent's stated reason


def _reason(params: types.CallToolRequestParams) -> str | None:
    """The agent's stated reason for a call, from its ``_meta`` (docs/mcp.md)."""
    meta = params.meta if isinstance(params.meta, dict) else {}
    reason = meta.get(REASON_META)
    return reason if isinstance(reason, str) else None


def _status_arguments(arguments: Mapping[str, Any]) -> tuple[UUID, float]:
    unknown = sorted(set(arguments) - {"invocation_id", "wait_seconds"})
    if unknown:
        raise InvalidArgument(f"unknown argument(s) {unknown}")
    raw = arguments.get("invocation_id")
    try:
        invocation_id = UUID(str(raw))
    except ValueError:
        raise InvalidArgument(f"invocation_id is not an invocation id: {raw!r}") from None
    wait = arguments.get("wait_seconds", 0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not wait >= 0:
        raise InvalidArgument(f"wait_seconds must be a number of seconds, got {wait!r}")
    return invocation_id, min(float(wait), MAX_STATUS_WAIT)


class _Server(Server[Any]):
    """Declares ``tools.listChanged`` (toolrelay.mcp.changes) to every handshake-era
    session, whichever runner asks for the initialization options."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def build_server(
    db: Database,
    caller_for: CallerFor,
    settings: McpSettings | None = None,
    outcomes: Outcomes | None = None,
    handoff: HandOff | None = None,
    forget: Callable[[Caller], None] | None = None,
) -> Server[Any]:
    """The MCP server; ``caller_for`` names the agent each request acts as. ``outcomes``:
    the process's listener for finished calls (``serve`` shares the API's), else a new one;
    ``handoff``: ``serve``'s in-process worker, which this server's calls go to directly;
    ``forget``: told of a caller whose unchecked token its call's check refused."""
    handlers = _Handlers(
        db, caller_for, settings or McpSettings(), outcomes or Outcomes(db.url), handoff, forget
    )
    return _Server(
        "toolrelay",
        version=__version__,
        title="toolrelay",
        instructions=INSTRUCTIONS,
        # No tool declares Mcp-Param headers: skip the SDK's re-listing of the caller's
        # tools before every 2026-07-28 tools/call over HTTP (a database round trip).
        get_tool_input_schema=lambda _name: None,
        on_list_tools=handlers.list_tools,
        on_call_tool=handlers.call_tool,
    )


# --- callers ------------------------------------------------------------------------------


def agent_only(caller: Caller) -> Caller:
    if not caller.is_agent:
        raise PermissionDenied(
            "MCP serves agents: use an agent token (toolrelay token create --agent NAME),"
            " not an owner token"
        )
    return caller


def token_caller(authenticator: Authenticator, token: str) -> CallerFor:
    """The agent behind ``token``, checked again on every request (revocation is immediate)."""

    async def caller_for(_ctx: ServerRequestContext[Any, Any]) -> Caller:
        try:
            return agent_only(await _run(authenticator.authenticate, token))
        except (Unauthenticated, PermissionDenied) as exc:
            raise MCPError(INVALID_REQUEST, exc.message) from None

    return caller_for
