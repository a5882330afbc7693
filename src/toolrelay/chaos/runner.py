"""One chaos run, start to finish.

1. A fresh database, migrated; the upstream, token endpoint and canaries on loopback.
2. The binding probe: before any worker runs, a few calls are approved as shown, then their
   tool is changed (each must fail tool_changed without being sent), and a few are made on
   an ungated tool that is then gated (each must wait for approval at its claim).
3. The stale-lease probe: worker 0 takes a few slow reads and is frozen (SIGSTOP) past its
   lease; worker 1 takes them over; worker 0 is thawed while worker 1's requests are still
   in flight, so worker 0 tries to record results that are no longer its to record.
4. The main phase: invocations created at a steady rate, the approval script deciding gated
   ones, the owner changing tools and credentials (mutations.py), a random worker SIGKILLed
   (and restarted) every few seconds, another frozen past its lease now and then, and, with
   --db-restart, PostgreSQL restarted once.
5. Quiet: faults stop, the workers finish what is running and are stopped; a final
   ``worker --drain`` must find nothing left, or finish it, and exit.
6. The checks (checks.py) over the database, the upstream's records, the configuration log
   and the logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import platform
import random
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from toolrelay import config as env_config
from toolrelay.chaos.checks import AttemptRow, CheckResult, InvocationRow, RunData, run_checks
from toolrelay.chaos.collect import LogSummary, read_database, read_gating, read_logs
from toolrelay.chaos.config import ChaosConfig
from toolrelay.chaos.database import Server
from toolrelay.chaos.mutations import KINDS, ConfigLog, Mutator, binding_change, regating_change
from toolrelay.chaos.scenario import (
    BIND_TOOL,
    PROBE_TOOL,
    REGATE_TOOL,
    TOOLS,
    Approver,
    Creator,
    OwnerSession,
    Setup,
    plan_invocations,
    register,
)
from toolrelay.chaos.upstream import ACTIONS, Canary, ChaosUpstream, StallScript, TokenEndpoint
from toolrelay.chaos.workers import WorkerPool, worker_env
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database, migrate
from toolrelay.errors import ConfigurationError
from toolrelay.registry import Registry

log = logging.getLogger("toolrelay.chaos")

PROBE_FIRST_HOLD = 1.5  # seconds the upstream holds the stalled worker's probe requests
PROBE_SECOND_HOLD = 4.0  # ... and the rescuer's, so the thawed worker answers first
PROBE_TIMEOUT = 30.0  # the probe tool's timeout_seconds: nothing in the probe times out
PROBE_WAIT = 60.0  # seconds to wait for the probe's requests to arrive
PROBE_GRACE = 0.5  # seconds for the rescuer to record its answers before faults begin
POLL = 0.05  # seconds


@dataclass
class ChaosReport:
    config: dict[str, Any]
    started_at: str
    machine: dict[str, Any]
    duration_seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def as_dict(self, with_checks: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ok": self.ok,
            "started_at": self.started_at,
            "duration_seconds": round(self.duration_seconds, 1),
            "machine": self.machine,
            "config": self.config,
            "phases": {k: round(v, 1) for k, v in self.phases.items()},
            "numbers": self.numbers,
            "error": self.error,
        }
        if with_checks:
            data["checks"] = [c.as_dict() for c in self.checks]
        return data


def source_revision() -> str | None:
    """The git commit the run was made from (``+dirty`` with local changes), if known."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    if rev.returncode != 0:
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_info(server: Server | None) -> dict[str, Any]:
    return {
        "revision": source_revision(),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "postgresql": server.server_version() if server else None,
        "database": "embedded (pgserver)" if server and server.embedded else "DATABASE_URL",
    }


def blocked_targets(canaries: list[Canary]) -> list[str]:
    """Where the upstream redirects to; the egress guard must refuse every one of them."""
    targets = [
        "http://10.0.0.1/internal",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://192.168.1.1/admin",
    ]
    for canary in canaries:
        if canary.host == "127.0.0.2":
            targets += [
                f"http://127.0.0.2:{canary.port}/",  # loopback, but not the allowed 127.0.0.1
                f"http://2130706434:{canary.port}/",  # 127.0.0.2 as one decimal number
                f"http://[::ffff:127.0.0.2]:{canary.port}/",  # IPv4-mapped IPv6
            ]
        elif canary.host == "::1":
            targets.append(f"http://[::1]:{canary.port}/")
    return targets


