"""The owner's facade: one implementation behind the CLI, the HTTP API and tests.

Every method runs in one transaction as the owner (role ``authenticated`` with the owner's
uuid as ``auth.uid()``), so row-level security applies to everything it does.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final, TypeVar
from uuid import UUID

import anyio.to_thread
import psycopg
from psycopg.types.json import Jsonb

from toolrelay.db import Database, translate_db_error
from toolrelay.db.connect import Identity, Query, Row, owner_identity
from toolrelay.db.steps import Steps, checked_first, run_steps, run_steps_async
from toolrelay.errors import (
    Conflict,
    InvalidArgument,
    InvalidInput,
    NotAssigned,
    NotFound,
    ToolrelayError,
)
from toolrelay.export.strict import from_strict_call
from toolrelay.registry.fields import check_fields, check_limit, check_status
from toolrelay.registry.models import EXTRA_COLUMNS, UPDATABLE_COLUMNS, ToolSpec
from toolrelay.registry.policies import apply_policies
from toolrelay.registry.preview import approval_digest
from toolrelay.registry.seen import SEEN, Seen
from toolrelay.registry.validation import check_tool, validate_input
from toolrelay.tokens import TOKEN_REFUSED

T = TypeVar("T")
JSON_COLUMNS = frozenset({"schema_input", "schema_output", "request_template"})
DEFAULT_LIST_LIMIT = 50

# LEFT: history outlives its tool and agent (their key and name were copied on deletion).
_INVOCATIONS = (
    "SELECT i.*, coalesce(t.key, i.deleted_tool_key) AS tool_key,"
    " coalesce(a.name, i.deleted_agent_name) AS agent_name"
    " FROM agents.tool_invocations i"
    " LEFT JOIN agents.tools_registry t ON t.id = i.tool_id"
    " LEFT JOIN agents.agents a ON a.id = i.agent_id"
)

# Pending invocations with what a reviewer needs to see the exact request approval sends.
# Outside the LIMIT so that approvals_needed (which reads the audit log) runs once a row.
_REVIEW_QUEUE = """
SELECT q.*,
       -- the tenant's own token, where it approves nothing (migration 0040)
       agents.caller_member_id() IS NULL AND q.approvals_needed IS NOT NULL
           AND agents.approvers_told_apart(auth.uid(), q.approvals_needed) AS approve_as_member,
       -- a quorum in progress (migration 0026): how many approvals count (0050: of members
       -- who may still approve)
       (SELECT count(*) FROM agents.invocation_approvals p
         WHERE p.invocation_id = q.id
           AND agents.approval_counts(auth.uid(), p.member_id, q.approvals_needed))
           AS approvals_given
  FROM (
SELECT i.id, i.input, i.reason, i.created_at, i.approval_expires_at, i.agent_id,
       coalesce(a.name, i.deleted_agent_name) AS agent_name,
       i.tool_id, coalesce(t.key, i.deleted_tool_key) AS tool_key, t.name AS tool_name,
       t.description AS tool_description,
       t.endpoint_url, t.http_method, t.request_template, t.schema_input, t.auth_method,
       t.auth_placement, t.auth_param_name, t.auth_param_prefix, t.credential_ref,
       t.idempotency_header, t.egress_class, t.is_dangerous,
       agents.tool_fingerprint(t) IS DISTINCT FROM i.config_fingerprint AS tool_changed,
       -- how many approvals the call needs, and whether the caller gave one
       CASE WHEN t.id IS NOT NULL THEN agents.approvals_needed(t) END AS approvals_needed,
       EXISTS (SELECT 1 FROM agents.invocation_approvals p WHERE p.invocation_id = i.id
                  AND p.member_id = coalesce(agents.caller_member_id(), auth.uid()))
           AS approved_by_me
  FROM agents.tool_invocations i
  LEFT JOIN agents.tools_registry t ON t.id = i.tool_id
  LEFT JOIN agents.agents a ON a.id = i.agent_id
 WHERE i.status = 'pending'
   AND (i.approval_expires_at IS NULL OR i.approval_expires_at > now())
   AND (%(id)s::uuid IS NULL OR i.id = %(id)s)
 ORDER BY i.created_at, i.id
 LIMIT %(limit)s
) q
 ORDER BY q.created_at, q.id
"""

# What approving an invocation binds to: the columns build_request renders from.
_APPROVAL_ROW = """
SELECT i.id, i.input, t.key AS tool_key, t.endpoint_url, t.http_method, t.request_template,
       t.auth_placement, t.auth_param_name, t.idempotency_header
  FROM agents.tool_invocations i
  JOIN agents.tools_registry t ON t.id = i.tool_id
 WHERE i.id = %s AND i.status = 'pending'
"""


@dataclass(frozen=True)
class Called:
    """What ``Registry.call`` made: the tool as the agent may call it (tool_id, tool_key,
    schema_input, schema_output, gated) and the new invocation, both None when the agent
    may not call it; and the stamp of the agent's tools."""

    tool: Row | None
    invocation_id: UUID | None
    stamp: str


