"""What a chaos run asks of the dispatcher: tools, credentials, invocations, approvals."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from toolrelay.chaos.upstream import (
    ACTIONS,
    API_KEY_HEADER,
    API_KEY_QUERY,
    IDEMPOTENCY_HEADER,
    AnyOf,
    ChaosUpstream,
    CredentialCheck,
    TokenEndpoint,
)
from toolrelay.credentials import CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.dispatch.executor import build_request, request_digest
from toolrelay.errors import (
    ApprovalExpired,
    Conflict,
    InvalidState,
    TemplateError,
    ToolrelayError,
)
from toolrelay.registry import Registry, ToolSpec

AGENT = "chaos-agent"
PROBE_TOOL = "chaos.stall"
BIND_TOOL = "chaos.bind"  # the binding probe's: approved, then changed before any claim
REGATE_TOOL = "chaos.regate"  # ... and its calls made ungated, then the tool gated
RECONNECT_DELAY = 0.5  # seconds between attempts to reach a database that went away
DB_GONE = (psycopg.OperationalError, psycopg.InterfaceError)
APPROVAL_POLL = 0.25  # seconds
CREATE_BATCH = 25

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "text": {"type": "string"},
        "chaos": {"type": "string"},
    },
    "additionalProperties": False,
}
# Text in every input: a bit of everything a real agent sends (no NUL: PostgreSQL refuses it).
ALPHABET = "abcXYZ019 -_.,:;!?'\"\\/{}[]<>&%+=~`é中文🙂🚀\u200b\u202eΩж\t"


@dataclass(frozen=True)
class ToolPlan:
    key: str
    method: str
    weight: float
    gated: bool = False  # egress_class write (or requires_approval for a read)
    requires_approval: bool = False
    idempotency_header: str | None = None
    auth: str = "none"  # none, api_key_header, api_key_query, oauth
    max_attempts: int = 3
    short_ttl: bool = False  # some of its invocations are never approved and expire


TOOLS: tuple[ToolPlan, ...] = (
    ToolPlan("chaos.read", "GET", 14),
    ToolPlan("chaos.read5", "GET", 5, max_attempts=5),
    ToolPlan("chaos.read_key", "GET", 6, auth="api_key_header"),
    ToolPlan("chaos.read_oauth", "GET", 6, auth="oauth"),
    ToolPlan("chaos.read_gated", "GET", 4, requires_approval=True),
    ToolPlan("chaos.read_ttl", "GET", 3, requires_approval=True, short_ttl=True),
    ToolPlan("chaos.put", "PUT", 5, gated=True),
    ToolPlan("chaos.delete", "DELETE", 3, gated=True),
    ToolPlan("chaos.post", "POST", 14),  # a write not gated (egress declared read_only)
    ToolPlan("chaos.patch", "PATCH", 6),
    ToolPlan("chaos.post_gated", "POST", 8, gated=True),
    ToolPlan("chaos.post_idem", "POST", 6, gated=True, idempotency_header=IDEMPOTENCY_HEADER),
    ToolPlan("chaos.post_key", "POST", 5, auth="api_key_query"),
    ToolPlan("chaos.post_oauth", "POST", 5, gated=True, auth="oauth"),
)


@dataclass
class Setup:
    owner: UUID
    agent_id: UUID
    tool_ids: dict[str, UUID]
    secrets: dict[str, list[str]]  # kind -> values that must never be stored or logged
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool rows as registered
    credentials: dict[str, UUID] = field(default_factory=dict)  # "api_key", "oauth"
    api_keys: set[str] = field(default_factory=set)  # every API key the owner stored
    rotated_tokens: set[str] = field(default_factory=set)  # access tokens rotated in
    oauth: dict[str, Any] = field(default_factory=dict)  # the OAuth secret's fixed fields


def template(method: str) -> dict[str, Any]:
    query = {"chaos": "{{input.chaos}}", "n": "{{input.n}}"}
    if method in ("GET", "DELETE"):
        return {"query": query}
    body = {"n": "{{input.n}}", "text": "{{input.text}}", "invocation": "{{invocation.id}}"}
    return {"query": {"chaos": "{{input.chaos}}"}, "body": body}


def register(
    db: Database,
    keyring: Keyring,
    upstream: ChaosUpstream,
    tokens: TokenEndpoint,
    tool_timeout: float,
    approval_ttl: float,
    probe_hold: float,
) -> Setup:
    """The owner, the agent, two credentials and the tools, all assigned to the agent."""
    owner = uuid.uuid4()
    registry = Registry(db, owner)
    store = CredentialStore(db, keyring)
    api_key = f"ck-live-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"
    first_access = f"at-initial-{uuid.uuid4().hex}"
    oauth = {
        "access_token": first_access,
        "refresh_token": tokens.refresh_token,
        "token_url": tokens.url,
        "client_id": tokens.client_id,
        "client_secret": tokens.client_secret,
        "expires_in": 1,  # stale at once: the first use refreshes
    }
    key_id = store.add(owner, "api_key", "chaos-api-key", api_key, ["127.0.0.1"])
    oauth_id = store.add(owner, "oauth", "chaos-oauth", json.dumps(oauth), ["127.0.0.1"])
    agent_id = registry.create_agent(AGENT)
    tool_ids: dict[str, UUID] = {}
    rows: dict[str, dict[str, Any]] = {}

    def add(fields: dict[str, Any]) -> None:
        """Register a tool, assign it to the chaos agent, and keep its row."""
        row = registry.register_tool(ToolSpec.from_mapping(fields))
        registry.assign(AGENT, fields["key"])
        tool_ids[fields["key"]] = row["id"]
        rows[fields["key"]] = dict(row)

    api_keys = {api_key}  # rotations add to it (before storing): the upstream's live list
    rotated: set[str] = set()
    for plan in TOOLS:
        fields: dict[str, Any] = {
            "key": plan.key,
            "name": plan.key,
            "endpoint_url": f"{upstream.base_url}/api/{plan.key}",
            "http_method": plan.method,
            "egress_class": "write" if plan.gated else "read_only",
            "requires_approval": plan.requires_approval,
            "schema_input": INPUT_SCHEMA,
            "request_template": template(plan.method),
            "timeout_seconds": tool_timeout,
            "connect_timeout_seconds": tool_timeout,
            "max_attempts": plan.max_attempts,
            "idempotency_header": plan.idempotency_header,
        }
        if plan.short_ttl:
            fields["approval_ttl_seconds"] = max(1, round(approval_ttl))
        if plan.auth.startswith("api_key"):
            query = plan.auth == "api_key_query"
            fields |= {
                "auth_method": "api_key",
                "credential_ref": key_id,
                "auth_placement": "query" if query else "header",
                "auth_param_name": API_KEY_QUERY if query else API_KEY_HEADER,
            }
            upstream.credentials[plan.key] = CredentialCheck(plan.auth, api_keys)
        elif plan.auth == "oauth":
            fields |= {
                "auth_method": "oauth",
                "credential_ref": oauth_id,
                "auth_param_prefix": "Bearer ",
            }
            # The live lists: every token the endpoint issued or the owner rotated in.
            upstream.credentials[plan.key] = CredentialCheck(
                "bearer", AnyOf(tokens.issued, rotated)
            )
        add(fields)
    add(
        {
            "key": PROBE_TOOL,
            "name": "stale-lease probe",
            "endpoint_url": f"{upstream.base_url}/stall",
            "http_method": "GET",
            "egress_class": "read_only",
            "timeout_seconds": probe_hold,
            "max_attempts": 3,
        }
    )
    add(
        {
            "key": BIND_TOOL,
            "name": "binding probe",
            "endpoint_url": f"{upstream.base_url}/api/{BIND_TOOL}",
            "http_method": "POST",
            "egress_class": "write",
            "schema_input": INPUT_SCHEMA,
            # chaos=ok: if it is ever sent, it is answered at once
            "request_template": {"query": {"chaos": "ok"}, "body": {"n": "{{input.n}}"}},
            "timeout_seconds": tool_timeout,
            "max_attempts": 1,
        }
    )
    add(
        {
            "key": REGATE_TOOL,
            "name": "re-gating probe",
            "endpoint_url": f"{upstream.base_url}/api/{REGATE_TOOL}",
            "http_method": "GET",
            "egress_class": "read_only",
            "schema_input": INPUT_SCHEMA,
            "request_template": {"query": {"chaos": "ok", "n": "{{input.n}}"}},
            "timeout_seconds": tool_timeout,
            "max_attempts": 1,
        }
    )
    secrets = {
        "api_key": [api_key],
        "oauth_access_token": [first_access],
        "oauth_refresh_token": [tokens.refresh_token],
        "oauth_client_secret": [tokens.client_secret],
    }
    fixed = {k: v for k, v in oauth.items() if k not in ("access_token", "expires_in")}
    return Setup(
        owner,
        agent_id,
        tool_ids,
        secrets,
        rows=rows,
        credentials={"api_key": key_id, "oauth": oauth_id},
        api_keys=api_keys,
        rotated_tokens=rotated,
        oauth=fixed,
    )


# --- invocations ---------------------------------------------------------------------------


@dataclass
class Planned:
    run_id: UUID
    tool: str
    input: dict[str, Any]


def plan_invocations(count: int, seed: int) -> list[Planned]:
    """``count`` invocations over the tools by weight; the first ones force every action on
    every tool (coverage does not depend on luck), later ones now and then force one."""
    rng = random.Random(seed)
    actions = list(ACTIONS)
    forced = [(plan.key, action) for plan in TOOLS for action in actions]
    planned: list[Planned] = []
    for n in range(count):
        if n < len(forced):
            tool, action = forced[n]
            chaos: str | None = action
        else:
            tool = rng.choices([t.key for t in TOOLS], weights=[t.weight for t in TOOLS])[0]
            chaos = rng.choice(actions) if rng.random() < 0.05 else None
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 24)))
        data: dict[str, Any] = {"n": n, "text": text}
        if chaos is not None:
            data["chaos"] = chaos
        planned.append(Planned(uuid.UUID(int=rng.getrandbits(128), version=4), tool, data))
    rng.shuffle(planned)
    return planned


def decision(invocation_id: str, plan: ToolPlan, seed: int) -> str:
    """The approval script: a fixed choice per invocation (approve, reject or ignore)."""
    digest = hashlib.sha256(f"{seed}:{invocation_id}".encode()).digest()
    roll = digest[0] / 256
    if plan.short_ttl:
        return "approve" if roll < 0.6 else "reject" if roll < 0.7 else "ignore"
    return "approve" if roll < 0.85 else "reject"


class OwnerSession:
    """One autocommit connection acting as the owner; reconnects after a database restart."""

    def __init__(self, url: str, owner: UUID) -> None:
        self.url = url
        self.owner = owner
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.reconnects = 0

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        while self.conn is None or self.conn.closed or self.conn.broken:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=5
                )
                claims = json.dumps({"sub": str(self.owner), "role": "authenticated"})
                await conn.execute(
                    "SELECT set_config('role', 'authenticated', false),"
                    " set_config('request.jwt.claim.sub', %s, false),"
                    " set_config('request.jwt.claims', %s, false)",
                    (str(self.owner), claims),
                )
                self.conn = conn
            except DB_GONE:
                self.reconnects += 1
                await asyncio.sleep(RECONNECT_DELAY)
        return self.conn

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


@dataclass
class Creator:
    """Creates the planned invocations at a steady rate, each exactly once (by run_id)."""

    session: OwnerSession
    setup: Setup
    created: int = 0
    retried_batches: int = 0
    # invocation id -> wall clock once its creation had committed (the check needs when
    # the call was made: between its created_at and this)
    committed: dict[str, float] = field(default_factory=dict)

    async def run(self, planned: list[Planned], seconds: float) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for start in range(0, len(planned), CREATE_BATCH):
            batch = planned[start : start + CREATE_BATCH]
            due = started + seconds * start / max(len(planned), 1)
            await asyncio.sleep(max(0.0, due - loop.time()))
            await self._create(batch)

    async def _create(self, batch: list[Planned]) -> None:
        while True:
            conn = await self.session.connection()
            try:
                existing = await self._existing(conn, batch)
                for inv_id in existing.values():
                    self.committed.setdefault(inv_id, time.time())
                todo = [p for p in batch if p.run_id not in existing]
                made = []
                async with conn.transaction():
                    for p in todo:
                        cur = await conn.execute(
                            "SELECT fn_invoke_tool(%s, %s, %s, %s)::text",
                            (
                                self.setup.agent_id,
                                self.setup.tool_ids[p.tool],
                                Jsonb(p.input),
                                p.run_id,
                            ),
                        )
                        row = await cur.fetchone()
                        assert row is not None
                        made.append(str(row[0]))
                done = time.time()
                self.committed |= dict.fromkeys(made, done)
                self.created += len(todo)
                return
            except DB_GONE:
                # Committed or not, we cannot tell: the next round checks by run_id.
                self.retried_batches += 1
                await asyncio.sleep(RECONNECT_DELAY)

    async def _existing(
        self, conn: psycopg.AsyncConnection[Any], batch: list[Planned]
    ) -> dict[UUID, str]:
        cur = await conn.execute(
            "SELECT run_id, id::text FROM agents.tool_invocations WHERE run_id = ANY(%s)",
            ([p.run_id for p in batch],),
        )
        return {row[0]: row[1] for row in await cur.fetchall()}

    async def invoke_now(self, tool: str, input: dict[str, Any]) -> str:
        """One invocation outside the plan (the probes), its commit time recorded."""
        conn = await self.session.connection()
        cur = await conn.execute(
            "SELECT fn_invoke_tool(%s, %s, %s)::text",
            (self.setup.agent_id, self.setup.tool_ids[tool], Jsonb(input)),
        )
        row = await cur.fetchone()
        assert row is not None
        self.committed[str(row[0])] = time.time()
        return str(row[0])


# Pending invocations with the tool as it is now: what a reviewer is shown.
_PENDING = """
SELECT i.id::text, i.tool_id, i.input, to_jsonb(t) AS tool
  FROM agents.tool_invocations i JOIN agents.tools_registry t ON t.id = i.tool_id
 WHERE i.status = 'pending'
