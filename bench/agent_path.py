"""The agent's path: from MCP ``tools/call`` (or API invoke + ``?wait``) to its answer.

``python -m bench.agent_path [--quick] [--src DIR] [--no-peer] [--profile] [--write]``,
loopback only, bounded (about a minute, five with the peer; ``--src``: serve another copy of
src/, e.g. an older commit's, for a baseline in the same run; ``--profile``: py-spy on the
serve process through each door's 16-session window, bench/agent_profile.py; ``--write``:
toolrelay's doors call the POST tool instead).

It starts a fresh database (on DATABASE_URL's server, else an embedded one), the echo
upstream (bench/upstream.py), and the app as ``toolrelay serve`` builds it, with its
in-process worker, in a child process (``python -m bench.agent_path serve``: the same
``create_app`` and h11 protocol, with the per-token rate limit raised, since 20/s per token
would cap 16 sessions at 320 calls/s). The tool is setup.py's read tool, as the issue's
workload (issue 14: a read-only GET): ungated, GET with an api_key credential. A POST is
sent at most once, so the worker marks it sent first: one durable trip more (``--write``;
bench/RESULTS.md, Agent path, session 13). Then for each door (the official MCP SDK client
over streamable HTTP; the API with aiohttp):

- c=1: ``CALLS`` calls one after another (after a warm-up) -> p50 / p99 in ms;
- ``SESSIONS`` sessions, each with its own agent and token, for ``SECONDS`` s -> calls/s,
  spread over ``CLIENT_PROCESSES`` client processes (so the client is not the bottleneck);
- CPU per call: the serve process's and its database's backends' (the server's processes
  whose title names this database: procs.DatabaseBackends; walwriter and other shared
  processes are not counted), read from /proc at the window's two edges (procs.CpuGroups:
  processes present at both), divided by the calls made in it; beside it the client
  processes' CPU per call and the machine's busy cores (all 2 busy: the window measured a
  saturated machine, whose cores the clients share).

Then the peer (issue 14, goal 2; ``--no-peer`` leaves it out): ContextForge's MCP door
(bench/contextforge.py) with the same tool, client and upstream, in rounds alternating with
toolrelay's (``PEER_ROUNDS``, medians reported); its CPU is its process tree's (SQLite is
in-process). Its 16 sessions get ``PEER_LEAD_S`` to open before their window (it takes ~10 s;
each phase records in ``late_s`` how late its last session was). When it cannot be
installed, a line says it was skipped and why.

Every answer is checked (the upstream's ``{"ok": true}``): an error or a wrong answer, from
either system, makes the run exit non-zero. Prints a table and writes
bench/out/agent-path.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench import agent_profile, contextforge
from bench.constants import OUT_DIR, READ_TOOL_KEY, TOOL_KEY
from bench.procs import (
    Child,
    CpuGroups,
    DatabaseBackends,
    ServerProcesses,
    busy_cores,
    cpu_between,
    cpu_of,
    cpu_sample,
    free_port,
    loadavg,
    python_module,
    wait_http,
)
from bench.setup import dbname, postmaster_of, provision, scratch_server
from bench.tables import print_table as print_rows
from bench.upstream import RESPONSE_BODY, UpstreamProcess
from bench.workers import toolrelay_env
from toolrelay.registry import Registry
from toolrelay.tokens import TokenStore

CALLS, WARMUP, SESSIONS, SECONDS, CLIENT_PROCESSES = 300, 30, 16, 20.0, 4
Sizes = tuple[int, int, int, float, int]  # calls, warm-up, sessions, seconds, processes
QUICK: Sizes = (50, 10, 16, 3.0, 4)
WAIT_S = 10  # ?wait and the MCP bound: far above any answer here
SERVE_START_TIMEOUT_S = 30.0
START_LEAD_S = 3.0  # seconds the client processes get to open their sessions
PEER_LEAD_S = 20.0  # ContextForge opens 16 sessions (and makes their first call) in ~9-11 s
GOALS = {"p50_ms": 5.0, "p99_ms": 20.0, "calls_per_s": 1000.0, "cpu_ms_per_call": 1.5}
OUT_PATH = OUT_DIR / "agent-path.json"
PEER_ROUNDS, QUICK_PEER_ROUNDS = 3, 1  # toolrelay, ContextForge, toolrelay, ... (medians)
PEER_GOALS = {"calls_per_s": 10.0, "p50_ms": 10.0}  # toolrelay >= 10x its calls/s, <= 1/10 p50
ANSWER = json.loads(RESPONSE_BODY)
Call = Callable[[int], Awaitable[None]]


# --- the server child ----------------------------------------------------------------------


def serve(port: int) -> None:
    """What `toolrelay serve` runs, with the rate limit raised (see the module docstring)."""
    import uvicorn

    from toolrelay import logs
    from toolrelay.api import ApiSettings, create_app
    from toolrelay.api.server import ConnectionLimits, protocol_class
    from toolrelay.credentials import Keyring
    from toolrelay.dispatch.egress import EgressPolicy
    from toolrelay.dispatch.worker import WorkerSettings

    logs.configure("INFO")  # serve's default: one access line per request
    settings = ApiSettings(
        database_url=os.environ["DATABASE_URL"],
        keyring=Keyring.parse(os.environ["TOOLRELAY_MASTER_KEY"]),
        egress=EgressPolicy.from_env(),
        worker=WorkerSettings(concurrency=64, lease_seconds=30.0),
        rate_per_second=1e6,
        rate_burst=1_000_000,
    )
    app = create_app(settings)
    try:  # as `toolrelay serve` does (a baseline copy of src/ from before it may lack it)
        from toolrelay.heap import settle
    except ImportError:
        pass
    else:
        settle()
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_config=None,
        http=protocol_class(ConnectionLimits()), server_header=False, log_level="warning",
    )  # fmt: skip


# --- the doors -----------------------------------------------------------------------------


def check_answer(content: list[Any]) -> None:
    """The upstream's answer as the call's text content (both systems answer so)."""
    text = getattr(content[0], "text", None) if content else None
    try:
        right = text is not None and json.loads(text) == ANSWER
    except ValueError:
        right = False
    if not right:
        raise RuntimeError(f"wrong answer: {content}")


async def with_session(
    door: str,
    base: str,
    token: str,
    body: Callable[[Call], Awaitable[Any]],
    tool: str = READ_TOOL_KEY,
) -> Any:
    """Open one agent session on ``door`` and give ``body`` its one-call function."""
    if door == "mcp":
        import httpx2
        from mcp.client.client import Client
        from mcp.client.streamable_http import streamable_http_client

        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60.0)
        async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http)) as mcp:

            async def mcp_call(n: int) -> None:
                result = await mcp.call_tool(tool, {"n": n})
                if result.is_error:
                    raise RuntimeError(f"tools/call failed: {result.content}")
                check_answer(result.content)

            return await body(mcp_call)
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(base, headers=headers) as api:

        async def api_call(n: int) -> None:
            body_, wait = {"tool": tool, "input": {"n": n}}, {"wait": str(WAIT_S)}
            # One request (POST ?wait); a server that ignores ?wait answers at once, and
            # the GET ?wait below waits instead (the baseline's path).
            async with api.post("/v1/agent/invocations", json=body_, params=wait) as resp:
                inv = await resp.json()
            if inv.get("status") != "completed":
                path = f"/v1/agent/invocations/{inv['id']}"
                async with api.get(path, params=wait) as resp:
                    inv = await resp.json()
            if inv.get("status") != "completed" or inv.get("output") != ANSWER:
                raise RuntimeError(f"invocation not completed with the answer: {inv}")

        return await body(api_call)


async def sequential(
    door: str, base: str, token: str, calls: int, warmup: int, tool: str = READ_TOOL_KEY
) -> list[float]:
    async def body(call: Call) -> list[float]:
        for n in range(warmup):
            await call(n)
        times = []
        for n in range(calls):
            started = time.perf_counter()
            await call(n)
            times.append((time.perf_counter() - started) * 1000)
        return times

    result: list[float] = await with_session(door, base, token, body, tool)
    return result


def sessions_in_process(
    door: str, base: str, tokens: list[str], start: float, seconds: float, tool: str = READ_TOOL_KEY
) -> tuple[int, float]:
    """One client process: its sessions call back to back in [start, start + seconds).
    Returns the calls made and when its last session was ready (opened and warm)."""

    async def one(token: str) -> tuple[int, float]:
        async def body(call: Call) -> tuple[int, float]:
            await call(0)  # opened and warm before the window
            ready = time.time()
            await asyncio.sleep(max(0.0, start - ready))
            done = 0
            while time.time() < start + seconds:
                await call(done)
                done += 1
            return done, ready

        counted: tuple[int, float] = await with_session(door, base, token, body, tool)
        return counted

    async def run() -> tuple[int, float]:
        counts = await asyncio.gather(*(one(t) for t in tokens))
        return sum(c[0] for c in counts), max(c[1] for c in counts)

    return asyncio.run(run())


# --- measuring -----------------------------------------------------------------------------


def backends(url: str) -> Callable[[], list[int]]:
    """The database's backends (procs.DatabaseBackends: walwriter and the other shared
    processes are not counted); none when the server's processes are not visible here."""
    postmaster = postmaster_of(url)
    if postmaster is None:
        return list
    return DatabaseBackends(ServerProcesses(postmaster), [dbname(url)])