_ATTEMPTS = (
    "SELECT attempt, worker, started_at, finished_at, status_code, duration_ms, error_code,"
    " error, request_method, request_url, request_headers, request_body_bytes,"
    " request_body_sha256 FROM agents.tool_invocation_attempts"
    " WHERE invocation_id = %(id)s ORDER BY attempt, id"
)

# One invocation, for its owner or (with agent) only that agent's; retried_by is the other
# direction of retry_of (at most one retry per call).
_ONE_INVOCATION_FROM = (
    " coalesce(t.key, i.deleted_tool_key) AS tool_key,"
    " coalesce(a.name, i.deleted_agent_name) AS agent_name,"
    " (SELECT r.id FROM agents.tool_invocations r WHERE r.retry_of = i.id LIMIT 1) AS retried_by"
    " FROM agents.tool_invocations i"
    " LEFT JOIN agents.tools_registry t ON t.id = i.tool_id"
    " LEFT JOIN agents.agents a ON a.id = i.agent_id"
    " WHERE i.id = %(id)s"
    " AND (%(agent)s::text IS NULL OR i.agent_id = %(agent_id)s"
    "      OR (%(agent_id)s::uuid IS NULL AND a.name = %(agent)s))"
)

# For owners, the approvals a call has and needs (migration 0026): not on an agent's reads,
# which the wait paths make on every wake.
_ONE_INVOCATION = "SELECT i.*," + _ONE_INVOCATION_FROM
_OWNER_INVOCATION = (  # each approval says whether it counts (0050: its member may approve)
    "SELECT i.*, (SELECT coalesce(jsonb_agg(jsonb_build_object('member_id', p.member_id,"
    " 'approved_at', p.approved_at, 'counts', agents.approval_counts(i.owner, p.member_id,"
    " n.needed)) ORDER BY p.approved_at, p.member_id), '[]')"
    " FROM agents.invocation_approvals p, (SELECT agents.approvals_needed(t) AS needed) n"
    " WHERE p.invocation_id = i.id) AS approvals,"
    " CASE WHEN i.status = 'pending' AND t.id IS NOT NULL"
    " THEN agents.approvals_needed(t) END AS approvals_needed," + _ONE_INVOCATION_FROM
)

# An agent's tool by key, the stamp of its tools (0019) and the tool's version (0020).
_CALL_LOOKUP = "SELECT * FROM agents.agent_call_lookup(%(agent)s, %(key)s)"
_STAMP = "SELECT agents.agent_tools_stamp(%(agent)s) AS stamp"
# What fn_invoke_tool refuses when what was read is stale: not found, inactive, unassigned,
# no endpoint. The lookup then says why in its own words (an agent cannot tell which).
_STALE_REFUSALS = frozenset({"P0002", "TR001", "TR002", "TR005"})
# With a stated reason, the FROM clause sets it for the transaction first: the column's
# default reads it (migration 0029); without one nothing is set (a setting made with
# set_config(..., true) ends with its transaction, so none is left from an earlier call).
# A call that may wait for approval also answers whether its tool has rules to apply
# (``policed``, migration 0028: NULL, it does not wait).
_REASON = "(SELECT set_config('toolrelay.call_reason', %(reason)s, true)) AS r"
# A call claimed for a worker as it is inserted (migration 0036; `serve`'s hand-off to its
# in-process worker): the transaction says which worker, for how long.
_CLAIM = (
    "(SELECT set_config('toolrelay.claim_worker', %(claim_worker)s, true),"
    " set_config('toolrelay.claim_lease', %(claim_lease)s, true)) AS c"
)
_POLICED = ", agents.tool_policed(%(tool)s) AS policed"
_INSERT_SEEN = (
    "SELECT agents.invoke_seen(%(agent)s, %(name)s, %(tool)s, %(input)s, %(run)s,"
    " %(version)s) AS id"
)
MAX_REASON: Final = 1000  # characters (the column's check)
Claim = tuple[str, float]  # (worker id, lease seconds): Worker.reserve's

# In FROM, not `SELECT (fn_register_tool(...)).*`: that form calls the function once per
# column of its row (PostgreSQL expands it so): 31 upserts, and 31 audit rows computed, a tool.
REGISTER_SQL = """
SELECT * FROM fn_register_tool(
    p_key => %(key)s, p_name => %(name)s, p_description => %(description)s,
    p_category => %(category)s, p_schema_input => %(schema_input)s,
    p_schema_output => %(schema_output)s, p_auth_method => %(auth_method)s,
    p_requires_approval => %(requires_approval)s, p_is_dangerous => %(is_dangerous)s,
    p_endpoint_url => %(endpoint_url)s, p_http_method => %(http_method)s,
    p_request_template => %(request_template)s, p_auth_placement => %(auth_placement)s,
    p_auth_param_name => %(auth_param_name)s, p_credential_ref => %(credential_ref)s,
    p_egress_class => %(egress_class)s, p_auth_param_prefix => %(auth_param_prefix)s,
    p_response_pointer => %(response_pointer)s)
"""


def _adapt(column: str, value: Any) -> Any:
    return Jsonb(value) if column in JSON_COLUMNS and value is not None else value


