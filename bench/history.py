"""``python -m bench.history [--quick]``: the hot path against a large history (issue #9).

1. **10k vs 1M.** Two scratch databases, each with the benchmark's owner, agent and tool,
   filled in SQL with 10,000 and with 1,000,000 finished invocations (one attempt row each),
   vacuumed, analyzed and checkpointed. Then, interleaved (A B, B A, A B, ...): the claim alone
   under EXPLAIN (ANALYZE, BUFFERS) with a small runnable set, and the benchmark's throughput
   drain (one worker, --concurrency 64, 20,000 fresh invocations of the ungated api_key POST
   tool) with the history in place; WAL, HOT updates and connections are read around it.
2. **Dead tuples.** A steady RATE/s flows through one worker while another session holds a
   REPEATABLE READ transaction open; sampled every few seconds (bench/history_dead.py).
3. **Capacity inputs.** WAL and database CPU per step of an invocation's life, commit latency,
   and the ceiling the NOTIFY trigger puts on single-statement invocations
   (bench/history_capacity.py).

Writes bench/out/history-<timestamp>.json and, for a full run without --skip,
bench/HISTORY.md. Exits 1 when an invocation was sent twice or not completed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.console import Console

from bench import history_capacity, history_dead, history_report
from bench.constants import FULL, NOISE_SAMPLE_S, OUT_DIR
from bench.context import Context
from bench.history_drain import HistoryDrain, drain_with_history
from bench.history_probe import delete_fresh, fill, server_settings, sizes, snapshot_queries
from bench.procs import ServerProcesses, Timeline, loadavg, noise_sample
from bench.session import (
    git_state,
    machine,
    postmaster_of,
    snapshot_source,
    source_digest,
    tear_down,
)
from bench.setup import (
    Fixture,
    create_database,
    provision,
    server_admin_url,
)
from bench.upstream import UpstreamProcess
from toolrelay.dispatch.store import POOL_MAX

HISTORY_MD = Path(__file__).resolve().parent / "HISTORY.md"
TIMELINE_INTERVAL_S = 0.1
console = Console() if Console().is_terminal else Console(width=150)
SECTIONS = ("drains", "dead", "capacity")


@dataclass(frozen=True)
class HistorySizes:
    small: int  # finished invocations in database A
    large: int  # ... in database B
    drain_n: int  # fresh invocations per drain
    rounds: int  # drains per database, interleaved
    probe_runnable: int  # runnable invocations while the claim is explained
    probe_repeats: int
    dead: history_dead.DeadPlan
    lifecycle_single: int  # lifecycles with batches of 1
    lifecycle_batches: int  # batches of 64
    commit_probes: int
    ceiling_seconds: float  # per NOTIFY-ceiling variant
    ceiling_connections: tuple[int, ...]
    ceiling_modes: tuple[str, ...]  # NOTIFY trigger: on / off / conditional (experiment)
    fillfactors: tuple[int, ...]  # of agents.tool_invocations, for the batch-64 lifecycle


FULL_SIZES = HistorySizes(
    small=10_000,
    large=1_000_000,
    drain_n=FULL.throughput_n,
    rounds=5,
    probe_runnable=100,
    probe_repeats=20,
    dead=history_dead.DeadPlan(
        rate=500, baseline_s=20, held_s=60, released_s=30, sample_s=5, vacuum_every_s=10
    ),
    lifecycle_single=500,
    lifecycle_batches=40,
    commit_probes=500,
    ceiling_seconds=6.0,
    ceiling_connections=(8, 32),
    ceiling_modes=("on", "off", "conditional"),
    fillfactors=(100, 70, 50),
)
QUICK_SIZES = HistorySizes(
    small=1_000,
    large=50_000,
    drain_n=2_000,
    rounds=2,
    probe_runnable=100,
    probe_repeats=5,
    dead=history_dead.DeadPlan(
        rate=200, baseline_s=6, held_s=10, released_s=8, sample_s=2, vacuum_every_s=4
    ),
    lifecycle_single=50,
    lifecycle_batches=4,
    commit_probes=100,
    ceiling_seconds=1.5,
    ceiling_connections=(8,),
    ceiling_modes=("on", "off", "conditional"),
    fillfactors=(100, 70, 50),
)


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


@dataclass
class HistorySession:
    ctx: Context
    small: Fixture
    large: Fixture
    admin_url: str
    queries: dict[str, str]
    machine: dict[str, Any]


@contextmanager
def open_history_session(quick: bool, keep_logs: bool) -> Iterator[HistorySession]:
    """Two scratch databases (A: small history, B: large), the upstream, the CPU timeline;
    workers run from a snapshot of src/. Everything is torn down afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="toolrelay-history-"))
    scratch.chmod(0o755)
    logs, home = scratch / "logs", scratch / "home"
    logs.mkdir()
    home.mkdir()
    code = {"git": git_state(), "worker_src": "snapshot"}
    source = snapshot_source(scratch / "src")
    code["src_sha1"] = source_digest(source / "toolrelay")
    admin_url, pg_source, stop_server = server_admin_url(scratch)
    url_a = create_database(admin_url, "hista")
    url_b = create_database(admin_url, "histb")
    upstream: UpstreamProcess | None = None
    timeline = Timeline({}, TIMELINE_INTERVAL_S)
    ctx: Context | None = None
    ok = False
    try:
        upstream = UpstreamProcess(dict(os.environ), logs / "upstream.log")
        fx_a = provision(url_a, upstream.url)
        fx_b = provision(url_b, upstream.url)
        ctx = Context(FULL, quick, fx_a, "", upstream, logs, home, timeline)
        ctx.worker_source = source
        upstream_pid = upstream.child.pid
        timeline.add("sut", ctx.sut_pids)
        timeline.hooks.append(ctx.sample_memory)
        timeline.add("upstream", lambda: [upstream_pid])
        timeline.add("harness", lambda: [os.getpid()])
        postmaster = postmaster_of(url_a)
        if postmaster is not None:
            timeline.add("postgres", ServerProcesses(postmaster))
        timeline.start()
        described = machine(url_a, pg_source) | {
            "code": code,
            "settings": server_settings(url_a),
        }
        yield HistorySession(ctx, fx_a, fx_b, admin_url, snapshot_queries(source), described)
        ok = True
    finally:
        tear_down(
            ctx, timeline, upstream, ok, [url_a, url_b], admin_url, stop_server, console.print
        )
        if ok and not keep_logs:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            console.print(f"logs kept in {logs}")


