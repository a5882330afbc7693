"""Several hosts: three workers, one loses its link in the middle of slow writes.

3,000 POST invocations (a quarter of them slow at the upstream) are dispatched by three
worker processes. Once the chosen host has slow writes in flight it is cut off. Then:

* its leases expire and the other hosts recover them: writes it had marked as possibly sent
  end ``failed/outcome_unknown`` and are never sent again; claims it had not sent yet are
  sent by the others and complete;
* the other hosts finish everything else;
* when the cut host comes back it learns the answers to its old requests and tries to record
  them, and fencing makes those writes no-ops: no invocation row changes.

``test_hosts_in_network_namespaces`` makes each host a network namespace with its own
address on a private bridge (10.213.0.0/24, never routed anywhere) and cuts the host's veth;
PostgreSQL is a private server listening on the bridge. Where namespaces cannot be made it is
skipped, saying why, and ``test_processes_stand_in_for_hosts`` (which always runs) does the
same with plain processes on loopback, the cut being SIGSTOP for longer than the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from aiohttp import web
from psycopg.rows import dict_row

from tests.dispatch.test_many_workers import invoke_many
from tests.pgtest import create_database, drop_database
from tests.registry.helpers import agent_with_tool
from tests.scale.netns import (
    GATEWAY,
    SUBNET,
    NamespacesUnavailable,
    Network,
    PrivatePostgres,
    host_address,
)
from toolrelay.db import Database, migrate
from toolrelay.dispatch.executor import INVOCATION_HEADER
from toolrelay.registry import Registry

INVOCATIONS = 3000
HOSTS = 3
VICTIM = 3  # the host that loses its link (1-based)
LEASE_SECONDS = 3
CONCURRENCY = 32
SLOW_EVERY = 4  # every 4th invocation takes 0.3-1.0 s at the upstream
CUT_AFTER = INVOCATIONS // 4  # answers given before the cut: it happens mid-run
MIN_INFLIGHT_AT_CUT = 3  # the victim's slow writes in flight at the upstream when cut
MIN_DONE_BEFORE_CUT = 50  # results the victim recorded before it is cut

POLL = 0.02  # seconds between looks at observable state
CUT_TIMEOUT = 30.0  # for the run to reach the cut point
STOPPED_TIMEOUT = 10.0  # for a SIGSTOPped worker to show as stopped
FINISH_TIMEOUT = 40.0  # for the other hosts to finish everything, recovered leases included
REPORT_TIMEOUT = 45.0  # for the victim to hear its old answers once back (TCP backoff)
STOP_TIMEOUT = 20.0  # for a worker to exit after SIGTERM (its shutdown grace is 10 s)


def delay_for(n: int) -> float:
    if n % SLOW_EVERY:
        return 0.0
    return 0.3 + 0.7 * ((n * 7919) % 100) / 100


# --- the upstream ---------------------------------------------------------------------------


@dataclass
class Upstream:
    """Counts every request per invocation and per client address; knows what is in flight."""

    by_invocation: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    inflight: dict[str, str] = field(default_factory=dict)  # invocation -> client address
    answered: int = 0
    restored_at: float | None = None
    late: list[tuple[str, str]] = field(default_factory=list)  # arrived after the link-up

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        inv = request.headers.get(INVOCATION_HEADER, "")
        remote = request.remote or ""
        self.by_invocation[inv] += 1
        self.sources[remote] += 1
        if self.restored_at is not None:
            self.late.append((inv, remote))
        self.inflight[inv] = remote
        try:
            delay = delay_for(int(body["n"]))
            if delay:
                await asyncio.sleep(delay)
        finally:
            self.inflight.pop(inv, None)
            self.answered += 1
        return web.json_response({"n": body["n"], "ok": True})


@contextlib.asynccontextmanager
async def serve_upstream(address: str) -> AsyncIterator[tuple[Upstream, str]]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_route("POST", "/write", upstream.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, address, 0, backlog=1024)
    await site.start()
    try:
        yield upstream, f"http://{address}:{runner.addresses[0][1]}/write"
    finally:
        await runner.cleanup()


# --- hosts ----------------------------------------------------------------------------------


@dataclass
class Host:
    index: int
    prefix: list[str]  # how to run a command on this host
    address: str | None  # the client address the upstream sees, when the host has its own
    log: Path
    appname: str
    proc: asyncio.subprocess.Process | None = None
    _log_file: Any = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def lease_pattern(self) -> str:
        return f"%:{self.pid}:%"  # worker ids are host:pid:random

    async def start(self, database_url: str, egress_allow: str) -> None:
        env = os.environ | {
            "DATABASE_URL": database_url,
            "TOOLRELAY_EGRESS_ALLOW": egress_allow,
            "TOOLRELAY_MASTER_KEY": "",
            "PGAPPNAME": self.appname,  # names its connections in pg_stat_activity
        }
        self._log_file = self.log.open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            *self.prefix, sys.executable, "-m", "toolrelay.cli", "worker",
            "--lease-seconds", str(LEASE_SECONDS), "--concurrency", str(CONCURRENCY),
            env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=self._log_file,
        )  # fmt: skip

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self) -> int | None:
        """SIGTERM (after SIGCONT, in case it is stopped), then SIGKILL past the timeout."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.proc.returncode

    def log_records(self) -> list[dict[str, Any]]:
        records = []
        for line in self.log.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                records.append(json.loads(line))
        return records