class Registry:
    """Tools, agents, assignments and invocations of one owner.

    With ``agent_id`` every transaction carries that agent identity in its claims (the SQL
    functions then refuse owner-only actions such as approving), and ``invoke`` finds only
    tools assigned to that agent. With ``member_id`` it acts as that member of the tenant,
    whose role the database checks on every change (migration 0025).
    """

    def __init__(
        self,
        db: Database,
        owner: UUID | str,
        agent_id: UUID | str | None = None,
        member_id: UUID | str | None = None,
        token_check: Query | None = None,
    ) -> None:
        self.db = db
        self.owner = UUID(str(owner))
        self.agent_id = UUID(str(agent_id)) if agent_id is not None else None
        self.member_id = UUID(str(member_id)) if member_id is not None else None
        # A door's caller whose token was not looked up (Caller.token_check): only calls
        # are made with it, each checking the token first in its own transaction.
        self.token_check = token_check

    @property
    def identity(self) -> Identity:
        return owner_identity(self.owner, self.agent_id, self.member_id)

    def _one_trip(self, queries: Sequence[Query]) -> list[list[Row]]:
        """One transaction in one round trip as this registry's identity (Database.trips)."""
        try:
            with self.db.trips() as trips:
                return trips.run(self.identity, queries)
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Row]]:
        try:
            with self.db.as_owner(self.owner, self.agent_id, self.member_id) as conn:
                yield conn
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None

    # --- tools ---------------------------------------------------------------------------

    def register_tool(self, spec: ToolSpec) -> Row:
        """Create or update (by key) a tool; validated as stored, or nothing is written."""
        check_fields(f"tool {spec.key}", spec.as_dict())
        with self._tx() as conn:
            return self._register(conn, spec)

    def register_tools(
        self, specs: Sequence[ToolSpec], keep_gating: Collection[str] = ()
    ) -> list[Row]:
        """Create or update (by key) several tools in one transaction: all or none.

        Each row says what happened to it: ``change`` is ``created``, ``updated`` or
        ``unchanged`` (nothing written, migration 0041), ``changed`` the columns that
        differ. An error names the tool it is about; nothing is written then. ``keep_gating``
        (the keys of the tools whose gating the caller did not state, e.g. all of an
        import's, which infers it): such a tool that is gated now is not ungated by its
        spec, and one dangerous stays dangerous (each row's ``kept_gating`` says what was
        kept).
        """
        keys = [spec.key for spec in specs]
        duplicates = sorted({key for key in keys if keys.count(key) > 1})
        if duplicates:
            raise InvalidArgument(f"tool key(s) {duplicates} appear more than once")
        for spec in specs:
            check_fields(f"tool {spec.key}", spec.as_dict())
        rows: list[Row] = []
        with self._tx() as conn:
            for spec in specs:
                try:
                    with conn.transaction():  # a savepoint, so the error can name the tool
                        before = conn.execute(_TOOL_BY_KEY_LOCKED, (spec.key,)).fetchone()
                        kept, said = (
                            _kept_gating(before, spec) if spec.key in keep_gating else (spec, [])
                        )
                        row = self._register(conn, kept)
                        row["change"], row["changed"] = _change(before, row)
                        row["kept_gating"] = said  # for the caller to say (field=value)
                        rows.append(row)
                except psycopg.Error as exc:
                    error = translate_db_error(exc)
                    raise type(error)(f"tool {spec.key}: {error.message}") from None
                except ToolrelayError as exc:
                    message = exc.message
                    if not message.startswith(f"tool {spec.key}"):
                        message = f"tool {spec.key}: {message}"
                    raise type(exc)(message) from None
        return rows

    def _register(self, conn: psycopg.Connection[Row], spec: ToolSpec) -> Row:
        params = {k: _adapt(k, v) for k, v in spec.as_dict().items()}
        row = conn.execute(REGISTER_SQL, params).fetchone()
        assert row is not None
        extras = {c: getattr(spec, c) for c in EXTRA_COLUMNS if getattr(spec, c) is not None}
        if extras:
            row = self._update_columns(conn, row["id"], extras)
        check_tool(row)
        return row

    def update_tool(self, key_or_id: str, changes: Mapping[str, Any]) -> Row:
        unknown = sorted(set(changes) - set(UPDATABLE_COLUMNS))
        if unknown:
            raise InvalidArgument(f"cannot update field(s) {unknown}")
        check_fields(f"tool {key_or_id}", changes)
        with self._tx() as conn:
            tool = self._find_tool(conn, key_or_id)
            row = self._update_columns(conn, tool["id"], dict(changes)) if changes else tool
            check_tool(row)
            return row

    def _update_columns(
        self, conn: psycopg.Connection[Row], tool_id: UUID, changes: Mapping[str, Any]
    ) -> Row:
        assignments = ", ".join(f"{column} = %({column})s" for column in changes)
        params = {k: _adapt(k, v) for k, v in changes.items()} | {"id": tool_id}
        row = conn.execute(
            f"UPDATE agents.tools_registry SET {assignments} WHERE id = %(id)s RETURNING *",
            params,
        ).fetchone()
        if row is None:  # changed nothing, so not written (migration 0041); or no such tool
            row = conn.execute(
                "SELECT * FROM agents.tools_registry WHERE id = %s", (tool_id,)
            ).fetchone()
        if row is None:
            raise NotFound(f"tool {tool_id} not found")
        return row

    def set_tool_status(self, key_or_id: str, status: str) -> Row:
        return self.update_tool(key_or_id, {"status": status})

    def list_tools(self) -> list[Row]:
        with self._tx() as conn:
            return conn.execute("SELECT * FROM agents.tools_registry ORDER BY key").fetchall()

    def get_tool(self, key_or_id: str) -> Row:
        with self._tx() as conn:
            return self._find_tool(conn, key_or_id)

    def _find_tool(self, conn: psycopg.Connection[Row], key_or_id: str) -> Row:
        return _find(conn, "tools_registry", "key", key_or_id, "tool")

    # --- agents and assignments ----------------------------------------------------------

    def create_agent(self, name: str) -> UUID:
        with self._tx() as conn:
            row = conn.execute("SELECT fn_create_agent(%s) AS id", (name,)).fetchone()
            assert row is not None
            return UUID(str(row["id"]))

    def list_agents(self) -> list[Row]:
        with self._tx() as conn:
            return conn.execute("SELECT * FROM agents.agents ORDER BY name").fetchall()

    def get_agent(self, name_or_id: str) -> Row:
        with self._tx() as conn:
            return self._find_agent(conn, name_or_id)

    def _find_agent(self, conn: psycopg.Connection[Row], name_or_id: str) -> Row:
        return _find(conn, "agents", "name", name_or_id, "agent")

    def assign(self, agent: str, tool: str, allowed: bool = True) -> UUID:
        with self._tx() as conn:
            agent_id = self._find_agent(conn, agent)["id"]
            tool_id = self._find_tool(conn, tool)["id"]
            row = conn.execute(
                "SELECT fn_assign_tool(%s, %s, %s) AS id", (agent_id, tool_id, allowed)
            ).fetchone()
            assert row is not None
            return UUID(str(row["id"]))

    def revoke(self, agent: str, tool: str) -> bool:
        with self._tx() as conn:
            agent_id = self._find_agent(conn, agent)["id"]
            tool_id = self._find_tool(conn, tool)["id"]
            row = conn.execute(
                "SELECT fn_revoke_tool(%s, %s) AS revoked", (agent_id, tool_id)
            ).fetchone()
            assert row is not None
            return bool(row["revoked"])

    def agent_tools(self, agent: str) -> list[Row]:
        """The tools ``agent`` may call now: assigned, allowed and active; ``gated`` tells
        whether a call waits for approval."""
        with self._tx() as conn:
            agent_id = self._find_agent(conn, agent)["id"]
            return conn.execute(
                "SELECT t.*, agents.tool_is_gated(t) AS gated FROM agents.tool_assignments s"
                " JOIN agents.tools_registry t ON t.id = s.tool_id"
                " WHERE s.agent_id = %s AND s.allowed AND t.status = 'active' ORDER BY t.key",
                (agent_id,),
            ).fetchall()

    def list_assignments(self) -> list[Row]:
        with self._tx() as conn:
            return conn.execute(
                "SELECT a.name AS agent, t.key AS tool, s.allowed, s.agent_id, s.tool_id"
                " FROM agents.tool_assignments s JOIN agents.agents a ON a.id = s.agent_id"
                " JOIN agents.tools_registry t ON t.id = s.tool_id ORDER BY a.name, t.key"
            ).fetchall()

    # --- invocations ---------------------------------------------------------------------

    def invoke(
        self,
        agent: str,
        tool: str,
        input: Mapping[str, Any] | None = None,
        run_id: UUID | None = None,
        reason: str | None = None,
        claim: Claim | None = None,
    ) -> UUID:
        """Validate the input against schema_input, then record the invocation (with the
        agent's stated ``reason``, shown to whoever decides it); ``claim``: claimed for that
        worker as it is inserted, unless it waits for approval (migration 0036)."""
        steps = self._checked(self._invoke_steps(agent, tool, input, run_id, reason, claim))
        try:
            with self.db.trips() as trips:
                row = run_steps(trips, steps)
            return self._made(row)
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None

    async def invoke_async(
        self,
        agent: str,
        tool: str,
        input: Mapping[str, Any] | None = None,
        run_id: UUID | None = None,
        reason: str | None = None,
        claim: Claim | None = None,
    ) -> UUID:
        """``invoke`` from the event loop (the API's agent door; see ``call_async``)."""
        steps = self._checked(self._invoke_steps(agent, tool, input, run_id, reason, claim))
        try:
            return await self._made_async(await run_steps_async(self.db, steps))
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None

    def _checked(self, steps: Steps[T]) -> Steps[T]:
        if self.token_check is None:
            return steps
        return checked_first(steps, self.identity, self.token_check, TOKEN_REFUSED)

    def _invoke_steps(
        self,
        agent: str,
        tool: str,
        input: Mapping[str, Any] | None,
        run_id: UUID | None,
        reason: str | None,
        claim: Claim | None,
    ) -> Steps[Row]:
        """``invoke``'s trips, whoever runs them: the inserted row."""
        payload = _payload(input)
        reason = _reason(reason)
        assigned = self.agent_id is not None
        identity = self.identity
        key = ("invoke", self.db.url, self.owner, self.agent_id, agent, tool)
        agent_name = None if _as_uuid(agent) else agent
        # One round trip when this process has read the tool before (registry/seen.py).
        seen = SEEN.get(key)
        if seen is not None:
            made = yield from _insert_seen_steps(
                identity, seen, agent_name, payload, run_id, assigned, reason=reason, claim=claim
            )
            if made is not None:
                return made[0][0]
            SEEN.drop(key)
        # Else two: the lookup, then the insert.
        [[found]] = yield identity, [_invoke_lookup(agent, tool, assigned)], True
        if found["agent_id"] is None:
            raise NotFound(f"agent {agent} not found")
        if found["tool_id"] is None:
            if assigned:
                raise NotAssigned(f"tool {tool} is not assigned to this agent")
            raise NotFound(f"tool {tool} not found")
        checked = _checked(found["schema_input"], payload, assigned)
        agent_id, tool_id = found["agent_id"], found["tool_id"]
        insert = _insert_call(agent_id, tool_id, checked, run_id, reason, claim)
        try:
            [[row]] = yield identity, [insert], False
        except psycopg.Error as exc:
            _refused_as_unassigned(exc, tool, assigned)
            raise
        gated = {"gated": row["policed"] is not None}  # for the next call's insert
        SEEN.put(key, Seen(agent_id, tool_id, found["schema_input"], found["version"], gated))
        return row

    def _made(self, row: Row) -> UUID:
        """The new call's id, once its tool's rules had their say on it when it waits for
        approval and the tool has rules (``policed``, migration 0028)."""
        invocation_id = UUID(str(row["id"]))
        if row.get("policed"):
            apply_policies(self.db, invocation_id)
        return invocation_id

    async def _made_async(self, row: Row) -> UUID:
        """``_made`` from the event loop: the rules (rare: a gated call whose tool has
        some) run in a worker thread, as they always did."""
        if row.get("policed"):
            return await anyio.to_thread.run_sync(self._made, row)
        return UUID(str(row["id"]))

    def call(
        self,
        key: str,
        input: Mapping[str, Any] | None = None,
        reason: str | None = None,
        claim: Claim | None = None,
    ) -> Called:
        """An agent's call by tool key, as this registry's agent: the tool as the agent may
        call it and the invocation made, or neither when it may not call it (unassigned,
        denied, disabled and unknown look the same); with the stamp of the agent's tools
        either way (mcp/changes.py). One round trip when this process has read the tool
        before (registry/seen.py), else two: the lookup, then the insert."""
        steps = self._checked(self._call_steps(key, input, reason, claim))
        try:
            with self.db.trips() as trips:
                tool, row, stamp = run_steps(trips, steps)
            return Called(tool, None if row is None else self._made(row), stamp)
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None

    async def call_async(
        self,
        key: str,
        input: Mapping[str, Any] | None = None,
        reason: str | None = None,
        claim: Claim | None = None,
    ) -> Called:
        """``call`` from the event loop (the MCP door): its trips need no worker thread
        (db/aio.py); only a gated call's rules, when its tool has some, take one."""
        steps = self._checked(self._call_steps(key, input, reason, claim))
        try:
            tool, row, stamp = await run_steps_async(self.db, steps)
            return Called(tool, None if row is None else await self._made_async(row), stamp)
        except psycopg.Error as exc:
            raise translate_db_error(exc) from None

    def _call_steps(
        self,
        key: str,
        input: Mapping[str, Any] | None,
        reason: str | None,
        claim: Claim | None,
    ) -> Steps[tuple[Row | None, Row | None, str]]:
        """``call``'s trips, whoever runs them: (the tool, the inserted row, the stamp)."""
        if self.agent_id is None:
            raise InvalidArgument("Registry.call acts as an agent: give the agent_id")
        payload = _payload(input)
        reason = _reason(reason)
        identity = self.identity
        cache_key = ("call", self.db.url, self.owner, self.agent_id, key)
        stamp = (_STAMP, {"agent": self.agent_id})
        seen = SEEN.get(cache_key)
        if seen is not None:
            made = yield from _insert_seen_steps(
                identity, seen, None, payload, None, True, [stamp], reason=reason, claim=claim
            )
            if made is not None:
                return seen.row, made[0][0], made[1][0]["stamp"]
            SEEN.drop(cache_key)
        lookup = (_CALL_LOOKUP, {"agent": self.agent_id, "key": key})
        [[target]] = yield identity, [lookup], True
        if target["tool_id"] is None:
            return None, None, target["stamp"]
        checked = _checked(target["schema_input"], payload, True)
        tool_id = target["tool_id"]
        seen = Seen(self.agent_id, tool_id, target["schema_input"], target["version"], target)
        SEEN.put(cache_key, seen)
        insert = _insert_call(self.agent_id, tool_id, checked, None, reason, claim)
        try:
            [[row]] = yield identity, [insert], False
        except psycopg.Error as exc:
            _refused_as_unassigned(exc, key, True)
            raise
        return target, row, target["stamp"]

    def tools_stamp(self) -> str:
        """The stamp of the tools this registry's agent may call now (see ``call``)."""
        if self.agent_id is None:
            raise InvalidArgument("Registry.tools_stamp acts as an agent: give the agent_id")
        [[row]] = self._one_trip([(_STAMP, {"agent": self.agent_id})])
        return str(row["stamp"])

    def approve(self, invocation_id: UUID | str, request_digest: str | None = None) -> str | None:
        """Approve the request the call renders now, bound by its digest (SPEC §3).

        ``request_digest`` is the digest of the request the approver was shown; when the
        call would now render anything else, nothing is approved. Returns the digest bound.
        """
        with self._tx() as conn:
            row = conn.execute(_APPROVAL_ROW, (str(invocation_id),)).fetchone()
            current = approval_digest(row) if row is not None else None
            if request_digest is not None and request_digest != current:
                raise Conflict(
                    f"invocation {invocation_id}: the request it would send is no longer the"
                    " one you were shown (the tool changed); review it again"
                )
            conn.execute("SELECT fn_approve_tool_invocation(%s, %s)", (str(invocation_id), current))
            return current

    def retry(self, invocation_id: UUID | str) -> UUID:
        """A failed, rejected or expired call made again (a human owner only): a new
        invocation with its agent, tool, input and run, ``retry_of`` the first, under every
        rule of a new call (gated again if the tool is gated now). The input is validated
        against the tool's current schema first."""
        ident = _as_uuid(str(invocation_id))
        if ident is None:
            raise InvalidArgument(f"not an invocation id: {invocation_id!r}")
        with self._tx() as conn:
            # The function decides who and which calls; then the schema, as for invoke:
            # raising here rolls the new call back.
            new = conn.execute("SELECT fn_retry_tool_invocation(%s) AS id", (ident,)).fetchone()
            assert new is not None
            row = conn.execute(
                "SELECT i.input, t.schema_input FROM agents.tool_invocations i"
                " JOIN agents.tools_registry t ON t.id = i.tool_id WHERE i.id = %s",
                (new["id"],),
            ).fetchone()
            assert row is not None
            validate_input(row["schema_input"], row["input"])
            return UUID(str(new["id"]))

    def reject(self, invocation_id: UUID | str, reason: str | None = None) -> None:
        with self._tx() as conn:
            conn.execute("SELECT fn_reject_tool_invocation(%s, %s)", (str(invocation_id), reason))

    def expire_pending(self) -> int:
        with self._tx() as conn:
            row = conn.execute("SELECT fn_expire_tool_invocations() AS n").fetchone()
            assert row is not None
            return int(row["n"])

    def list_invocations(
        self,
        status: str | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
        *,
        tool: str | None = None,
        agent: str | None = None,
        before: tuple[datetime, UUID] | None = None,
        settled: bool = False,
        decided_by: UUID | None = None,
    ) -> list[Row]:
        """Newest first. ``tool`` is a key or id, ``agent`` a name or id; ``before`` is the
        (created_at, id) of the last row of the previous page (keyset pagination);
        ``settled``: not pending; ``decided_by``: decided by that member or policy."""
        check_status(status)
        check_limit(limit)
        tool_id, agent_id = _as_uuid(tool or ""), _as_uuid(agent or "")
        params = {
            "status": status,
            "limit": limit,
            "tool_id": tool_id,
            "tool_key": tool if tool is not None and tool_id is None else None,
            "agent_id": agent_id,
            "agent_name": agent if agent is not None and agent_id is None else None,
            "before_at": before[0] if before else None,
            "before_id": before[1] if before else None,
            "settled": settled,
            "decided_by": decided_by,
        }
        with self._tx() as conn:
            return conn.execute(
                _INVOCATIONS + " WHERE (%(status)s::text IS NULL OR i.status = %(status)s)"
                " AND (%(tool_id)s::uuid IS NULL OR i.tool_id = %(tool_id)s)"
                " AND (%(tool_key)s::text IS NULL"
                "      OR coalesce(t.key, i.deleted_tool_key) = %(tool_key)s)"
                " AND (%(agent_id)s::uuid IS NULL OR i.agent_id = %(agent_id)s)"
                " AND (%(agent_name)s::text IS NULL"
                "      OR coalesce(a.name, i.deleted_agent_name) = %(agent_name)s)"
                " AND (%(before_at)s::timestamptz IS NULL"
                "      OR (i.created_at, i.id) < (%(before_at)s, %(before_id)s::uuid))"
                " AND (NOT %(settled)s OR i.status <> 'pending')"
                " AND (%(decided_by)s::uuid IS NULL OR i.decided_by = %(decided_by)s"
                "      OR i.decided_by_policy = %(decided_by)s)"
                " ORDER BY i.created_at DESC, i.id DESC LIMIT %(limit)s",
                params,
            ).fetchall()

    def review_one(self, invocation_id: UUID | str) -> Row | None:
        """One call of the review queue (as ``review_queue`` reads it), or None when it is
        not waiting for a decision."""
        with self._tx() as conn:
            return conn.execute(_REVIEW_QUEUE, {"id": str(invocation_id), "limit": 1}).fetchone()

    def pending_count(self) -> int:
        """How many calls wait for a decision now (the review queue's length, unbounded)."""
        with self._tx() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM agents.tool_invocations WHERE status = 'pending'"
                " AND (approval_expires_at IS NULL OR approval_expires_at > now())"
            ).fetchone()
        assert row is not None
        return int(row["n"])

    def review_queue(self, limit: int = DEFAULT_LIST_LIMIT) -> list[Row]:
        """Pending invocations still open for a decision, oldest first, each with its tool's
        dispatch settings and ``tool_changed`` (the tool changed since the call was made)."""
        with self._tx() as conn:
            return conn.execute(_REVIEW_QUEUE, {"id": None, "limit": limit}).fetchall()

    def attempts_of(self, invocation_id: UUID | str) -> list[Row]:
        """What an agent may see of a call's attempts (its owner reads them): number,
        times, status code and error code — no egress detail, no request sent."""
        query = (
            "SELECT attempt, started_at, finished_at, status_code, duration_ms, error_code"
            " FROM agents.tool_invocation_attempts WHERE invocation_id = %(id)s"
            " ORDER BY attempt, id",
            {"id": str(invocation_id)},
        )
        [rows] = self._one_trip([query])
        return rows

    def get_invocation(self, invocation_id: UUID | str, *, agent: str | None = None) -> Row:
        """One invocation with its attempt history under ``attempts``.

        With ``agent`` (a name or id) only that agent's invocations are found.
        """
        ident = _as_uuid(str(invocation_id))
        if ident is None:
            raise InvalidArgument(f"not an invocation id: {invocation_id!r}")
        agent_id = _as_uuid(agent or "")
        params = {"id": ident, "agent": agent, "agent_id": agent_id}
        owner = self.agent_id is None
        queries: list[Query] = [(_OWNER_INVOCATION if owner else _ONE_INVOCATION, params)]
        # Attempts are the owner's rows (RLS, migration 0015): an agent's read of them would
        # come back empty, so it is not made (the wait paths read here per wake).
        if owner:
            queries.append((_ATTEMPTS, params))
        found, *attempts = self._one_trip(queries)
        if not found:
            raise NotFound(f"invocation {invocation_id} not found")
        row = found[0]
        row["attempts"] = attempts[0] if attempts else []
        return row


