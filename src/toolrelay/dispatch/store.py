"""The dispatcher's database side: every query it runs, by name, as role service_role."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from toolrelay.db.queries import load
from toolrelay.errors import ConfigurationError

Row = dict[str, Any]
# What a worker holds, for its claim: calls of each limited tool it holds unsent, the tools
# with no room left, and the calls of each owner it holds (the owners' turns).
Busy = tuple[Mapping[UUID, int], Sequence[UUID], Mapping[UUID, int]]
# The part of `finish` that makes a worker whose lease was taken over write nothing.
FINISH_FENCE = " AND i.attempt = r.attempt AND i.lease_owner = %(worker)s"
FINISH_ROWS = "SELECT done.*"  # what `finish` returns: the rows it wrote
POOL_MIN = 2
POOL_MAX = 6
# The claim's per-tool columns: on the first row of each tool only (tool_nth = 1).
TOOL_COLUMNS = (
    "current_fingerprint", "gated_now", "approval_ttl_seconds", "tool_key", "tool_status",
    "endpoint_url", "http_method", "request_template", "auth_method", "auth_placement",
    "auth_param_name", "auth_param_prefix", "credential_ref", "schema_input", "schema_output",
    "response_pointer", "connect_timeout_seconds", "timeout_seconds", "max_response_bytes",
    "max_attempts", "max_concurrency", "idempotency_header", "cred_id", "cred_owner",
    "cred_name", "cred_kind", "cred_status", "cred_allowed_hosts", "cred_key_id",
    "cred_wrapped_key", "cred_nonce", "cred_ciphertext", "cred_expires_at",
)  # fmt: skip


def share_tools(rows: list[Row]) -> list[Row]:
    """Give every claimed row its tool's columns, which the claim sent once per tool (the
    same statement read them: one version for all). The rows then share those values."""
    for row in rows:
        del row["walked_to"]
    firsts = {row["tool_id"]: row for row in rows if row["tool_nth"] == 1}
    for row in rows:
        if row.pop("tool_nth") != 1:
            first = firsts[row["tool_id"]]
            for column in TOOL_COLUMNS:
                row[column] = first[column]
    return rows


async def _as_dispatcher(conn: AsyncConnection[Any]) -> None:
    # Session-level: every statement on a worker connection runs as the dispatcher role.
    await conn.execute("SET ROLE service_role")
    # psycopg prepares a statement at its fifth run on a connection, and PostgreSQL keeps
    # one generic plan for it until the table is next analyzed. Planned while the queue was
    # small (a new database, a worker started after a purge), that plan reads the whole
    # table on every claim, mark and finish as it grows (docs/architecture.md). Every one
    # of the worker's statements has an index to reach its rows by.
    await conn.execute("SET enable_seqscan = off")
    # And that generic plan is kept: PostgreSQL would otherwise weigh it against planning
    # anew at every run, and for the hand-off's read it chose to plan anew more than half
    # of the time (0.5 ms a plan: more than the statement's whole execution).
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    # A generic plan is costed for any number of owners with calls (the claim visits each):
    # past jit_above_cost, PostgreSQL compiled the claim at every run, ~60 ms for a
    # statement that takes ~1 ms (the drain fell from ~2,000 to ~450 calls/s). Nothing the
    # worker runs is long enough for JIT to pay.
    await conn.execute("SET jit = off")
    await conn.commit()


async def _check_pooler_role(conn: AsyncConnection[Any]) -> None:
    # Behind a transaction pooler no session state survives, so SET ROLE cannot be used:
    # the login role itself must be able to act as the dispatcher.
    cur = await conn.execute(
        "SELECT rolsuper OR (rolbypassrls AND pg_has_role(current_user, 'service_role', 'USAGE'))"
        " FROM pg_roles WHERE rolname = current_user"
    )
    row = await cur.fetchone()
    if not row or not next(iter(row.values())):
        raise ConfigurationError(
            "behind a transaction pooler the worker's database user must be a superuser, or"
            " have BYPASSRLS and be a member of service_role"
            " (CREATE ROLE toolrelay_worker LOGIN BYPASSRLS IN ROLE service_role)"
        )


def open_pool(
    url: str, max_size: int = POOL_MAX, pooler: bool = False
) -> AsyncConnectionPool[AsyncConnection[Row]]:
    """Connections acting as the dispatcher. ``pooler``: safe behind PgBouncer's
    transaction mode (no session state, no server-side prepared statements)."""
    kwargs: dict[str, Any] = {"row_factory": dict_row, "autocommit": True}
    if pooler:
        kwargs["prepare_threshold"] = None
    return AsyncConnectionPool(
        url,
        min_size=min(POOL_MIN, max_size),
        max_size=max_size,
        kwargs=kwargs,
        configure=_check_pooler_role if pooler else _as_dispatcher,
        open=False,
    )


class DispatchStore:
    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection[Row]],
        worker: str,
        pooler: bool = False,
        written_rows: bool = False,
    ) -> None:
        """``written_rows``: ``finish`` returns the rows it wrote (for a process whose waiters
        are handed them); else only their ids, which is all a worker alone needs."""
        self.pool = pool
        self.worker = worker
        self.pooler = pooler
        self.q = load("dispatch")
        self.finish_query = self.q["finish"]
        assert self.finish_query.count(FINISH_ROWS) == 1, "finish ends selecting done's rows"
        if not written_rows:
            self.finish_query = self.finish_query.replace(FINISH_ROWS, "SELECT done.id")
        # The claim that also wakes this worker: its first CTE is the "wake" query.
        head, owners, rest = self.q["claim"].partition("WITH RECURSIVE owners AS (")
        assert owners, "the claim query starts its CTEs with owners"
        self.waking_claim = f"{head}WITH RECURSIVE woke AS ({self.q['wake']}), owners AS ({rest}"
        # The hand-off's rows (migration 0036) with the tool's part as the claim reads it.
        _, numbered, tail = self.q["claim"].partition("), numbered AS (")
        assert numbered, "the claim query's claimed CTE is followed by numbered"
        self.adopt_query = f"WITH claimed AS ({self.q['adopt']}{numbered}{tail}"
        # Exists only to prove the chaos check can fail (docs/reliability.md); never set it.
        if os.environ.get("TOOLRELAY_TEST_UNSAFE_NO_FENCING") == "1":
            self.finish_query = self.finish_query.replace(FINISH_FENCE, "")
        # The owner this worker's next claim goes on after (the claim visits a batch's worth
        # of owners at a time, in owner order). Each worker starts somewhere else, so that
        # workers started together do not all begin with the same owners.
        self.after: UUID = uuid4()

    async def claim(
        self, limit: int, lease_seconds: float, wake: bool = False, busy: Busy | None = None
    ) -> list[Row]:
        """``wake``: this worker was registered asleep; the claim ends that too. ``busy``:
        the limited tools' calls this worker holds unsent, which of them are full, and the
        calls of each owner it holds (``Busy``)."""
        async with self.pool.connection() as conn:
            query = self.waking_claim if wake else self.q["claim"]
            cur = await conn.execute(query, self._claiming(limit, lease_seconds, busy))
            return self._walked(await cur.fetchall())

    async def adopt(self, ids: Sequence[UUID]) -> list[Row]:
        """The calls claimed for this worker as they were made (migration 0036), as
        ``claim`` returns them; ids no longer this worker's first attempt are left out."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(self.adopt_query, {"ids": list(ids), "worker": self.worker})
            return share_tools(await cur.fetchall())

    async def sleep_and_claim(
        self, limit: int, lease_seconds: float, busy: Busy | None = None
    ) -> tuple[bool, list[Row]]:
        """Register asleep (migration 0018), then claim once more: what arrived before the
        registration is claimed here, what arrives after it notifies. One round trip
        (pipelined) unless behind a pooler. False: the lock timed out, not registered."""
        params = self._claiming(limit, lease_seconds, busy)
        async with self.pool.connection() as conn:
            if self.pooler:
                asleep_cur = await conn.execute(self.q["try_sleep"], params)
                claim_cur = await conn.execute(self.q["claim"], params)
            else:
                async with conn.pipeline():
                    asleep_cur = await conn.execute(self.q["try_sleep"], params)
                    claim_cur = await conn.execute(self.q["claim"], params)
            row = await asleep_cur.fetchone()
            return bool(row and row["asleep"]), self._walked(await claim_cur.fetchall())

    def _walked(self, rows: list[Row]) -> list[Row]:
        # A claim that took nothing leaves the cursor: its owners had no call to take now
        # (or another worker's claim was locking them), and the next claim sees them again.
        if rows:
            self.after = rows[0]["walked_to"]
        return share_tools(rows)

    def _claiming(self, limit: int, lease_seconds: float, busy: Busy | None) -> dict[str, Any]:
        held, full, owners = busy if busy is not None else ({}, [], {})
        return {"limit": limit, "worker": self.worker, "lease": lease_seconds, "after": self.after,
                "busy": Jsonb({str(tool): n for tool, n in held.items()}),
                "full": Jsonb([str(tool) for tool in full]),
                "owners": Jsonb({str(owner): n for owner, n in owners.items()})}  # fmt: skip

    async def register(self, seconds: float) -> bool:
        """This worker follows the sleep protocol for ``seconds`` more; whether its
        registration was still live (False: a sleeper row of its may be gone)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.q["register"], {"worker": self.worker, "seconds": seconds}
            )
            row = await cur.fetchone()
            return bool(row and row["live"])

    async def unregister(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(self.q["unregister"], {"worker": self.worker})

    async def mark_sent(self, items: Sequence[Row]) -> set[UUID]:
        payload = [{"id": str(r["id"]), "attempt": r["attempt"]} for r in items]
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.q["mark_sent"], {"items": Jsonb(payload), "worker": self.worker}
            )
            return {row["id"] for row in await cur.fetchall()}

    async def finish(self, results: Sequence[Row], attempts: Sequence[Row]) -> dict[UUID, Row]:
        """Record results and attempts: the rows written (input and output left out; only
        the id without ``written_rows``), by id; a result whose lease was taken over is not
        among them."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.finish_query,
                {
                    "results": Jsonb(list(results)),
                    "attempts": Jsonb(list(attempts)),
                    "worker": self.worker,
                },
            )
            return {row["id"]: row for row in await cur.fetchall()}

    async def heartbeat(self, ids: Sequence[UUID], lease_seconds: float) -> set[UUID]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self.q["heartbeat"],
                {"ids": list(ids), "worker": self.worker, "lease": lease_seconds},
            )
            return {row["id"] for row in await cur.fetchall()}

    async def release(self, ids: Sequence[UUID]) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(self.q["release"], {"ids": list(ids), "worker": self.worker})

    async def busy(self, passed_over: Sequence[UUID] = ()) -> bool:
        """Whether anything is runnable or leased, not counting the unleased calls of the
        tools this worker passes over (``passed_over``)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(self.q["pending_work"], {"skip": list(passed_over)})
            row = await cur.fetchone()
            return bool(row and row["busy"])

    async def expire_approvals(self) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(self.q["expire_approvals"])
            row = await cur.fetchone()
            return int(row["expired"]) if row else 0
