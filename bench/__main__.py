"""``python -m bench [--quick]``: the dispatcher benchmark of issue #7.

Starts an upstream (aiohttp, its own process), creates fresh databases on DATABASE_URL's
server (or an embedded PostgreSQL), runs the phases, prints tables, writes
bench/out/results-<timestamp>.json and, for a full run, bench/RESULTS.md and
docs/img/bench.png. Exits 1 when any invocation was sent twice or was left unfinished.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench import invoke, latency, plot, profile, report, throughput, wake
from bench.constants import (
    FULL,
    NOISE_SAMPLE_S,
    OUT_DIR,
    PLOT_PATH,
    QUICK,
    RESULTS_MD,
    SCALING_WORKERS,
)
from bench.procs import loadavg, noise_sample
from bench.session import Context, open_session
from bench.targets import evaluate

PHASES = ("throughput", "latency", "scaling", "memory", "invoke", "profile")
QUICK_NOISE_SAMPLE_S = 0.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (~30 s), for CI")
    parser.add_argument("--skip", action="append", default=[], choices=PHASES, help="skip a phase")
    parser.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="measure nothing: print the tables of a results file and, for a full run,"
        " rewrite bench/RESULTS.md and docs/img/bench.png from it",
    )
    parser.add_argument(
        "--worker-src",
        type=Path,
        help="run the toolrelay workers from this copy of src/ (put first on PYTHONPATH), to"
        " measure a patch without touching the work tree; results go to bench/out only",
    )
    return parser.parse_args(argv)


def failures_of(results: dict[str, Any]) -> list[str]:
    """Duplicates and unfinished invocations: what makes the run fail (targets never do)."""
    found: list[str] = []
    drains: list[dict[str, Any]] = []
    if results.get("throughput"):
        tp = results["throughput"]
        drains += [tp[k] for k in ("toolrelay", "floor", "raw", "peer") if k in tp]
    drains += results.get("scaling") or []
    if results.get("memory"):
        drains.append(results["memory"])
    for d in drains:
        label = f"{d['system']} ({d['workers']} worker(s), n={d['n']})"
        if d["duplicates"]:
            found.append(f"{label}: {d['duplicates']} duplicate request(s) at the upstream")
        if d["non_terminal"] or d["not_completed"]:
            found.append(
                f"{label}: {d['non_terminal']} not terminal, {d['not_completed']} not completed"
                f" {d['extra'].get('by_status', '')}"
            )
    for r in results.get("latency", []):
        if r["duplicates"] or r["missing"] or r["non_terminal"] or r["not_completed"]:
            found.append(
                f"latency @{r['rate']}/s: {r['duplicates']} duplicates, {r['missing']} never"
                f" arrived, {r['non_terminal']} not terminal, {r['not_completed']} not completed"
                f" {r['by_status']}"
            )
    for r in results.get("invoke", []) + results.get("invoke_worker", []):
        if r["errors"]:
            found.append(f"invoke {r['variant']}: {r['errors']} errors")
    return found


def run_phases(ctx: Context, skip: set[str], stamp: str, results: dict[str, Any]) -> None:
    sizes = ctx.sizes
    throughput.watch_databases(ctx)

    def phase(name: str, what: str, body: Callable[[], None]) -> None:
        if name in skip:
            return
        print(f"{name}: {what}", flush=True)
        began = time.monotonic()
        body()
        print(f"  done in {time.monotonic() - began:.1f} s", flush=True)

    def do_throughput() -> None:
        n = sizes.throughput_n
        ours = throughput.drain_toolrelay(ctx, n, 1, "throughput")
        least = throughput.drain_floor(ctx, n)
        raw = throughput.drain_raw(ctx, n)
        other = throughput.drain_peer(ctx, n)
        results["throughput"] = {
            "toolrelay": ours.as_dict(),
            "floor": least.as_dict(),
            "raw": raw.as_dict(),
            "peer": other.as_dict(),
            "ratio_vs_floor": ours.per_s / least.per_s if least.per_s else 0.0,
            "ratio_vs_raw": ours.per_s / raw.per_s if raw.per_s else 0.0,
            "ratio_vs_peer": ours.per_s / other.per_s if other.per_s else 0.0,
        }

    def do_latency() -> None:
        rates = latency.run(ctx, sizes.latency_seconds)
        results["latency"] = [r.as_dict() for r in rates]
        results["latency_samples"] = [r.as_dict(with_samples=True) for r in rates]

    def do_scaling() -> None:
        counts = list(SCALING_WORKERS)
        reused = []
        if ctx.quick and "throughput" in results and counts[0] == 1:
            reused = [results["throughput"]["toolrelay"]]  # the same drain: N, 1 worker, gate
            counts = counts[1:]
        runs = throughput.scaling(ctx, sizes.throughput_n, counts)
        results["scaling"] = reused + [r.as_dict() for r in runs]

    def do_memory() -> None:
        drain = throughput.drain_toolrelay(ctx, sizes.memory_queued, 1, "memory")
        results["memory"] = drain.as_dict()

    def do_invoke() -> None:
        results["invoke"] = [r.as_dict() for r in invoke.run(ctx, sizes.invoke_seconds)]
        held = sizes.invoke_seconds * 0.3  # per variant with a worker running (3 x 2 of them)
        results["invoke_worker"] = [r.as_dict() for r in wake.run(ctx, held)]

    def do_profile() -> None:
        results["profile"] = profile.run(ctx, sizes.profile_n, OUT_DIR, stamp).as_dict()

    n = f"{sizes.throughput_n:,}"
    phase(
        "throughput",
        f"{n} invocations: toolrelay, the minimal durable loop, raw aiohttp, procrastinate",
        do_throughput,
    )
    held = sizes.sustained_seconds or sizes.latency_seconds
    phase("latency", f"{sizes.latency_seconds:g} s at 200/s, {held:g} s at 1,000/s", do_latency)
    phase("scaling", f"{n} invocations with {SCALING_WORKERS} workers", do_scaling)
    phase("memory", f"{sizes.memory_queued:,} queued, one worker", do_memory)
    phase("invoke", f"{sizes.invoke_seconds:g} s per variant, 8 and 32 threads", do_invoke)
    if sizes.profile_n:
        phase("profile", f"{sizes.profile_n:,} invocations under py-spy", do_profile)


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds: children stopped, databases dropped


def rerender(path: Path) -> int:
    results = json.loads(path.read_text("utf-8"))
    targets = evaluate(results)
    report.print_tables(results, targets)
    if results["meta"]["mode"] == "full":
        plot.render(results, PLOT_PATH)
        report.write_markdown(results, targets, RESULTS_MD, path.name)
    return 1 if failures_of(results) else 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    args = parse_args(argv)
    if args.from_json:
        return rerender(args.from_json)
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    noise_s = QUICK_NOISE_SAMPLE_S if args.quick else NOISE_SAMPLE_S
    noise = {"idle_cores_before": round(noise_sample(noise_s), 3), "loadavg_before": loadavg()}
    results: dict[str, Any] = {}
    with open_session(sizes, args.quick, print, args.worker_src, args.keep_logs) as (
        ctx,
        machine,
    ):
        code = machine.pop("code")
        results["meta"] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "quick" if args.quick else "full",
            "machine": machine,
            "sizes": sizes.__dict__,
            "git": f"{code['git']}, workers ran src sha1 {code['src_sha1']}",
            "worker_src": code["worker_src"],
            "versions": {
                "toolrelay": version("toolrelay"),
                "aiohttp": version("aiohttp"),
                "psycopg": version("psycopg"),
                "procrastinate": version("procrastinate"),
            },
        }
        run_phases(ctx, set(args.skip), stamp, results)
    noise |= {"idle_cores_after": round(noise_sample(noise_s), 3), "loadavg_after": loadavg()}
    results["meta"]["noise"] = noise
    results["meta"]["duration_s"] = round(time.monotonic() - started, 1)
    targets = evaluate(results)
    results["targets"] = [t.as_dict() for t in targets]
    failures = failures_of(results)
    results["failures"] = failures
    json_path = OUT_DIR / f"results-{stamp}.json"
    report.write_json(results, json_path)
    report.print_tables(results, targets)
    official = not args.quick and not args.skip and args.worker_src is None
    if official:
        plot.render(results, PLOT_PATH)
        report.write_markdown(results, targets, RESULTS_MD, json_path.name)
    else:
        plot.render(results, OUT_DIR / f"bench-{results['meta']['mode']}-{stamp}.png")
    print(f"results: {json_path}")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