def _find(
    conn: psycopg.Connection[Row], table: str, name_column: str, value: str, what: str
) -> Row:
    """One row of ``agents.<table>`` by uuid or by its name column (RLS limits it to the
    caller's own rows)."""
    ident = _as_uuid(value)
    column = "id" if ident is not None else name_column
    row = conn.execute(
        f"SELECT * FROM agents.{table} WHERE {column} = %s", (ident or value,)
    ).fetchone()
    if row is None:
        raise NotFound(f"{what} {value} not found")
    return row


def _invoke_lookup(agent: str, tool: str, assigned: bool) -> Query:
    """agents.invoke_lookup (migrations 0016, 0020): by uuid when the text is one, else by
    name/key."""
    agent_id, tool_id = _as_uuid(agent), _as_uuid(tool)
    sql = (
        "SELECT found_agent AS agent_id, found_tool AS tool_id, found_schema AS schema_input"
        ", found_version AS version FROM agents.invoke_lookup("
        "%(agent_id)s, %(agent)s, %(tool_id)s, %(tool)s, %(assigned)s)"
    )
    params = {
        "agent_id": agent_id,
        "agent": None if agent_id else agent,
        "tool_id": tool_id,
        "tool": None if tool_id else tool,
        "assigned": assigned,
    }
    return sql, params


