"""Two copies of serve side by side: the agent's path of a change against its baseline.

``python -m bench.agent_ab --baseline-src DIR [--src DIR] [--quick]``: the same database,
upstream, tool and tokens as bench/agent_path.py, served by two ``serve`` children at once,
one from ``--src`` (default: this checkout's src/), one from ``--baseline-src`` (e.g.
``git archive REV src | tar -x -C DIR``). On this shared 2-core machine the same code's
throughput moved by 2x within ten minutes (bench/RESULTS.md, session 10): runs made one
after the other compare the machine's moods more than the code. Here each door gets:

- c=1: one session to each server, calls alternating between them (A, B, A, B, ...), so
  both see the same moments; p50 / p99 of each, and each serve process's CPU per call;
- 16 sessions: windows alternating between the servers (``ROUNDS`` each, A first), the
  medians of calls/s and of serve CPU per call.

PostgreSQL's CPU is not split between the two (their backends share one database); use
bench/instructions.py for that. Prints a table and writes bench/out/agent-ab.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.agent_path import (
    CALLS,
    CLIENT_PROCESSES,
    QUICK,
    SECONDS,
    SERVE_START_TIMEOUT_S,
    SESSIONS,
    WARMUP,
    Call,
    Sizes,
    agent_tokens,
    phase,
    with_session,
)
from bench.constants import OUT_DIR
from bench.procs import Child, CpuGroups, free_port, loadavg, python_module, wait_http
from bench.setup import provision, scratch_server
from bench.tables import print_table
from bench.upstream import UpstreamProcess
from bench.workers import toolrelay_env

ROUNDS, QUICK_ROUNDS = 3, 2  # 16-session windows per server, alternating
OUT_PATH = OUT_DIR / "agent-ab.json"
Servers = dict[str, tuple[str, int]]  # label -> (base url, serve pid)


async def alternating(
    door: str, servers: Servers, token: str, calls: int, warmup: int
) -> dict[str, list[float]]:
    """c=1 on each server in turn, one call each, ``calls`` times (after ``warmup``)."""
    (a, (base_a, _)), (b, (base_b, _)) = servers.items()
    times: dict[str, list[float]] = {a: [], b: []}

    async def both(call_a: Call) -> None:
        async def body(call_b: Call) -> None:
            for n in range(warmup):
                await call_a(n)
                await call_b(n)
            for n in range(calls):
                for label, call in ((a, call_a), (b, call_b)):
                    started = time.perf_counter()
                    await call(n)
                    times[label].append((time.perf_counter() - started) * 1000)

        await with_session(door, base_b, token, body)

    await with_session(door, base_a, token, both)
    return times


def door_pair(door: str, servers: Servers, tokens: list[str], sizes: Sizes, rounds: int) -> Any:
    calls, warmup = sizes[0], sizes[1]
    cpu = CpuGroups(**{label: partial(list, [pid]) for label, (_, pid) in servers.items()})
    before = cpu.sample()
    times = asyncio.run(alternating(door, servers, tokens[0], calls, warmup))
    used = cpu.used(before, cpu.sample())
    out: dict[str, Any] = {}
    for label, ts in times.items():
        out[label] = {
            "p50_ms": statistics.median(ts),
            "p99_ms": statistics.quantiles(ts, n=100)[98],
            "serve_cpu_ms_per_call": used[label] / (calls + warmup) * 1000,
            "wide": [],
        }
    for _ in range(rounds):
        for label, (base, pid) in servers.items():
            own = CpuGroups(serve=partial(list, [pid]), postgres=list)
            out[label]["wide"].append(phase(door, base, tokens, own, sizes)["wide"])
    for r in out.values():
        r["calls_per_s"] = statistics.median(w["calls_per_s"] for w in r["wide"])
        r["wide_serve_cpu_ms_per_call"] = statistics.median(
            w["cpu_ms_per_call"]["serve"] for w in r["wide"]
        )
    return out


def main(src: str | None, baseline: str, quick: bool) -> dict[str, Any]:
    sizes: Sizes = QUICK if quick else (CALLS, WARMUP, SESSIONS, SECONDS, CLIENT_PROCESSES)
    rounds = QUICK_ROUNDS if quick else ROUNDS
    with scratch_server("toolrelay-agent-ab-") as pg:
        scratch, url = pg.scratch, pg.database("agentab")
        upstream = UpstreamProcess(dict(os.environ), scratch / "upstream.log")
        children: list[Child] = []
        try:
            fx = provision(url, upstream.url)
            tokens = agent_tokens(url, fx.owner, fx.agent_id, sizes[2])
            servers: Servers = {}
            for label, source in (("new", src), ("baseline", baseline)):
                port, home = free_port(), scratch / label
                home.mkdir()
                env = toolrelay_env(fx, home, Path(source) if source else None)
                argv = python_module("bench.agent_path", "serve", str(port))
                child = Child(f"serve-{label}", argv, env, scratch / f"serve-{label}.log")
                children.append(child)
                wait_http(f"http://127.0.0.1:{port}/healthz", child, SERVE_START_TIMEOUT_S)
                servers[label] = (f"http://127.0.0.1:{port}", child.pid)
            results: dict[str, Any] = {
                "load_before": loadavg(), "src": src or "src/", "baseline": baseline,
                "sizes": sizes, "rounds": rounds, "postgres": pg.source,
            }  # fmt: skip
            results["doors"] = {
                door: door_pair(door, servers, tokens, sizes, rounds) for door in ("mcp", "api")
            }
            results["load_after"] = loadavg()
            return results
        finally:
            for child in children:
                child.stop()
            upstream.child.kill()


def print_results(results: dict[str, Any]) -> None:
    rows = []
    for door, pair in results["doors"].items():
        new, old = pair["new"], pair["baseline"]
        for key, fmt in (
            ("p50_ms", "{:.2f}"),
            ("p99_ms", "{:.2f}"),
            ("serve_cpu_ms_per_call", "{:.2f}"),
            ("calls_per_s", "{:.0f}"),
            ("wide_serve_cpu_ms_per_call", "{:.2f}"),
        ):
            rows.append(
                [
                    door,
                    key,
                    fmt.format(new[key]),
                    fmt.format(old[key]),
                    f"{new[key] / old[key]:.2f}",
                ]
            )
    print_table(["door", "measure", "new", "baseline", "new / baseline"], rows)
    print(f"load average before / after: {results['load_before']} / {results['load_after']}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--baseline-src" not in args:
        sys.exit("usage: python -m bench.agent_ab --baseline-src DIR [--src DIR] [--quick]")
    source = args[args.index("--src") + 1] if "--src" in args else None
    out = main(source, args[args.index("--baseline-src") + 1], "--quick" in args)
    OUT_DIR.mkdir(exist_ok=True)
    OUT_PATH.write_text(json.dumps(out, indent=2, default=str))
    print_results(out)
    print(f"wrote {OUT_PATH}")