def phase(
    door: str, base: str, tokens: list[str], cpu: CpuGroups, sizes: Sizes, tool: str = READ_TOOL_KEY,
    lead: float = START_LEAD_S, profile: tuple[int, Path] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``profile``: (pid, path): py-spy on that process through the 16-session window."""
    calls, warmup, sessions, seconds, processes = sizes
    before = cpu.sample()
    times = asyncio.run(sequential(door, base, tokens[0], calls, warmup, tool))
    used = cpu.used(before, cpu.sample())
    seq = {
        "p50_ms": statistics.median(times),
        "p99_ms": statistics.quantiles(times, n=100)[98],
        "max_ms": max(times),
        "cpu_ms_per_call": {k: s / (calls + warmup) * 1000 for k, s in used.items()},
    }
    start = time.time() + lead
    groups = [tokens[1:][i::processes] for i in range(processes)]
    with ProcessPoolExecutor(processes) as pool:
        futures = [
            pool.submit(sessions_in_process, door, base, g, start, seconds, tool) for g in groups
        ]
        time.sleep(max(0.0, start - time.time()))
        clients = list(pool._processes)  # the client processes: their CPU is counted apart
        before, machine, client_cpu = cpu.sample(), cpu_sample(), cpu_of(clients)
        spy = agent_profile.record(profile[0], seconds, profile[1]) if profile else None
        time.sleep(seconds)
        after, busy = cpu.sample(), busy_cores(machine, cpu_sample())
        client_s = cpu_between(client_cpu, cpu_of(clients))
        counts = [f.result() for f in futures]
        done = sum(c[0] for c in counts)
    used = cpu.used(before, after)
    wide = {
        "sessions": sessions,
        "calls": done,
        "calls_per_s": done / seconds,
        "late_s": max(0.0, max(c[1] for c in counts) - start),  # > 0: the window began early
        "cpu_ms_per_call": {k: s / max(done, 1) * 1000 for k, s in used.items()},
        "client_cpu_ms_per_call": client_s / max(done, 1) * 1000,
        "machine_busy_cores": busy,
    }
    if spy is not None and profile is not None:
        spy.wait(seconds + 30)
        if profile[1].exists():
            wide["profile_ms_per_call"] = agent_profile.summarize(profile[1], done)
    return {"c1": seq, "wide": wide}


def verdicts(result: dict[str, Any]) -> dict[str, bool]:
    c1, wide = result["c1"], result["wide"]
    cpu = sum(wide["cpu_ms_per_call"].values())
    return {
        "p50_ms": c1["p50_ms"] <= GOALS["p50_ms"],
        "p99_ms": c1["p99_ms"] <= GOALS["p99_ms"],
        "calls_per_s": wide["calls_per_s"] >= GOALS["calls_per_s"],
        "cpu_ms_per_call": cpu <= GOALS["cpu_ms_per_call"],
    }


def print_table(results: dict[str, Any]) -> None:
    rows = []
    for door, r in results["doors"].items():
        c1, wide = r["c1"], r["wide"]
        c1cpu, wcpu = c1["cpu_ms_per_call"], wide["cpu_ms_per_call"]
        missed = [k for k, ok in r["goals"].items() if not ok]
        rows.append([
            door, f"{c1['p50_ms']:.2f}", f"{c1['p99_ms']:.2f}",
            f"{c1cpu['serve']:.2f} + {c1cpu['postgres']:.2f}", f"{wide['calls_per_s']:.0f}",
            f"{wcpu['serve']:.2f} + {wcpu['postgres']:.2f}", ", ".join(missed) or "all met",
        ])  # fmt: skip
    head = ["door", "p50 ms", "p99 ms", "c=1 cpu ms/call (serve + pg)", "16 sessions calls/s",
            "cpu ms/call (serve + pg)", "goals missed"]  # fmt: skip
    print_rows(head, rows)
    print(f"load average before / after: {results['load_before']} / {results['load_after']}")
    machine = [
        [door, f"{r['wide']['client_cpu_ms_per_call']:.2f}", f"{r['wide']['machine_busy_cores']:.2f}"]
        for door, r in results["doors"].items()
    ]  # fmt: skip
    print_rows(["16 sessions", "client processes cpu ms/call", "machine cores busy"], machine)


def print_profiles(results: dict[str, Any]) -> None:
    """--profile: ms of the serve process's Python CPU per call, per step (agent_profile)."""
    doors = {d: r["wide"]["profile_ms_per_call"] for d, r in results["doors"].items()
             if "profile_ms_per_call" in r["wide"]}  # fmt: skip
    if doors:
        steps = list(next(iter(doors.values())))
        rows = [[step, *(f"{doors[d][step]:.3f}" for d in doors)] for step in steps]
        print_rows(["serve, Python CPU ms per call (py-spy --gil)", *doors], rows)


# --- the peer: ContextForge (issue 14, goal 2) ------------------------------------------------


def summary(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the rounds; CPU per call is everything measured (serve + PostgreSQL)."""
    rows = [
        {
            "p50_ms": r["c1"]["p50_ms"],
            "p99_ms": r["c1"]["p99_ms"],
            "calls_per_s": r["wide"]["calls_per_s"],
            "cpu_ms_per_call": sum(r["wide"]["cpu_ms_per_call"].values()),
        }
        for r in rounds
    ]
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def reason(exc: BaseException) -> str:
    """The innermost errors' messages (anyio wraps a failed call in exception groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(reason(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def peer_group(
    upstream_url: str, scratch: Path, base: str, tokens: list[str], cpu: CpuGroups,
    sizes: Sizes, rounds: int, tool: str = READ_TOOL_KEY,
) -> dict[str, Any]:  # fmt: skip
    """toolrelay's MCP door and ContextForge's in alternating rounds; medians and the goal."""
    out: dict[str, Any] = {"name": f"{contextforge.NAME} (MCP)", "load_before": loadavg()}
    runs: dict[str, list[dict[str, Any]]] = {"toolrelay": [], "contextforge": []}
    system = "contextforge"  # the one being started or measured
    try:
        with contextforge.running(upstream_url, free_port(), scratch, sizes[2] + 1) as peer:
            tree = CpuGroups(serve=ServerProcesses(peer.pid), postgres=list)  # SQLite: in-process
            for _ in range(rounds):
                system = "toolrelay"
                runs[system].append(phase("mcp", base, tokens, cpu, sizes, tool))
                system = "contextforge"
                runs[system].append(
                    phase("mcp", peer.base, peer.tokens, tree, sizes, peer.tool, PEER_LEAD_S)
                )
    except contextforge.Unavailable as exc:
        return out | {"skipped": str(exc)}
    except Exception as exc:  # a failed start, an error or a wrong answer: the run fails
        log = scratch / ("contextforge.log" if system == "contextforge" else "serve.log")
        tail = log.read_text("utf-8", "replace").splitlines()[-20:] if log.exists() else []
        return out | {"failed": f"{system}: {reason(exc)}", "log_tail": tail, "rounds": runs}
    tr, cf = summary(runs["toolrelay"]), summary(runs["contextforge"])
    ratios = {
        "calls_per_s": tr["calls_per_s"] / cf["calls_per_s"],
        "p50_ms": cf["p50_ms"] / tr["p50_ms"],
    }
    return out | {
        "rounds": runs, "toolrelay": tr, "contextforge": cf, "ratios": ratios,
        "goals": {k: ratios[k] >= PEER_GOALS[k] for k in PEER_GOALS}, "load_after": loadavg(),
        "versions": {"contextforge": contextforge.VERSION, "mcp client": version("mcp")},
    }  # fmt: skip


def print_peer(peer: dict[str, Any]) -> None:
    if "skipped" in peer:
        print(f"{peer['name']}: SKIPPED, {peer['skipped']}")
        return
    if "failed" in peer:
        print("\n".join(peer["log_tail"]))
        print(f"{peer['name']}: FAILED, {peer['failed']}")
        return
    rows = [
        [label, f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['calls_per_s']:.0f}",
         f"{r['cpu_ms_per_call']:.2f}"]
        for label, r in (("toolrelay", peer["toolrelay"]), (peer["name"], peer["contextforge"]))
    ]  # fmt: skip
    title = f"\nMCP, medians of {len(peer['rounds']['toolrelay'])} rounds"
    print_rows(["system", "p50 ms", "p99 ms", "16 sessions calls/s", "cpu ms/call"], rows, title)
    for key, runs in peer["rounds"].items():
        late = max(r["wide"]["late_s"] for r in runs)
        if late > 0:
            print(f"note: {key}'s last session was ready {late:.1f} s into a 16-session window")
    ratios, goals = peer["ratios"], peer["goals"]
    print(
        f"peer goal: calls/s x{ratios['calls_per_s']:.1f} (>= x10:"
        f" {'met' if goals['calls_per_s'] else 'MISSED'}), p50 1/{ratios['p50_ms']:.1f}"
        f" (<= 1/10: {'met' if goals['p50_ms'] else 'MISSED'});"
        f" load {peer['load_before']} / {peer['load_after']}"
    )