def _payload(input: Mapping[str, Any] | None) -> dict[str, Any]:
    if input is not None and not isinstance(input, Mapping):
        raise InvalidInput(f"input must be a JSON object, got {type(input).__name__}")
    return dict(input or {})


def _checked(schema: Any, payload: dict[str, Any], agent: bool) -> dict[str, Any]:
    """The input as recorded, once valid against ``schema`` (raises InvalidInput)."""
    if agent:
        # An agent under OpenAI's strict mode sends null for what it leaves out: read that
        # as left out where the tool's schema does not allow null.
        payload = from_strict_call(schema, payload)
    validate_input(schema, payload)
    return payload


# The tool a spec updates, as it is before (locked until commit); None for a new key.
_TOOL_BY_KEY_LOCKED = "SELECT * FROM agents.tools_registry WHERE key = %s FOR UPDATE"
# Not a change of the tool's configuration: when, and what register_tools adds itself.
_NOT_CHANGES = frozenset({"updated_at", "created_at", "kept_gating", "change", "changed"})


def _change(before: Row | None, after: Row) -> tuple[str, list[str]]:
    """What registering did to a tool: created, updated (with the columns) or unchanged."""
    if before is None:
        return "created", []
    changed = sorted(k for k in after if k not in _NOT_CHANGES and before.get(k) != after[k])
    return ("updated" if changed else "unchanged"), changed