"""


def shown_digest(inv_id: str, input: Any, tool: dict[str, Any]) -> str | None:
    """The digest of the exact request a reviewer is shown (the approvals page's preview)."""
    try:
        return request_digest(build_request(tool | {"id": inv_id, "input": input}))
    except TemplateError:
        return None


@dataclass
class Approver:
    """Approves or rejects pending invocations by the script; leaves 'ignore' ones alone.

    An approval goes through ``Registry.approve`` with the digest of the request the
    approver was shown when it listed the call; if the tool changed in between, nothing is
    approved (Conflict) and the call is shown again in the next round.
    """

    session: OwnerSession
    setup: Setup
    seed: int
    registry: Registry
    decisions: dict[str, str] = field(default_factory=dict)
    results: Counter[str] = field(default_factory=Counter)

    async def run(self, stop: asyncio.Event) -> None:
        plans = {self.setup.tool_ids[p.key]: p for p in TOOLS}
        while not stop.is_set():
            try:
                await self._round(plans)
            except DB_GONE:
                await asyncio.sleep(RECONNECT_DELAY)
                continue
            await asyncio.sleep(APPROVAL_POLL)

    async def _round(self, plans: dict[UUID, ToolPlan]) -> None:
        conn = await self.session.connection()
        cur = await conn.execute(_PENDING)
        shown: list[tuple[str, str | None]] = []
        for inv_id, tool_id, input, tool in await cur.fetchall():
            if self.decisions.get(inv_id) == "ignore":
                continue
            plan = plans.get(tool_id)
            # outside the plan: the re-gating probe's calls, approved (pending since a claim)
            choice = decision(inv_id, plan, self.seed) if plan is not None else "approve"
            self.decisions[inv_id] = choice
            if choice == "approve":
                shown.append((inv_id, shown_digest(inv_id, input, tool)))
            elif choice == "reject":
                try:
                    reason = "chaos script says no ✋ — «rejected»"
                    await conn.execute("SELECT fn_reject_tool_invocation(%s, %s)", (inv_id, reason))
                    self.results["rejected"] += 1
                except psycopg.Error as exc:
                    if exc.sqlstate not in ("TR003", "TR004"):
                        raise
                    # TR004: the approval window closed; TR003: the sweep expired it first.
                    self.results[f"reject_refused_{exc.sqlstate}"] += 1
        if shown:
            self.results += await asyncio.to_thread(self.approve_all, shown)

    async def approve_these(self, ids: list[str]) -> Counter[str]:
        """Approve these calls now, each as shown (the binding probe's)."""
        conn = await self.session.connection()
        cur = await conn.execute(_PENDING + " AND i.id = ANY(%s::uuid[])", (ids,))
        shown = [(i, shown_digest(i, data, tool)) for i, _, data, tool in await cur.fetchall()]
        self.decisions |= dict.fromkeys([i for i, _ in shown], "approve")
        return await asyncio.to_thread(self.approve_all, shown)

    def approve_all(self, shown: list[tuple[str, str | None]]) -> Counter[str]:
        """Approve each as shown (sync: the owner's facade); stops when the database is
        gone (the calls are still pending, the next round tries again)."""
        results: Counter[str] = Counter()
        for inv_id, digest in shown:
            try:
                self.registry.approve(inv_id, digest)
                results["approved"] += 1
            except Conflict:
                results["approve_refused_conflict"] += 1  # tool changed, or no longer pending
            except InvalidState:  # the sweep expired it first
                results["approve_refused_TR003"] += 1
            except ApprovalExpired:  # the approval window closed
                results["approve_refused_TR004"] += 1
            except (ToolrelayError, psycopg.Error) as exc:
                results[f"approve_failed_{type(exc).__name__}"] += 1
                break
        return results

    async def pending(self) -> int:
        conn = await self.session.connection()
        cur = await conn.execute(
            "SELECT count(*) FROM agents.tool_invocations WHERE status IN ('pending', 'running')"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0