# --- the three parts -------------------------------------------------------------------------


def run_drains(hs: HistorySession, sz: HistorySizes, results: dict[str, Any]) -> None:
    cases = [(hs.small, sz.small), (hs.large, sz.large)]
    results["fill"] = {}
    for fx, n in cases:
        seconds = fill(fx, n, uuid.uuid4())
        results["fill"][_label(n)] = {"n": n, "seconds": round(seconds, 1), "sizes": sizes(fx.url)}
        console.print(f"  filled {n:,} finished invocations in {seconds:.1f} s")
    # Each round runs the three cases back to back, in a rotating order: A (small history),
    # B (large history), and B with time-ordered ids (the experiment, label "... v7").
    runs = [(hs.small, sz.small, False), (hs.large, sz.large, False), (hs.large, sz.large, True)]
    drains: list[HistoryDrain] = []
    for r in range(sz.rounds):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]
        if r % 2:
            order = order[::-1]
        for fx, n, v7 in order:
            label = _label(n) + (" v7" if v7 else "")
            d = drain_with_history(
                hs.ctx, fx, hs.admin_url, label, n, r + 1, sz.drain_n,
                hs.queries["claim"], sz.probe_runnable, sz.probe_repeats, v7,
            )  # fmt: skip
            drains.append(d)
            console.print(
                f"  round {r + 1} {d.label:>3}: {d.per_s:,.0f}/s, claim"
                f" {d.probe['execution_ms']['median']:.3f} ms /"
                f" {d.probe['shared_hit']['median']:.0f} buffers,"
                f" WAL {d.wal_bytes_per_call:,.0f} B/call, HOT {d.hot_updates}/{d.updates},"
                f" blocks read {d.blocks_read_per_call:.2f}/call,"
                f" connections {d.connections['backends']} ({d.connections['listening']} LISTEN),"
                f" other load {d.cores.get('other', 0):.2f} cores"
            )
    results["drains"] = [d.as_dict() for d in drains]
    results["verdict"] = verdict(drains, _label(sz.small), _label(sz.large))
    results["verdict_v7"] = verdict(drains, _label(sz.large), _label(sz.large) + " v7")


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else float("nan")