def _kept_gating(now: Row | None, spec: ToolSpec) -> tuple[ToolSpec, list[str]]:
    """``spec`` never less gated than the tool of its key is ``now``: its is_dangerous (the
    quorum's default) and requires_approval kept, and its egress class where the spec's
    read_only would ungate it; with what that changed (``field=value``)."""
    if now is None:
        return spec, []
    kept: list[str] = []
    egress = spec.egress_class or now["egress_class"]  # None: unchanged
    ungated = not (spec.requires_approval or spec.is_dangerous) and egress == "read_only"
    if now["is_dangerous"] and not spec.is_dangerous:
        spec, kept = replace(spec, is_dangerous=True), ["is_dangerous=true"]
    if now["requires_approval"] and not spec.requires_approval:
        spec = replace(spec, requires_approval=True)
        kept += ["requires_approval=true"] if ungated else []  # else gated anyway: unsaid
    if ungated and not spec.requires_approval and now["egress_class"] != "read_only":
        spec = replace(spec, egress_class=now["egress_class"])
        kept.append(f"egress_class={now['egress_class']}")
    return spec, kept


def _insert_seen_steps(
    identity: Identity,
    seen: Seen,
    agent_name: str | None,
    payload: dict[str, Any],
    run_id: UUID | None,
    agent: bool,
    more: Sequence[Query] = (),
    reason: str | None = None,
    claim: Claim | None = None,
) -> Steps[list[list[Row]] | None]:
    """The insert against what was read before; None when that is stale (or refuses the
    input, which a fresh read decides). ``agent``: the caller is the agent (strict nulls)."""
    try:
        checked = _checked(seen.schema, payload, agent)
    except InvalidInput:
        return None
    params = {"agent": seen.agent_id, "name": agent_name, "tool": seen.tool_id,
              "input": Jsonb(checked), "run": run_id, "version": seen.version,
              "reason": reason} | _claim_params(claim)  # fmt: skip
    # The rules' question only for a tool read as gated: an ungated call asks nothing more.
    sql = _INSERT_SEEN + (_POLICED if seen.row.get("gated") else "")
    sql += _settings_clause(reason, claim)
    try:
        results = yield identity, [(sql, params), *more], False
    except psycopg.Error as exc:
        if exc.sqlstate in _STALE_REFUSALS:  # say it as the lookup says it: read again
            return None
        raise
    return results if results[0][0]["id"] is not None else None


