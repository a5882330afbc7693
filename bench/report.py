"""``python -m bench``'s results: tables in the terminal, a JSON file, and bench/RESULTS.md.

Every section title names the module whose numbers it shows (SECTIONS); the cells are
formatted here, the tables written by bench/tables.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bench.tables import md_table, print_table
from bench.targets import Target

Rows = list[list[str]]


CORE_LABELS = {
    "sut": "sut",
    "upstream": "up",
    "postgres": "pg",
    "pg_db": "pg-db",
    "harness": "harness",
    "machine": "all",
}


def _cores(cores: dict[str, float]) -> str:
    """Average cores by party, e.g. ``sut 0.91 · up 0.10 · pg 0.75 · all 1.95``."""
    if not cores:
        return "n/a"
    return " · ".join(f"{label} {cores[k]:.2f}" for k, label in CORE_LABELS.items() if k in cores)


def _cost(r: dict[str, Any]) -> str:
    """CPU µs per call: system under test / all of PostgreSQL (/ this run's databases)."""
    cost = r.get("cpu_us_per_call") or {}
    if "sut" not in cost:
        return "n/a"
    pg = cost.get("postgres")
    text = f"{cost['sut']:,.0f} / {pg:,.0f}" if pg is not None else f"{cost['sut']:,.0f} / n/a"
    return text + (f" ({cost['pg_db']:,.0f})" if "pg_db" in cost else "")


def _load(values: Any) -> str:
    return " / ".join(f"{v:g}" for v in values)


def _sizes(sizes: dict[str, Any]) -> str:
    sustained = sizes.get("sustained_seconds") or 0
    return (
        f"N = {sizes['throughput_n']:,} (throughput, scaling), {sizes['latency_seconds']:g} s per"
        f" latency rate{f' (1,000/s: {sustained:g} s)' if sustained else ''},"
        f" {sizes['memory_queued']:,} queued (memory), {sizes['invoke_seconds']:g} s"
        f" per invoke variant, profile N = {sizes['profile_n']:,}"
    )


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def throughput_rows(results: dict[str, Any]) -> tuple[list[str], Rows]:
    head = ["system", "calls/s", "window s", "upstream-seen/s", "dup", "not done",
            "peak RSS MB", "CPU µs/call sut / pg (pg-db)", "cores"]  # fmt: skip
    rows: Rows = []
    tp = results.get("throughput")
    if tp:
        for key in ("toolrelay", "floor", "raw", "peer"):
            if key not in tp:
                continue  # results written before the floor existed
            r = tp[key]
            rows.append(
                [r["system"], _n(r["per_s"]), f"{r['window_s']:.2f}", _n(r["upstream_per_s"]),
                 str(r["duplicates"]), str(r["not_completed"] + r["non_terminal"]),
                 "/".join(f"{m:.0f}" for m in r["rss_mb"]), _cost(r), _cores(r["cores"])]
            )  # fmt: skip
        blank = [""] * (len(head) - 2)
        if "ratio_vs_floor" in tp:
            rows.append(["toolrelay / minimal loop", f"{tp['ratio_vs_floor']:.2f}x", *blank])
        rows.append(["toolrelay / raw", f"{tp['ratio_vs_raw']:.2f}x", *blank])
        rows.append(["toolrelay / procrastinate", f"{tp['ratio_vs_peer']:.2f}x", *blank])
    return head, rows


def latency_rows(results: dict[str, Any]) -> tuple[list[str], Rows]:
    head = [
        "rate/s",
        "s",
        "achieved/s",
        "→request p50/p95/p99/max ms",
        "→finished p50/p95/p99 ms",
        "dup",
        "missing",
        "cores",
    ]
    rows: Rows = []
    for r in results.get("latency", []):
        q, f = r["to_request_ms"], r["to_finish_ms"]
        rows.append(
            [_n(r["rate"]), f"{r['seconds']:g}", _n(r["achieved_per_s"]),
             f"{q['p50']:.1f} / {q['p95']:.1f} / {q['p99']:.1f} / {q['max']:.0f}",
             f"{f['p50']:.1f} / {f['p95']:.1f} / {f['p99']:.1f}",
             str(r["duplicates"]), str(r["missing"] + r["non_terminal"]), _cores(r["cores"])]
        )  # fmt: skip
    return head, rows


def scaling_rows(results: dict[str, Any]) -> tuple[list[str], Rows]:
    head = [
        "workers",
        "invocations/s",
        "vs 1 worker",
        "dup",
        "not done",
        "peak RSS MB",
        "CPU µs/call sut / pg (pg-db)",
        "cores",
    ]
    rows: Rows = []
    scaling = results.get("scaling") or []
    base = scaling[0]["per_s"] if scaling else 0.0
    for r in scaling:
        rows.append(
            [str(r["workers"]), _n(r["per_s"]), f"{r['per_s'] / base:.2f}x" if base else "",
             str(r["duplicates"]), str(r["not_completed"] + r["non_terminal"]),
             "/".join(f"{m:.0f}" for m in r["rss_mb"]), _cost(r), _cores(r["cores"])]
        )  # fmt: skip
    return head, rows


def memory_rows(results: dict[str, Any]) -> tuple[list[str], Rows]:
    head = ["queued", "peak RSS MB (VmHWM)", "invocations/s", "dup", "not done", "cores"]
    m = results.get("memory")
    if not m:
        return head, []
    return head, [
        [_n(m["n"]), f"{max(m['rss_mb']):.1f}", _n(m["per_s"]), str(m["duplicates"]),
         str(m["not_completed"] + m["non_terminal"]), _cores(m["cores"])]
    ]  # fmt: skip


def invoke_rows(results: dict[str, Any], key: str = "invoke") -> tuple[list[str], Rows]:
    head = ["variant", "threads", "invocations/s", "latency p50/p99 ms", "errors", "cores"]
    rows: Rows = []
    for r in results.get(key, []):
        lat = r["latency_ms"]
        rows.append(
            [r["variant"], str(r["threads"]), _n(r["per_s"]), f"{lat['p50']:.1f} / {lat['p99']:.1f}",
             str(r["errors"]), _cores(r["cores"])]
        )  # fmt: skip
    return head, rows


def target_rows(targets: list[Target]) -> tuple[list[str], Rows]:
    head = ["target", "goal", "measured", "status", "note"]
    return head, [[t.name, t.goal, t.measured, t.status, t.note] for t in targets]


def profile_rows(results: dict[str, Any]) -> tuple[list[str], Rows]:
    head = ["where the worker's CPU goes (py-spy, inclusive %)", "%"]
    prof = results.get("profile")
    if not prof or not prof.get("steps_pct"):
        return head, []
    rows = [[k, f"{v:.1f}"] for k, v in prof["steps_pct"].items()]
    rows += [["", ""], ["by area (self time)", ""]]
    rows += [[f"  {k}", f"{v:.1f}"] for k, v in prof["areas_pct"].items()]
    return head, rows


TARGETS_TITLE = "Targets — `bench/targets.py`"
PROFILE_TITLE = "Profile of one worker"  # its heading adds the profiler and the drain
# (title, the module that made its numbers, its rows); a title is also a RESULTS.md heading
SECTIONS = (
    ("1. Throughput (drain N, one process each)", "throughput.py", throughput_rows),
    ("2. Latency (one worker, steady creation rate)", "latency.py", latency_rows),
    ("3. Scaling (worker processes, same N)", "throughput.py", scaling_rows),
    ("4. Memory (one worker drains the queue)", "throughput.py", memory_rows),
    ("5. Invoke cost", "invoke.py", invoke_rows),
    (
        "6. Invoke cost with a worker running (sleep protocol on, and off)",
        "wake.py",
        lambda results: invoke_rows(results, "invoke_worker"),
    ),
)


def section_title(title: str, module: str) -> str:
    return f"{title} — `bench/{module}`"


def print_tables(results: dict[str, Any], targets: list[Target]) -> None:
    for title, module, rows_of in SECTIONS:
        head, rows = rows_of(results)
        if rows:
            print_table(head, rows, f"\n{section_title(title, module)}")
    head, rows = profile_rows(results)
    if rows:
        print_table(head, rows, f"\n{section_title(PROFILE_TITLE, 'profile.py')}")
    quick = " (quick run, not judged)" if results["meta"]["mode"] == "quick" else ""
    print_table(*target_rows(targets), f"\n{TARGETS_TITLE}{quick}")
    meta = results["meta"]
    noise = meta["noise"]
    print(
        f"machine: {meta['machine']['nproc']} cores, {meta['machine']['memory_gb']} GB, "
        f"PostgreSQL {meta['machine']['postgres']} ({meta['machine']['postgres_source']}); "
        f"other load: {noise['idle_cores_before']:.2f} cores busy before, "
        f"{noise['idle_cores_after']:.2f} after; load average {_load(noise['loadavg_before'])} → "
        f"{_load(noise['loadavg_after'])}; run took {meta['duration_s']:.0f} s"
    )


def write_json(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n", "utf-8")


_SECTION = re.compile(r"(?m)^(?=## )")


def kept_sections(text: str) -> list[str]:
    """The sections of RESULTS.md this writer does not own (written by hand, e.g. by other
    benchmarks), in their order: every ``## `` section whose title is not one it writes."""
    owned = {TARGETS_TITLE, *(section_title(title, module) for title, module, _ in SECTIONS)}
    kept = []
    for chunk in _SECTION.split(text)[1:]:
        title = chunk.splitlines()[0].removeprefix("## ").strip()
        if title in owned or title.startswith(PROFILE_TITLE):
            continue
        kept.append(chunk.rstrip("\n") + "\n")
    return kept


def write_markdown(
    results: dict[str, Any], targets: list[Target], path: Path, json_name: str
) -> None:
    """Rewrites the sections it owns; hand-written sections of the file stay, after them."""
    kept = kept_sections(path.read_text("utf-8")) if path.exists() else []
    meta = results["meta"]
    machine, noise = meta["machine"], meta["noise"]
    parts = [
        "# Benchmark results (latest full run)",
        "",
        "Written by `python -m bench` (full mode, bench/report.py) down to the plot; every heading"
        " names the module that made its numbers, and the hand-written sections after the plot"
        " name their command. See docs/benchmarks.md for what each number means and how it is"
        f" measured. Raw data: `bench/out/{json_name}` (not committed).",
        "Where the time goes and what would close the gaps:",
        "[docs/benchmarks.md, findings](../docs/benchmarks.md#where-the-time-goes-findings-of-2026-11-29).",
        "",
        f"- date: {meta['date']} (run took {meta['duration_s']:.0f} s)",
        f"- machine: {machine['nproc']} cores ({machine['cpu']}), {machine['memory_gb']} GB RAM, "
        f"Linux {machine['kernel']}, Python {machine['python']}",
        f"- PostgreSQL {machine['postgres']} ({machine['postgres_source']}), fresh database per run",
        f"- code measured: {meta['git']}; versions: "
        f"{', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        f"- other load on the machine (shared with other engineers): {noise['idle_cores_before']:.2f}"
        f" cores busy before the run, {noise['idle_cores_after']:.2f} after; load average "
        f"{_load(noise['loadavg_before'])} before, {_load(noise['loadavg_after'])} after",
        f"- sizes: {_sizes(meta['sizes'])}",
        "",
        "`cores` columns are average CPU cores over the measured window: `sut` the system under"
        " test (worker processes, the raw client, or the procrastinate worker), `up` the"
        " upstream HTTP server, `pg` every process of the PostgreSQL server (all databases;"
        " backends living less than 0.1 s are missed), `all` everything on the machine"
        " (2 = saturated). `CPU µs/call` is the same per call: the cost, whatever share of the"
        " machine the run got.",
        "",
        f"## {TARGETS_TITLE}",
        "",
        md_table(*target_rows(targets)),
        "",
    ]
    for title, module, rows_of in SECTIONS:
        head, rows = rows_of(results)
        if rows:
            parts += [f"## {section_title(title, module)}", "", md_table(head, rows), ""]
    head, rows = profile_rows(results)
    if rows:
        prof = results["profile"]
        parts += [
            f"## {PROFILE_TITLE} ({prof['tool']}, {prof['samples']:,} samples, "
            f"draining {prof['drain']['n']:,} at {prof['drain']['per_s']:,.0f}/s under the profiler)"
            " — `bench/profile.py`",
            "",
            md_table(head, rows),
            "",
            "Top self time:",
            "",
            md_table(["function", "%"], [[f, f"{p:.1f}"] for f, p in prof["top_self_pct"][:15]]),
            "",
        ]
    parts += ["![benchmark plot](../docs/img/bench.png)", ""]
    parts += kept
    path.write_text("\n".join(parts), "utf-8")