def _spread_pct(values: list[float]) -> float:
    """(max - min) / median, in %: the noise between repeats of the same measurement."""
    if len(values) < 2:
        return 0.0
    return round(100.0 * (max(values) - min(values)) / statistics.median(values), 1)


def verdict(drains: list[HistoryDrain], small: str, large: str) -> dict[str, Any]:
    def of(label: str, get: Callable[[HistoryDrain], float]) -> list[float]:
        return [get(d) for d in drains if d.label == label]

    metrics: dict[str, Callable[[HistoryDrain], float]] = {
        "drain_per_s": lambda d: d.per_s,
        "claim_ms": lambda d: d.probe["execution_ms"]["median"],
        "claim_buffers": lambda d: d.probe["shared_hit"]["median"],
        "claim_index_buffers": lambda d: d.probe["index_hit"]["median"],
        "picked_ms": lambda d: d.probe_picked["execution_ms"]["median"],
        "picked_buffers": lambda d: d.probe_picked["shared_hit"]["median"],
        "enqueue_per_s": lambda d: d.enqueue_per_s,
        "worker_us_per_call": lambda d: d.cpu_us_per_call.get("sut", 0.0),
        "pg_us_per_call": lambda d: d.cpu_us_per_call.get("postgres", 0.0),
        "wal_bytes_per_call": lambda d: d.wal_bytes_per_call,
        "wal_enqueue_bytes_per_call": lambda d: d.wal_enqueue_bytes_per_call,
        "fpi_per_call": lambda d: d.fpi_per_call,
        "blocks_hit_per_call": lambda d: d.blocks_hit_per_call,
        "blocks_read_per_call": lambda d: d.blocks_read_per_call,
        "hot_pct": lambda d: 100.0 * d.hot_updates / d.updates if d.updates else 0.0,
        "other_cores": lambda d: d.cores.get("other", 0.0),
    }
    table: dict[str, Any] = {}
    for name, get in metrics.items():
        a, b = of(small, get), of(large, get)
        table[name] = {
            small: {"median": _median(a), "min": min(a, default=0), "max": max(a, default=0),
                    "spread_pct": _spread_pct(a)},
            large: {"median": _median(b), "min": min(b, default=0), "max": max(b, default=0),
                    "spread_pct": _spread_pct(b)},
            "ratio": round(_median(b) / _median(a), 3) if a and b and _median(a) else None,
        }  # fmt: skip
        pairs = []
        for r in sorted({d.round for d in drains}):
            pa = [get(d) for d in drains if d.round == r and d.label == small]
            pb = [get(d) for d in drains if d.round == r and d.label == large]
            if pa and pb and pa[0]:
                pairs.append(pb[0] / pa[0])
        table[name]["paired_ci95"] = list(_interval(pairs))  # mean, low, high
    # Per round, the two drains ran back to back: their ratio cancels slow drifts of the load.
    rounds = sorted({d.round for d in drains})
    paired = []
    for r in rounds:
        pa = [d.per_s for d in drains if d.round == r and d.label == small]
        pb = [d.per_s for d in drains if d.round == r and d.label == large]
        if pa and pb and pa[0]:
            paired.append(round(pb[0] / pa[0], 3))
    drain = table["drain_per_s"]
    noise = max(drain[small]["spread_pct"], drain[large]["spread_pct"])
    ratio = drain["ratio"] or 0.0
    mean, low, high = _interval(paired)
    return {
        "small": small,
        "large": large,
        "metrics": table,
        "paired_ratios": paired,
        "paired_mean": mean,
        "paired_ci95": [low, high],
        "drain_ratio": ratio,
        "within_10pct": abs(ratio - 1.0) <= 0.10,
        "noise_pct": noise,
        # The 95 % interval of the paired ratio fits inside 0.9-1.1: the data can tell.
        "resolvable": bool(paired) and low >= 0.9 and high <= 1.1,
    }