def _refused_as_unassigned(exc: psycopg.Error, tool: str, agent: bool) -> None:
    """An agent's tool found by the lookup and unassigned (or deleted) before the insert: the
    insert refuses it as an unknown id (P0002, migration 0056); say it as the lookup says it,
    as the insert said it before (TR002, 403)."""
    if agent and exc.sqlstate == "P0002":
        raise NotAssigned(f"tool {tool} is not assigned to this agent") from None


def _insert_call(
    agent_id: Any,
    tool_id: Any,
    payload: Any,
    run_id: UUID | None,
    reason: str | None = None,
    claim: Claim | None = None,
) -> Query:
    sql = "SELECT fn_invoke_tool(%(agent)s, %(tool)s, %(input)s, %(run)s) AS id"
    sql += _POLICED + _settings_clause(reason, claim)
    params = {"agent": agent_id, "tool": tool_id, "input": Jsonb(payload), "run": run_id}
    return sql, params | {"reason": reason} | _claim_params(claim)


def _settings_clause(reason: str | None, claim: Claim | None) -> str:
    """The FROM clause that sets what the insert reads from the transaction's settings;
    nothing is set that was not given (none is left from an earlier call: they end with
    their transaction)."""
    parts = [_REASON] if reason is not None else []
    if claim is not None:
        parts.append(_CLAIM)
    return " FROM " + ", ".join(parts) if parts else ""


def _claim_params(claim: Claim | None) -> dict[str, str]:
    if claim is None:
        return {}
    worker, lease = claim
    return {"claim_worker": worker, "claim_lease": repr(float(lease))}


def _reason(reason: str | None) -> str | None:
    """The stated reason as stored: trimmed, at most MAX_REASON characters, no control
    characters but line breaks and tabs."""
    if reason is None or not reason.strip():
        return None
    reason = reason.strip()
    if len(reason) > MAX_REASON:
        raise InvalidInput(f"reason: at most {MAX_REASON} characters, got {len(reason)}")
    if any((ord(c) < 32 and c not in "\t\n\r") or ord(c) == 127 for c in reason):
        raise InvalidInput("reason: control characters are not allowed")
    return reason


def _as_uuid(value: str) -> UUID | None:
    try:
        return UUID(value)
    except (ValueError, AttributeError):
        return None


def dumps(value: Any) -> str:
    """JSON for display: uuids and times as strings."""
    return json.dumps(value, default=str, indent=2, sort_keys=True)


__all__ = ["Called", "Registry", "ToolSpec", "ToolrelayError", "dumps"]