class Run:
    def __init__(self, cfg: ChaosConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.server: Server | None = None
        self.db_url = ""
        self.pool: WorkerPool | None = None
        self.session: OwnerSession | None = None
        self.canaries = [Canary("127.0.0.2"), Canary("::1")]
        self.upstream: ChaosUpstream | None = None
        self.tokens = TokenEndpoint(cfg.seed + 1, cfg.token_failure_rate)
        self.master_key = generate_master_key("chaos")
        self.faults: Counter[str] = Counter()
        self.db_restart_seconds: float | None = None
        self.events_path = cfg.out_dir / "chaos-events.jsonl"
        self.probe_ids: list[str] = []
        self.bind_ids: list[str] = []
        self.regate_ids: list[str] = []
        self.owner_db: Database | None = None  # the owner's facade (approvals, mutations)
        self.log: ConfigLog | None = None
        self.mutator: Mutator | None = None
        self.creator: Creator | None = None
        self.approver: Approver | None = None
        self.approver_task: asyncio.Task[None] | None = None
        self.stop_approver = asyncio.Event()
        self.drain_result: dict[str, Any] = {}
        self.phases: dict[str, float] = {}
        self._phase_start = time.monotonic()
        self.report = ChaosReport(
            config=cfg.public(), started_at=datetime.now(UTC).isoformat(), machine={}
        )

    # --- plumbing ------------------------------------------------------------------------

    def event(self, what: str, **details: Any) -> None:
        entry = {"time": datetime.now(UTC).isoformat(), "event": what} | details
        with self.events_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(entry, default=str) + "\n")
        log.info(what, extra={"action": "chaos", **details})

    def phase(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = now - self._phase_start
        self._phase_start = now
        self.event("phase done", phase=name, seconds=round(self.phases[name], 2))

    async def _wait_until(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise ConfigurationError(f"chaos: timed out waiting for {what}")
            await asyncio.sleep(POLL)

    # --- phases --------------------------------------------------------------------------

    async def run(self) -> ChaosReport:
        started = time.monotonic()
        self.cfg.out_dir.mkdir(parents=True, exist_ok=True)
        (self.cfg.out_dir / "logs").mkdir(exist_ok=True)
        for stale in (self.cfg.out_dir / "logs").glob("*.log"):
            stale.unlink()
        self.events_path.unlink(missing_ok=True)
        try:
            setup = await self._setup()
            await self._binding_probe(setup)
            await self._probe(setup)
            await self._main(setup)
            quiet = await self._quiesce()
            await self._drain(quiet)
            await self._check(setup)
        except Exception as exc:
            self.report.error = f"{type(exc).__name__}: {exc}"
            self.event("run failed", error=self.report.error)
        finally:
            await self._cleanup()
            self.report.duration_seconds = time.monotonic() - started
            self.report.phases = self.phases
        return self.report

    async def _setup(self) -> Setup:
        cfg = self.cfg
        self.server = await asyncio.to_thread(
            Server.open, cfg.server_url or env_config.database_url_from_env()
        )
        self.report.machine = await asyncio.to_thread(machine_info, self.server)
        if cfg.db_restart:
            self.server.restart_command()  # fails early when the server cannot be restarted
        self.db_url = await asyncio.to_thread(self.server.create_database)
        await asyncio.to_thread(migrate, self.db_url)
        for canary in self.canaries:
            if not await canary.start():
                self.event("canary unavailable", host=canary.host)
        self.canaries = [c for c in self.canaries if c.port]
        self.upstream = ChaosUpstream(
            cfg.seed,
            cfg.tool_timeout,
            blocked_targets(self.canaries),
            stall=StallScript(first=PROBE_FIRST_HOLD, second=PROBE_SECOND_HOLD),
        )
        await self.upstream.start()
        await self.tokens.start()
        keyring = Keyring.parse(self.master_key)
        setup = await asyncio.to_thread(
            register,
            Database(self.db_url),
            keyring,
            self.upstream,
            self.tokens,
            cfg.tool_timeout,
            cfg.approval_ttl,
            PROBE_TIMEOUT,
        )
        setup.secrets["master_key"] = [self.master_key.partition(":")[2]]
        env = worker_env(self.db_url, self.master_key, cfg.out_dir / "home", cfg.unsafe_no_fencing)
        (cfg.out_dir / "home").mkdir(exist_ok=True)
        module = "toolrelay.chaos.unbound" if cfg.unsafe_no_binding else "toolrelay.cli"
        self.pool = WorkerPool(
            cfg.workers, env, cfg.out_dir / "logs", cfg.lease_seconds, cfg.concurrency, module
        )
        self.session = OwnerSession(self.db_url, setup.owner)
        self.owner_db = Database(self.db_url)
        registry = Registry(self.owner_db, setup.owner)
        self.log = ConfigLog.initial(setup)
        self.mutator = Mutator(
            registry,
            CredentialStore(self.owner_db, keyring),
            setup,
            self.log,
            self.upstream.base_url,
            int(self.upstream.base_url.rpartition(":")[2]),
            random.Random(cfg.seed + 2),
            every=cfg.mutate_every,
        )
        self.creator = Creator(self.session, setup)
        self.approver = Approver(self.session, setup, cfg.seed, registry)
        self.phase("setup")
        return setup

    async def _binding_probe(self, setup: Setup) -> None:
        """Before any worker runs: calls approved as shown, then their tool changed (every
        one must fail tool_changed unsent), and calls made ungated, then their tool gated
        (every one must wait for an approval at its claim). The unsafe build sends all."""
        assert self.creator is not None and self.approver is not None
        assert self.mutator is not None
        for n in range(self.cfg.binding_probe):
            self.bind_ids.append(await self.creator.invoke_now(BIND_TOOL, {"n": n, "text": "b"}))
            self.regate_ids.append(await self.creator.invoke_now(REGATE_TOOL, {"n": n}))
        results = await self.approver.approve_these(self.bind_ids)
        if results["approved"] != len(self.bind_ids):
            raise ConfigurationError(f"chaos: binding probe approvals failed: {dict(results)}")
        write = self.mutator.write_tool
        await asyncio.to_thread(write, BIND_TOOL, "binding probe", binding_change)
        await asyncio.to_thread(write, REGATE_TOOL, "re-gating probe", regating_change)
        self.event(
            "binding probe: approved or made ungated, then changed", calls=len(self.bind_ids)
        )
        self.phase("binding probe")

    async def _probe(self, setup: Setup) -> None:
        """Worker 0 frozen past its lease mid-request; worker 1 rescues; worker 0 thaws."""
        assert self.pool is not None and self.session is not None and self.upstream is not None
        assert self.creator is not None
        pool, upstream = self.pool, self.upstream
        await pool.start(0)
        conn = await self.session.connection()
        for _ in range(self.cfg.probe_invocations):
            self.probe_ids.append(await self.creator.invoke_now(PROBE_TOOL, {}))
        ids = self.probe_ids
        await self._wait_until(
            lambda: all(len(upstream.seen(i)) >= 1 for i in ids), PROBE_WAIT, "probe requests"
        )
        # The binding probe's calls are decided at worker 0's claim (failed, or back to
        # pending) and recorded in a batch: stalled before that batch, they would be rescued
        # past their attempts instead, and the probe would show nothing.
        bound = [*self.bind_ids, *self.regate_ids]
        deadline = time.monotonic() + PROBE_WAIT
        while await self._running(conn, bound):
            if time.monotonic() > deadline:
                raise ConfigurationError("chaos: timed out waiting for the binding probe")
            await asyncio.sleep(POLL)
        pool.stall(0)
        self.event("probe: worker 0 frozen with its requests in flight", invocations=len(ids))
        await pool.start(1)
        await self._wait_until(
            lambda: all(len(upstream.seen(i)) >= 2 for i in ids),
            PROBE_WAIT + self.cfg.lease_seconds,
            "the rescuer's probe requests",
        )
        pool.resume(0)
        self.event("probe: worker 1 took over; worker 0 thawed")
        # No faults until the probe is over: its outcome must depend on the probe alone.
        deadline = time.monotonic() + PROBE_SECOND_HOLD + PROBE_WAIT
        while not self._probe_answered() or await self._running(conn, self.probe_ids):
            if time.monotonic() > deadline:
                raise ConfigurationError("chaos: timed out waiting for the probe to finish")
            await asyncio.sleep(POLL * 4)
        await asyncio.sleep(PROBE_GRACE)  # the rescuer records what it was answered
        self.phase("probe")

    def _probe_answered(self) -> bool:
        """The upstream answered the rescuer's request (the second) of every probe."""
        assert self.upstream is not None
        return all(self.upstream.seen(i)[1].status is not None for i in self.probe_ids)

    async def _running(self, conn: psycopg.AsyncConnection[Any], ids: list[Any]) -> bool:
        cur = await conn.execute(
            "SELECT count(*) FROM agents.tool_invocations"
            " WHERE id = ANY(%s::uuid[]) AND status = 'running'",
            (ids,),
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _main(self, setup: Setup) -> None:
        assert self.pool is not None and self.creator is not None
        assert self.approver is not None and self.mutator is not None
        cfg = self.cfg
        for index in range(2, cfg.workers):
            await self.pool.start(index)
        planned = plan_invocations(cfg.invocations, cfg.seed)
        stop_faults = asyncio.Event()
        self.approver_task = asyncio.create_task(self.approver.run(self.stop_approver))
        faults = asyncio.create_task(self._faults(stop_faults))
        mutating = asyncio.create_task(self.mutator.run(cfg.create_seconds, cfg.max_mutations))
        try:
            await self.creator.run(planned, cfg.create_seconds)
            self.event("all invocations created", created=self.creator.created)
            await mutating
            self.event("owner mutations done", **self.mutator.counts)
            await asyncio.sleep(cfg.settle_seconds)
        finally:
            mutating.cancel()
            stop_faults.set()
            await faults
        self.phase("main")

    async def _faults(self, stop: asyncio.Event) -> None:
        """SIGKILL a worker every kill_every s, SIGSTOP one past its lease every stall_every
        s, and restart the database once half way through creation (with --db-restart)."""
        assert self.pool is not None and self.server is not None
        pool, cfg, rng = self.pool, self.cfg, self.rng
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_kill, next_stall = start + cfg.kill_every, start + cfg.stall_every
        restart_at = start + cfg.create_seconds / 2 if cfg.db_restart else None
        thaw: list[tuple[float, int]] = []
        while not stop.is_set() or restart_at is not None:
            now = loop.time()
            for when, index in [t for t in thaw if t[0] <= now]:
                pool.resume(index)
                thaw.remove((when, index))
            alive = pool.alive()
            if now >= next_kill and alive:
                index = rng.choice(alive)
                self.event("kill", worker=index)
                await pool.kill(index)
                next_kill = now + cfg.kill_every
            elif now >= next_stall and len(alive) >= 2:
                index = rng.choice(alive)
                frozen = cfg.lease_seconds + 1.0 + rng.uniform(0, 1.0)
                self.event("stall", worker=index, seconds=round(frozen, 2))
                pool.stall(index)
                thaw.append((now + frozen, index))
                next_stall = now + cfg.stall_every
            if restart_at is not None and (now >= restart_at or stop.is_set()):
                self.event("database restart")
                self.db_restart_seconds = await asyncio.to_thread(self.server.restart)
                self.faults["db_restarts"] += 1
                self.event("database back", seconds=round(self.db_restart_seconds, 2))
                restart_at = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
        for _, index in thaw:
            pool.resume(index)

    async def _quiesce(self) -> bool:
        """Wait until nothing is pending or running; True when that happened in time."""
        assert self.pool is not None and self.approver is not None
        assert self.approver_task is not None
        deadline = time.monotonic() + self.cfg.quiesce_timeout
        quiet = False
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.OperationalError, psycopg.InterfaceError):
                if await self.approver.pending() == 0:
                    quiet = True
                    break
            await asyncio.sleep(0.5)
        self.stop_approver.set()
        await self.approver_task
        # Quiet: SIGTERM (nothing in flight to hand back). Otherwise SIGKILL, and the drain
        # worker recovers the leases.
        await self.pool.stop_all(graceful=quiet)
        self.event("workers stopped", quiet=quiet)
        self.phase("quiesce")
        return quiet

    async def _drain(self, quiet: bool) -> None:
        assert self.pool is not None
        code, seconds = await self.pool.drain(self.cfg.drain_timeout)
        self.drain_result = {"exit_code": code, "seconds": round(seconds, 2), "quiet": quiet}
        self.event("drain worker finished", **self.drain_result)
        self.phase("drain")

    async def _check(self, setup: Setup) -> None:
        assert self.server is not None and self.upstream is not None and self.pool is not None
        assert self.approver is not None and self.log is not None and self.creator is not None
        cfg = self.cfg
        invocations, attempts = await asyncio.to_thread(read_database, self.db_url)
        versions = [v for vs in self.log.tools.values() for v in vs]
        gating = await asyncio.to_thread(read_gating, self.db_url, [v.row for v in versions])
        for version, gated in zip(versions, gating, strict=True):
            version.gated = gated
        dump = await asyncio.to_thread(self.server.pg_dump, self.db_url)
        logs, texts = await asyncio.to_thread(read_logs, cfg.out_dir / "logs")
        texts["pg_dump"] = dump
        texts["chaos events"] = self.events_path.read_text("utf-8")
        texts["upstream record"] = self._write_upstream_record()
        issued = setup.secrets["oauth_access_token"] + self.tokens.issued
        secrets = {**setup.secrets, "oauth_access_token": issued}
        numbers = self._numbers(invocations, attempts, logs)
        self.report.numbers = numbers
        texts["report"] = json.dumps(self.report.as_dict(with_checks=False), default=str)
        data = RunData(
            invocations=invocations,
            attempts=attempts,
            arrivals=self.upstream.stats.arrivals,
            without_invocation=self.upstream.stats.without_invocation,
            canaries={f"{c.host}:{c.port}": c.connections for c in self.canaries},
            blocked_redirects_issued=self.upstream.stats.redirects_blocked,
            secrets=secrets,
            texts=texts,
            decisions=self.approver.decisions,
            probe_ids=self.probe_ids,
            coverage=self._coverage(numbers),
            versions=self.log.tools,
            hosts=self.log.hosts,
            committed=self.creator.committed,
            drain_exit=self.drain_result.get("exit_code"),
            frozen_pids=frozenset(self.pool.frozen_pids),
        )
        self.report.checks = run_checks(data)
        self.phase("check")

    def _write_upstream_record(self) -> str:
        """Every request the upstream saw, one JSON line per invocation (no secrets in it:
        the leak check reads it back)."""
        assert self.upstream is not None
        lines = [
            json.dumps({"invocation": inv_id, "requests": [a.as_dict() for a in seen]}) + "\n"
            for inv_id, seen in self.upstream.stats.arrivals.items()
        ]
        text = "".join(lines)
        (self.cfg.out_dir / "upstream.jsonl").write_text(text, "utf-8")
        return text

    def _numbers(
        self, invocations: list[InvocationRow], attempts: list[AttemptRow], logs: LogSummary
    ) -> dict[str, Any]:
        assert self.pool is not None and self.upstream is not None
        assert self.creator is not None and self.approver is not None
        assert self.mutator is not None and self.log is not None
        by_outcome: Counter[str] = Counter()
        by_kind: dict[str, Counter[str]] = {"write": Counter(), "idempotent": Counter()}
        rows: Counter[str] = Counter(a.invocation_id for a in attempts)
        distinct: dict[str, set[int]] = {}
        for a in attempts:
            distinct.setdefault(a.invocation_id, set()).add(a.attempt)
        lost = retries = 0
        for inv in invocations:
            outcome = inv.status if inv.error_code is None else f"{inv.status}/{inv.error_code}"
            by_outcome[outcome] += 1
            by_kind["write" if inv.write else "idempotent"][outcome] += 1
            lost += max(0, inv.attempt - len(distinct.get(inv.id, ())))
            retries += max(0, rows[inv.id] - 1)
        stats = self.upstream.stats
        requests = sum(len(v) for v in stats.arrivals.values())
        writes = [i for i in invocations if i.write]
        seen_writes = Counter(
            sum(1 for a in stats.arrivals.get(i.id, ()) if a.accepted) for i in writes
        )
        return {
            "invocations": len(invocations),
            "created_by_script": self.creator.created,
            "probe_invocations": len(self.probe_ids),
            "by_outcome": dict(sorted(by_outcome.items())),
            "by_kind": {k: dict(sorted(v.items())) for k, v in by_kind.items()},
            "writes_processed_n_times": {str(k): v for k, v in sorted(seen_writes.items())},
            "attempt_rows": len(attempts),
            # A lease taken over: its holder died without a word (no attempt row), or
            # finished too late and was refused (its row is there, its result discarded).
            "rescued_leases": lost + logs.stale_discarded,
            "claims_lost": lost,
            "retries": retries,
            "stale_results_discarded": logs.stale_discarded,
            "results_not_recorded_db_down": logs.events["record_failed"],
            "upstream_requests": requests,
            "upstream_actions": dict(sorted(stats.actions.items())),
            "blocked_redirects_issued": stats.redirects_blocked,
            "canary_connections": {f"{c.host}:{c.port}": c.connections for c in self.canaries},
            "token_endpoint": {
                "requests": self.tokens.requests,
                "failures": dict(self.tokens.failures),
                "tokens_issued": len(self.tokens.issued),
            },
            "approvals": dict(self.approver.results),
            "mutations": dict(self.mutator.counts),
            "configurations_written": sum(len(v) - 1 for v in self.log.tools.values()),
            "binding_probe": self._binding_numbers(invocations),
            "faults": {
                "kills": self.pool.events["killed"],
                "stalls": self.pool.events["stalled"],
                "worker_starts": self.pool.events["started"],
                "unexpected_worker_exits": self.pool.events["unexpected_exit"],
                "db_restarts": self.faults["db_restarts"],
                "db_restart_seconds": (
                    round(self.db_restart_seconds, 2) if self.db_restart_seconds else None
                ),
                "creation_batches_retried": self.creator.retried_batches,
            },
            "drain": self.drain_result,
            "logs": logs.as_dict(),
            "throughput_per_second": round(
                len(invocations)
                / max(self.phases.get("main", 0) + self.phases.get("quiesce", 0), 1),
                1,
            ),
        }

    def _binding_numbers(self, invocations: list[InvocationRow]) -> dict[str, int]:
        assert self.upstream is not None
        seen = self.upstream.seen
        bind, regate = set(self.bind_ids), set(self.regate_ids)
        changed = [i for i in invocations if i.id in bind]
        gated = [i for i in invocations if i.id in regate]
        return {
            "approved_then_changed": len(changed),
            "refused_unsent": sum(
                1
                for i in changed
                if (i.status, i.error_code) == ("failed", "tool_changed") and not seen(i.id)
            ),
            "changed_sent": sum(1 for i in changed if seen(i.id)),
            "made_ungated_then_gated": len(gated),
            # back to pending at the claim, then approved, then sent (the claim that waited
            # counted no attempt: a tool allowed one still sends it)
            "waited_for_approval": sum(1 for i in gated if i.decided and seen(i.id)),
            "gated_sent_unapproved": sum(1 for i in gated if seen(i.id) and not i.decided),
        }

    def _coverage(self, numbers: dict[str, Any]) -> dict[str, tuple[int, int]]:
        """What the run must have exercised for its passing checks to mean something."""
        faults = numbers["faults"]
        outcomes = numbers["by_outcome"]
        probe = len(self.probe_ids)
        coverage = {
            "kills": (faults["kills"], 1),
            "stalls": (faults["stalls"], 1),
            "rescued_leases": (numbers["rescued_leases"], probe),
            "stale_results_discarded": (numbers["stale_results_discarded"], probe),
            "binding_probe_refused": (
                numbers["binding_probe"]["refused_unsent"],
                len(self.bind_ids),
            ),
            "regating_probe_waited": (
                numbers["binding_probe"]["waited_for_approval"],
                len(self.regate_ids),
            ),
        }
        # Every kind of owner mutation, when the run is long enough to reach each.
        mutations = numbers["mutations"]
        steps = min(self.cfg.max_mutations, int(self.cfg.create_seconds / self.cfg.mutate_every))
        if steps > len(KINDS):
            coverage |= {f"mutation_{kind}": (mutations.get(kind, 0), 1) for kind in KINDS}
        if self.cfg.db_restart:
            coverage["db_restarts"] = (faults["db_restarts"], 1)
        if self.cfg.invocations >= len(TOOLS) * len(ACTIONS):  # every action forced once
            coverage |= {
                "retries": (numbers["retries"], 1),
                "outcome_unknown": (outcomes.get("failed/outcome_unknown", 0), 1),
                "egress_blocked": (outcomes.get("failed/egress_blocked", 0), 1),
                "token_endpoint_failures": (sum(numbers["token_endpoint"]["failures"].values()), 1),
                "rejected": (outcomes.get("rejected", 0), 1),
            }
        return coverage

    async def _cleanup(self) -> None:
        if self.pool is not None:
            with contextlib.suppress(Exception):
                await self.pool.stop_all(graceful=False)
        if self.session is not None:
            with contextlib.suppress(Exception):
                await self.session.close()
        if self.owner_db is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.owner_db.close)
        for closer in (self.upstream, self.tokens, *self.canaries):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer.close()
        if self.server is not None:
            if self.db_url and not self.cfg.keep_database:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.server.drop_database, self.db_url)
            await asyncio.to_thread(self.server.close)


async def run_chaos(cfg: ChaosConfig) -> ChaosReport:
    return await Run(cfg).run()