T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def _interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and Student-t 95 % interval (normal beyond 10 values)."""
    if len(values) < 2:
        only = values[0] if values else float("nan")
        return only, only, only
    mean = statistics.fmean(values)
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5
    return round(mean, 3), round(mean - half, 3), round(mean + half, 3)


def run_dead(hs: HistorySession, sz: HistorySizes, results: dict[str, Any]) -> None:
    delete_fresh(hs.small, time.time() - 3600.0)
    dead = history_dead.run(hs.ctx, hs.small, hs.admin_url, hs.queries["claim"], sz.dead)
    results["dead"] = dead.as_dict()
    for phase, s in dead.summary.items():
        console.print(
            f"  {phase:>8}: claim {s['claim_ms_median']:.3f} ms (max {s['claim_ms_max']:.3f}),"
            f" {s['finished_per_s_median']:.0f}/s finished, p99 ≤ {s['p99_ms_max']:.0f} ms,"
            f" n_dead_tup {s['dead_tup_end']:,}, runnable idx {s['runnable_idx_kb_end']:,.0f} KB,"
            f" vacuum removed {s['removed_by_vacuum']:,} (not removable ≤"
            f" {s['not_removable_max']:,})"
        )


def run_capacity(hs: HistorySession, sz: HistorySizes, results: dict[str, Any]) -> None:
    fx = hs.small
    cap: dict[str, Any] = {"pool_max": POOL_MAX}
    steps: list[history_capacity.StepCost] = []
    hot: list[dict[str, float]] = []
    # (batch, fillfactor): the shipped fillfactor at both batch sizes, then others at 64.
    for batch, ff in [(1, 70), (64, 70), *((64, f) for f in sz.fillfactors if f != 70)]:
        delete_fresh(fx, time.time() - 3600.0)
        count = sz.lifecycle_single if batch == 1 else sz.lifecycle_batches
        got, share = history_capacity.lifecycle(fx, hs.queries, batch, count, ff)
        steps += got
        hot.append(share)
        for s in got:
            console.print(
                f"  {s.step:>9} batch {s.batch:>2} fillfactor {ff}: WAL"
                f" {s.wal_bytes_per_call:,.0f} B/call, CPU {s.cpu_us_per_call:,.0f} µs/call,"
                f" {s.wall_ms_median:.2f} ms"
            )
        console.print(f"  HOT {share['hot']:.0f} of {share['updates']:.0f} updates")
    cap["lifecycle"] = [s.as_dict() for s in steps if s.fillfactor == 70]
    cap["fillfactor"] = hot
    cap["fillfactor_steps"] = [s.as_dict() for s in steps]
    cap["commit_ms"] = history_capacity.commit_latency(fx.url, sz.commit_probes)
    console.print(f"  commit latency p50 {cap['commit_ms']['p50']:.3f} ms")
    ceilings = []
    for conns in sz.ceiling_connections:
        for trigger in sz.ceiling_modes:
            delete_fresh(fx, time.time() - 3600.0)
            c = history_capacity.invoke_ceiling(hs.ctx, fx, conns, sz.ceiling_seconds, trigger)
            ceilings.append(c.as_dict())
            console.print(
                f"  fn_invoke_tool x{conns} trigger {trigger}:"
                f" {c.per_s:,.0f}/s, p50 {c.latency_ms['p50']:.2f} ms, pg {c.pg_us_per_call:.0f}"
                f" µs/call, WAL {c.wal_bytes_per_call:.0f} B/call, waits {c.waits_pct}"
            )
    cap["ceilings"] = ceilings
    delete_fresh(fx, time.time() - 3600.0)
    results["capacity"] = cap


# --- entry -----------------------------------------------------------------------------------


def failures_of(results: dict[str, Any]) -> list[str]:
    found = []
    for d in results.get("drains", []):
        if d["duplicates"] or d["completed"] != d["n"]:
            found.append(
                f"drain {d['label']} round {d['round']}: {d['duplicates']} duplicates,"
                f" {d['n'] - d['completed']} not completed"
            )
    dead = results.get("dead")
    if dead and dead["not_completed"]:
        found.append(f"dead-tuple run: {dead['not_completed']} not completed")
    return found


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.history", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (~2 min)")
    parser.add_argument("--skip", action="append", default=[], choices=SECTIONS)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--from-json", type=Path, help="measure nothing: rewrite bench/HISTORY.md from a file"
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    args = parse_args(argv)
    if args.from_json:
        saved: dict[str, Any] = json.loads(args.from_json.read_text("utf-8"))
        if saved.get("drains"):  # verdicts as this version computes them
            drains = [HistoryDrain(**d) for d in saved["drains"]]
            small, large = saved["verdict"]["small"], saved["verdict"]["large"]
            saved["verdict"] = verdict(drains, small, large)
            saved["verdict_v7"] = verdict(drains, large, large + " v7")
        history_report.write_markdown(saved, HISTORY_MD, args.from_json.name)
        console.print(f"wrote {HISTORY_MD}")
        return 1 if failures_of(saved) else 0
    sz = QUICK_SIZES if args.quick else FULL_SIZES
    started = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    noise_s = 0.5 if args.quick else NOISE_SAMPLE_S
    noise = {"idle_cores_before": round(noise_sample(noise_s), 3), "loadavg_before": loadavg()}
    results: dict[str, Any] = {}
    with open_history_session(args.quick, args.keep_logs) as hs:
        code = hs.machine.pop("code")
        results["meta"] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "quick" if args.quick else "full",
            "machine": hs.machine,
            "sizes": asdict(sz),
            "git": f"{code['git']}, workers ran src sha1 {code['src_sha1']}",
            "versions": {"toolrelay": version("toolrelay"), "psycopg": version("psycopg"),
                         "aiohttp": version("aiohttp")},
        }  # fmt: skip
        parts: list[tuple[str, str, Callable[[HistorySession, HistorySizes, dict[str, Any]], None]]]
        parts = [
            ("drains", f"{_label(sz.small)} vs {_label(sz.large)} finished invocations",
             run_drains),
            ("dead", f"dead tuples under a held transaction, {sz.dead.rate}/s", run_dead),
            ("capacity", "WAL and CPU per step, commit latency, NOTIFY ceiling", run_capacity),
        ]  # fmt: skip
        if "drains" in args.skip:  # the other parts still run next to the small history
            fill(hs.small, sz.small, uuid.uuid4())
        for name, what, body in parts:
            if name in args.skip:
                continue
            console.print(f"[bold]{name}[/bold]: {what}")
            began = time.monotonic()
            body(hs, sz, results)
            console.print(f"  done in {time.monotonic() - began:.1f} s")
    noise |= {"idle_cores_after": round(noise_sample(noise_s), 3), "loadavg_after": loadavg()}
    results["meta"]["noise"] = noise
    results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
    results["failures"] = failures_of(results)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    json_path = OUT_DIR / f"history-{stamp}.json"
    json_path.write_text(json.dumps(results, indent=1, default=str), "utf-8")
    if not args.quick and not args.skip:
        history_report.write_markdown(results, HISTORY_MD, json_path.name)
        console.print(f"wrote {HISTORY_MD}")
    else:
        out_md = OUT_DIR / f"history-{results['meta']['mode']}-{stamp}.md"
        history_report.write_markdown(results, out_md, json_path.name)
        console.print(f"wrote {out_md}")
    console.print(f"results: {json_path}")
    for failure in results["failures"]:
        console.print(f"[red]FAIL[/red] {failure}")
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