async def stop_all(hosts: list[Host]) -> list[int | None]:
    return list(await asyncio.gather(*(h.stop() for h in hosts)))


@dataclass
class Scenario:
    database_url: str  # the same address from the test and from every host
    egress_allow: str  # where the upstream is, for the egress guard
    hosts: list[Host]
    cut: Callable[[Host], Awaitable[None]]
    restore: Callable[[Host], Awaitable[None]]


# --- polling --------------------------------------------------------------------------------


async def until(
    what: str,
    timeout: float,
    check: Callable[[], Awaitable[Any]],
    explain: Callable[[], Awaitable[str]] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            detail = await explain() if explain is not None else ""
            pytest.fail(f"timed out after {timeout}s waiting for {what}\n{detail}")
        await asyncio.sleep(POLL)


async def fetch(conn: psycopg.AsyncConnection[Any], sql: str, *args: Any) -> list[Any]:
    cur = await conn.execute(sql, args or None)
    return await cur.fetchall()


SNAPSHOT = """
SELECT id, status, error_code, error, http_status, output, attempt, sent_at, finished_at,
       updated_at, lease_owner, lease_expires_at, run_after
  FROM agents.tool_invocations ORDER BY id
"""


# --- the scenario ---------------------------------------------------------------------------


async def run_scenario(scenario: Scenario, upstream: Upstream, endpoint: str) -> dict[str, Any]:
    registry = Registry(Database(scenario.database_url), uuid.uuid4())
    agent, tool = agent_with_tool(
        registry, key="scale.write", endpoint_url=endpoint, http_method="POST",
        egress_class="read_only", timeout_seconds=20,
    )  # fmt: skip
    invoke_many(registry, agent, tool["key"], INVOCATIONS)
    victim = scenario.hosts[VICTIM - 1]
    numbers: dict[str, Any] = {}
    started = time.monotonic()

    async with await psycopg.AsyncConnection.connect(
        scenario.database_url, autocommit=True, row_factory=dict_row
    ) as conn:

        async def victim_inflight() -> list[str]:
            ids = list(upstream.inflight)
            if victim.address is not None:
                return [i for i in ids if upstream.inflight.get(i) == victim.address]
            rows = await fetch(
                conn,
                "SELECT id::text FROM agents.tool_invocations"
                " WHERE id = ANY(%s::uuid[]) AND lease_owner LIKE %s AND status = 'running'",
                ids, victim.lease_pattern,
            )  # fmt: skip
            return [r["id"] for r in rows]

        async def ready_to_cut() -> list[str] | None:
            dead = [h.index for h in scenario.hosts if not h.alive()]
            assert not dead, f"worker(s) on host(s) {dead} exited early; see {victim.log.parent}"
            if upstream.answered < CUT_AFTER:
                return None
            recorded = await fetch(
                conn,
                "SELECT count(*) AS n FROM agents.tool_invocation_attempts WHERE worker LIKE %s",
                victim.lease_pattern,
            )
            if recorded[0]["n"] < MIN_DONE_BEFORE_CUT:  # it has really been working
                return None
            inflight = await victim_inflight()
            return inflight if len(inflight) >= MIN_INFLIGHT_AT_CUT else None

        for host in scenario.hosts:
            await host.start(scenario.database_url, scenario.egress_allow)
        await until("the cut point", CUT_TIMEOUT, ready_to_cut)

        # --- cut the victim off ---------------------------------------------------------
        await scenario.cut(victim)
        cut_at = time.monotonic()
        cut_inflight = set(await victim_inflight())
        cut_db_time = (await fetch(conn, "SELECT now() AS t"))[0]["t"]
        numbers["answered_before_cut"] = upstream.answered
        numbers["seconds_to_cut"] = round(cut_at - started, 2)
        held: dict[str, str] = {}  # every invocation seen leased to the victim after the cut

        # --- the others recover its leases and finish everything ------------------------
        async def all_terminal() -> bool:
            for row in await fetch(
                conn,
                "SELECT id::text, lease_owner FROM agents.tool_invocations"
                " WHERE lease_owner LIKE %s AND status = 'running'",
                victim.lease_pattern,
            ):
                held[row["id"]] = row["lease_owner"]
            rows = await fetch(
                conn, "SELECT count(*) AS n FROM agents.tool_invocations WHERE status = 'running'"
            )
            return bool(rows[0]["n"] == 0)

        await until("every invocation to finish", FINISH_TIMEOUT, all_terminal)
        done_at = time.monotonic()
        dead = [h.index for h in scenario.hosts if not h.alive()]
        assert not dead, f"worker(s) on host(s) {dead} exited; see {victim.log.parent}"
        before = await fetch(conn, SNAPSHOT)
        rows = {str(r["id"]): r for r in before}
        unknown = {i for i, r in rows.items() if r["error_code"] == "outcome_unknown"}
        recovered = {i for i, r in rows.items() if r["attempt"] == 2}
        last_attempt = (
            await fetch(
                conn, "SELECT coalesce(max(id), 0) AS n FROM agents.tool_invocation_attempts"
            )
        )[0]["n"]

        # Only writes the victim held can have an unknown outcome: a live host never lost one.
        assert unknown <= set(held), (
            f"{len(unknown - set(held))} outcome_unknown invocations were not the cut host's:"
            f" a live host lost a lease (starved for longer than {LEASE_SECONDS}s?)"
        )

        # --- the victim comes back: its answers are fenced off --------------------------
        upstream.restored_at = time.monotonic()
        await scenario.restore(victim)

        def stale_reports() -> dict[str, dict[str, Any]]:
            return {
                r["invocation_id"]: r
                for r in victim.log_records()
                if r.get("action") == "dispatch" and r.get("invocation_id") in unknown
            }

        async def victim_reported() -> bool:
            return set(stale_reports()) == unknown

        async def unreported() -> str:
            missing = sorted(unknown - set(stale_reports()))
            history = await fetch(
                conn,
                "SELECT invocation_id::text AS id, attempt, worker, status_code, error_code"
                "  FROM agents.tool_invocation_attempts WHERE invocation_id = ANY(%s::uuid[])"
                " ORDER BY id",
                missing[:5],
            )
            lines = [r for r in victim.log_records() if r.get("invocation_id") in set(missing[:5])]
            tail = victim.log.read_text().splitlines()[-5:]
            return (
                f"{len(missing)} of {len(unknown)} unreported: {missing[:5]}\n"
                f"in flight at the cut: {sorted(set(missing) & cut_inflight)[:5]}\n"
                f"attempts: {history}\nvictim's lines on them: {lines}\nlog tail: {tail}"
            )

        await until(
            "the cut host to report its old writes", REPORT_TIMEOUT, victim_reported, unreported
        )
        reported_at = time.monotonic()
        reports = stale_reports()
        codes = await stop_all(scenario.hosts)
        after = await fetch(conn, SNAPSHOT)
        victim_ids = set(held.values())
        stale_attempts = await fetch(
            conn,
            "SELECT invocation_id::text AS id, attempt, error_code, status_code"
            "  FROM agents.tool_invocation_attempts WHERE id > %s AND worker = ANY(%s)",
            last_attempt, list(victim_ids),
        )  # fmt: skip
        attempts = await fetch(
            conn,
            "SELECT worker, count(*) AS n FROM agents.tool_invocation_attempts"
            " WHERE error_code IS NULL AND id <= %s GROUP BY worker",
            last_attempt,
        )
        recovery = await fetch(
            conn,
            "SELECT min(finished_at - %s) AS first, max(finished_at - %s) AS last"
            "  FROM agents.tool_invocations WHERE id = ANY(%s::uuid[])",
            cut_db_time, cut_db_time, list(recovered),
        )  # fmt: skip

    # --- what must hold -----------------------------------------------------------------
    assert codes == [0] * len(scenario.hosts), codes
    assert len(victim_ids) == 1, victim_ids
    assert len(rows) == INVOCATIONS
    outcomes = Counter((r["status"], r["error_code"]) for r in rows.values())
    assert set(outcomes) <= {("completed", None), ("failed", "outcome_unknown")}, outcomes
    # The victim's writes in flight at the cut end outcome_unknown; so do the others it had
    # marked as possibly sent. Only leases it held were recovered, each claimed once more.
    assert cut_inflight, "the victim had no write in flight when it was cut"
    assert cut_inflight <= unknown, cut_inflight - unknown
    assert unknown <= recovered <= set(held), (unknown - recovered, recovered - set(held))
    assert all(r["attempt"] == 1 for i, r in rows.items() if i not in recovered)
    # Sent at most once each, exactly once when completed: nothing was sent again.
    assert max(upstream.by_invocation.values()) == 1, upstream.by_invocation.most_common(3)
    assert all(
        upstream.by_invocation[i] == 1 for i, r in rows.items() if r["status"] == "completed"
    )
    # Back on the network, the victim tried to record its old answers and changed nothing.
    assert after == before, "the cut host changed a result after it came back"
    assert all(r["recorded"] is False for r in reports.values()), [
        r for r in reports.values() if r["recorded"] is not False
    ]
    # "recorded": false also follows a database it could not reach; most must have been fenced.
    unreached = {
        r.get("invocation_id")
        for r in victim.log_records()
        if r.get("action") == "record_failed" and r.get("invocation_id") in unknown
    }
    assert len(unreached) < len(unknown), "no stale result ever reached the database"
    # Every host did part of the work, each over its own address when it has one.
    per_worker = {a["worker"]: a["n"] for a in attempts}
    assert len(per_worker) == HOSTS, per_worker
    by_host = {
        h.index: sum(n for w, n in per_worker.items() if f":{h.pid}:" in w) for h in scenario.hosts
    }
    assert sum(by_host.values()) == outcomes[("completed", None)], (by_host, outcomes)
    if victim.address is not None:
        assert set(upstream.sources) == {h.address for h in scenario.hosts}, upstream.sources

    numbers |= {
        "outcomes": {f"{s}/{c or '-'}": n for (s, c), n in sorted(outcomes.items(), key=str)},
        "completed_by_host": by_host,
        "cut_inflight_at_upstream": len(cut_inflight),
        "leases_held_by_cut_host": len(held),
        "recovered_leases": len(recovered),
        "recovered_marked_sent": len(unknown),
        "recovered_unsent_then_completed": len(recovered - unknown),
        "recovered_first_s_after_cut": round(recovery[0]["first"].total_seconds(), 2),
        "recovered_last_s_after_cut": round(recovery[0]["last"].total_seconds(), 2),
        "seconds_cut_to_all_finished": round(done_at - cut_at, 2),
        "seconds_link_down": round(upstream.restored_at - cut_at, 2),
        "seconds_link_up_to_stale_reports": round(reported_at - upstream.restored_at, 2),
        "stale_results_fenced": len(reports) - len(unreached),
        "stale_results_unreached": len(unreached),
        "stale_attempt_rows_added": len(stale_attempts),
        "stale_attempt_rows_http_200": sum(a["status_code"] == 200 for a in stale_attempts),
        "late_arrivals_at_upstream": len(upstream.late),
        "max_sends_per_invocation": max(upstream.by_invocation.values()),
        "seconds_total": round(time.monotonic() - started, 2),
    }
    print("\nseveral hosts:", json.dumps(numbers))
    return numbers


def make_hosts(
    tmp_path: Path, prefixes: list[list[str]], addresses: list[str | None]
) -> list[Host]:
    tag = uuid.uuid4().hex[:8]
    return [
        Host(i, prefix, address, tmp_path / f"host{i}.log", f"toolrelay-scale-{tag}-h{i}")
        for i, (prefix, address) in enumerate(zip(prefixes, addresses, strict=True), start=1)
    ]


# --- hosts as network namespaces ------------------------------------------------------------


@pytest.fixture
async def network() -> AsyncIterator[Network]:
    net = Network(HOSTS)
    try:
        await net.create()
    except NamespacesUnavailable as exc:
        await net.destroy()
        pytest.skip(
            f"cannot make network namespaces here ({exc}); the separate-processes stand-in"
            " (test_processes_stand_in_for_hosts) covers the scenario instead"
        )
    except BaseException:
        await net.destroy()
        raise
    try:
        yield net
    finally:
        left = await net.destroy()
    assert not left, f"test network left behind: {left}"


@pytest.fixture
async def private_postgres(network: Network) -> AsyncIterator[PrivatePostgres]:
    server = PrivatePostgres(GATEWAY, SUBNET)
    try:
        await server.start()
        yield server
    finally:
        await server.stop()


async def test_hosts_in_network_namespaces(
    network: Network, private_postgres: PrivatePostgres, tmp_path: Path
) -> None:
    url = create_database(private_postgres.url(), prefix="toolrelay_scale")
    migrate(url)
    hosts = make_hosts(
        tmp_path,
        [network.exec_prefix(i) for i in range(1, HOSTS + 1)],
        [host_address(i) for i in range(1, HOSTS + 1)],
    )

    async def cut(host: Host) -> None:
        await network.cut(host.index)

    async def restore(host: Host) -> None:
        await network.restore(host.index)

    try:
        async with serve_upstream(GATEWAY) as (upstream, endpoint):
            await run_scenario(Scenario(url, GATEWAY, hosts, cut, restore), upstream, endpoint)
    finally:
        await stop_all(hosts)  # before the namespaces go: a live process keeps its namespace


# --- processes standing in for hosts --------------------------------------------------------


async def test_processes_stand_in_for_hosts(admin_url: str, tmp_path: Path) -> None:
    url = create_database(admin_url, prefix="toolrelay_scale")
    migrate(url)
    hosts = make_hosts(tmp_path, [[]] * HOSTS, [None] * HOSTS)

    async def cut(host: Host) -> None:
        assert host.proc is not None
        host.proc.send_signal(signal.SIGSTOP)

        async def stopped() -> bool:
            return bool(psutil.Process(host.pid).status() == psutil.STATUS_STOPPED)

        await until("the worker to stop", STOPPED_TIMEOUT, stopped)

    async def restore(host: Host) -> None:
        assert host.proc is not None
        host.proc.send_signal(signal.SIGCONT)

    try:
        async with serve_upstream("127.0.0.1") as (upstream, endpoint):
            await run_scenario(Scenario(url, "127.0.0.1", hosts, cut, restore), upstream, endpoint)
    finally:
        await stop_all(hosts)
        drop_database(admin_url, url)