# --- the run -------------------------------------------------------------------------------


def agent_tokens(url: str, owner: Any, agent_id: Any, count: int) -> list[str]:
    """One token for the first agent (c=1), then one agent and token per session."""
    from toolrelay.db import Database

    db = Database(url)
    registry, tokens = Registry(db, owner), TokenStore(db)
    made = [tokens.create(owner, agent_id, name="c1")[1]]
    for i in range(count):
        agent = registry.create_agent(f"session-{i}")
        for key in (READ_TOOL_KEY, TOOL_KEY):
            registry.assign(f"session-{i}", key)
        made.append(tokens.create(owner, agent, name=f"session-{i}")[1])
    return made


def main(
    quick: bool, src: str | None = None, peer: bool = True, profile: bool = False,
    tool: str = READ_TOOL_KEY,
) -> dict[str, Any]:  # fmt: skip
    sizes: Sizes = QUICK if quick else (CALLS, WARMUP, SESSIONS, SECONDS, CLIENT_PROCESSES)
    with scratch_server("toolrelay-agent-path-") as pg:
        scratch, url = pg.scratch, pg.database("agentpath")
        upstream = UpstreamProcess(dict(os.environ), scratch / "upstream.log")
        server: Child | None = None
        try:
            fx = provision(url, upstream.url)
            tokens = agent_tokens(url, fx.owner, fx.agent_id, sizes[2])
            port = free_port()
            env = toolrelay_env(fx, scratch, Path(src) if src else None)  # --src: serve from it
            argv = python_module("bench.agent_path", "serve", str(port))
            server = Child("serve", argv, env, scratch / "serve.log")
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/healthz", server, SERVE_START_TIMEOUT_S)
            serve_pid = server.pid
            cpu = CpuGroups(serve=lambda: [serve_pid], postgres=backends(url))
            results: dict[str, Any] = {
                "load_before": loadavg(), "postgres": pg.source, "sizes": sizes,
                "src": src or "src/", "tool": tool,
            }  # fmt: skip
            OUT_DIR.mkdir(exist_ok=True)
            doors = {
                door: phase(door, base, tokens, cpu, sizes, tool, profile=(
                    (serve_pid, OUT_DIR / f"agent-path-{door}.pyspy.txt") if profile else None))
                for door in ("mcp", "api")
            }  # fmt: skip
            results["doors"] = doors
            for r in doors.values():
                r["goals"] = verdicts(r)
            if peer:
                rounds = QUICK_PEER_ROUNDS if quick else PEER_ROUNDS
                results["peer"] = peer_group(
                    upstream.url, scratch, base, tokens, cpu, sizes, rounds, tool
                )
            results["load_after"] = loadavg()
            results["goals"] = GOALS
            return results
        finally:
            if server is not None:
                server.stop()
            upstream.child.kill()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]))
    else:
        args = sys.argv[1:]
        source = args[args.index("--src") + 1] if "--src" in args else None
        tool = TOOL_KEY if "--write" in args else READ_TOOL_KEY
        out = main("--quick" in args, source, "--no-peer" not in args, "--profile" in args, tool)
        print_table(out)
        print_profiles(out)
        if "peer" in out:
            print_peer(out["peer"])
        path = OUT_PATH if source is None else OUT_PATH.with_name("agent-path-baseline.json")
        OUT_DIR.mkdir(exist_ok=True)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {path}")
        sys.exit(1 if "failed" in out.get("peer", {}) else 0)
