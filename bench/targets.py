"""RESULTS.md's "Targets": issue #7's and issue 14's targets, judged against one run's results."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.constants import (
    SATURATED_CORES,
    SATURATED_PROCESS,
    TARGET_INVOKE_PER_S,
    TARGET_P50_200_MS,
    TARGET_P99_200_MS,
    TARGET_P99_1000_MS,
    TARGET_PG_US,
    TARGET_RSS_MB,
    TARGET_SCALE_2,
    TARGET_VS_FLOOR,
    TARGET_VS_PEER,
    TARGET_VS_RAW,
    TARGET_WORKER_US,
)

MET, MISSED, EXCUSED = "met", "missed", "missed (saturated)"


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    status: str
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _judge(ok: bool) -> str:
    return MET if ok else MISSED


def evaluate(results: dict[str, Any]) -> list[Target]:
    out: list[Target] = []
    tp = results.get("throughput")
    if tp and "ratio_vs_floor" in tp:
        out += _floor_targets(tp)
    if tp:
        vs_raw, vs_peer = tp["ratio_vs_raw"], tp["ratio_vs_peer"]
        out.append(
            Target(
                "throughput vs raw aiohttp",
                f">= {TARGET_VS_RAW}x",
                f"{vs_raw:.2f}x",
                _judge(vs_raw >= TARGET_VS_RAW),
            )
        )
        out.append(
            Target(
                "throughput vs procrastinate",
                f">= {TARGET_VS_PEER}x",
                f"{vs_peer:.2f}x",
                _judge(vs_peer >= TARGET_VS_PEER),
            )
        )
    by_rate = {r["rate"]: r for r in results.get("latency", [])}
    if 200 in by_rate:
        p = by_rate[200]["to_request_ms"]
        out.append(
            Target(
                "p50 creation->request @200/s",
                f"<= {TARGET_P50_200_MS:g} ms",
                f"{p['p50']:.1f} ms",
                _judge(p["p50"] <= TARGET_P50_200_MS),
            )
        )
        out.append(
            Target(
                "p99 creation->request @200/s",
                f"<= {TARGET_P99_200_MS:g} ms",
                f"{p['p99']:.1f} ms",
                _judge(p["p99"] <= TARGET_P99_200_MS),
            )
        )
    if 1000 in by_rate:
        p = by_rate[1000]["to_request_ms"]
        out.append(
            Target(
                "p99 creation->request @1000/s",
                f"<= {TARGET_P99_1000_MS:g} ms",
                f"{p['p99']:.1f} ms",
                _judge(p["p99"] <= TARGET_P99_1000_MS),
            )
        )
    scaling = results.get("scaling") or []
    if scaling:
        dups = {s["workers"]: s["duplicates"] for s in scaling}
        out.append(
            Target(
                "duplicates at 1/2/4 workers",
                "0 at each",
                " / ".join(str(d) for d in dups.values()),
                _judge(not any(dups.values())),
            )
        )
        one = next((s for s in scaling if s["workers"] == 1), None)
        two = next((s for s in scaling if s["workers"] == 2), None)
        if one and two and one["per_s"] > 0:
            ratio = two["per_s"] / one["per_s"]
            out.append(_scaling_target(ratio, two))
    mem = results.get("memory")
    if mem:
        rss = max(mem["rss_mb"])
        out.append(
            Target(
                f"worker peak RSS, {mem['n']:,} queued",
                f"<= {TARGET_RSS_MB:g} MB",
                f"{rss:.0f} MB",
                _judge(rss <= TARGET_RSS_MB),
            )
        )
    out += _wake_targets(results.get("invoke_worker") or [])
    invoke = {r["variant"]: r for r in results.get("invoke", [])}
    if "Registry.invoke" in invoke:
        rate = invoke["Registry.invoke"]["per_s"]
        out.append(
            Target(
                "Registry.invoke, 8 threads",
                f">= {TARGET_INVOKE_PER_S:,.0f}/s",
                f"{rate:,.0f}/s",
                _judge(rate >= TARGET_INVOKE_PER_S),
            )
        )
    return out


def _wake_targets(rows: list[dict[str, Any]]) -> list[Target]:
    """Issue 14, goal 3: with the dispatcher running, nothing serializes all invokers."""
    by = {(r["variant"], r["threads"]): r["per_s"] for r in rows}
    eight = by.get(("fn_invoke_tool, worker running", 8))
    wide = by.get(("fn_invoke_tool, worker running", 32))
    if not eight or wide is None:
        return []
    before = by.get(("fn_invoke_tool, worker running, every call notifies", 32))
    note = f"{wide:,.0f}/s vs {eight:,.0f}/s" + (
        f"; every call notifying: {before:,.0f}/s at 32" if before is not None else ""
    )
    return [
        Target(
            "fn_invoke_tool 32 vs 8 connections, worker running",
            ">= 1.0x",
            f"{wide / eight:.2f}x",
            _judge(wide >= eight),
            note,
        )
    ]


def _floor_targets(tp: dict[str, Any]) -> list[Target]:
    """Issue 14, goal 4: beside the minimal durable loop of the same run, and what a call
    costs the worker and PostgreSQL in toolrelay's drain."""
    ours, least = tp["toolrelay"], tp["floor"]
    cost, floor_cost = ours["cpu_us_per_call"], least["cpu_us_per_call"]
    ratio = tp["ratio_vs_floor"]
    # This run's databases only when measured (a shared server also runs other people's).
    pg, sut = cost.get("pg_db", cost.get("postgres")), cost.get("sut")
    pg_of = "this run's databases" if "pg_db" in cost else "the whole server"
    return [
        Target(
            "throughput vs minimal durable loop",
            f">= {TARGET_VS_FLOOR}x",
            f"{ratio:.2f}x",
            _judge(ratio >= TARGET_VS_FLOOR),
            f"{ours['per_s']:,.0f}/s vs {least['per_s']:,.0f}/s",
        ),
        Target(
            "PostgreSQL CPU per call (drain)",
            f"<= {TARGET_PG_US:g} µs",
            f"{pg:,.0f} µs" if pg is not None else "n/a",
            _judge(pg is not None and pg <= TARGET_PG_US),
            f"{pg_of}; minimal loop"
            f" {floor_cost.get('pg_db', floor_cost.get('postgres', 0)):,.0f} µs",
        ),
        Target(
            "worker CPU per call (drain)",
            f"<= {TARGET_WORKER_US:g} µs",
            f"{sut:,.0f} µs" if sut is not None else "n/a",
            _judge(sut is not None and sut <= TARGET_WORKER_US),
            f"minimal loop {floor_cost.get('sut', 0):,.0f} µs",
        ),
    ]


def _scaling_target(ratio: float, two: dict[str, Any]) -> Target:
    goal = f">= {TARGET_SCALE_2}x unless saturated"
    measured = f"{ratio:.2f}x"
    if ratio >= TARGET_SCALE_2:
        return Target("2 workers vs 1", goal, measured, MET)
    cores = two.get("cores", {})
    machine = cores.get("machine", 0.0)
    upstream = cores.get("upstream", 0.0)
    note = f"machine {machine:.2f} cores busy, upstream {upstream:.2f}, postgres {cores.get('postgres', 0.0):.2f}"
    saturated = machine >= SATURATED_CORES or upstream >= SATURATED_PROCESS
    return Target("2 workers vs 1", goal, measured, EXCUSED if saturated else MISSED, note)
