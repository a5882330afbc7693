"""bench/HISTORY.md from a ``python -m bench.history`` results file, and the capacity model
derived from its measurements (every derived number says how it was derived)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

US = 1e6
BIG_BOX_VCPU = 16  # the stated larger database host of the extrapolation
DB_UTILISATION = 0.7  # of its cores a database is planned to use (headroom for spikes, vacuum)
CONNECTION_RESERVE = 10  # connections kept for owners, the API, migrations, monitoring
SLOW_COMMIT_MS = 1.0  # a durable commit on network storage or with a synchronous standby


def _n(v: float, digits: int = 0) -> str:
    return f"{v:,.{digits}f}"


def _g(v: float) -> str:
    """A median or bound at a sensible precision: 2,212 / 45.8 / 0.082."""
    if v != v:  # NaN
        return "n/a"
    size = abs(v)
    return _n(v, 0 if size >= 100 else 1 if size >= 10 else 3)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def capacity_model(results: dict[str, Any]) -> dict[str, Any]:
    """Measured inputs, then what follows from them. Returns {} without the needed parts."""
    drains = results.get("drains") or []
    cap = results.get("capacity") or {}
    dead = results.get("dead") or {}
    if not drains or not cap:
        return {}
    small = results["verdict"]["small"]
    ds = [d for d in drains if d["label"] == small] or drains
    per_worker = _med([d["per_s"] for d in ds])
    worker_us = _med([d["cpu_us_per_call"].get("sut", 0.0) for d in ds])
    pg_drain_us = _med([d["cpu_us_per_call"].get("postgres", 0.0) for d in ds])
    up_us = _med([d["cpu_us_per_call"].get("upstream", 0.0) for d in ds])
    pg_enq_us = _med([d["pg_us_per_enqueued"] for d in ds])
    wal_drain = _med([d["wal_bytes_per_call"] for d in ds])
    wal_enq = _med([d["wal_enqueue_bytes_per_call"] for d in ds])
    conns = max(d["connections"]["backends"] for d in drains)
    listening = max(d["connections"]["listening"] for d in drains)
    dead_conns = (dead.get("worker_connections") or {}).get("backends", 0)
    configured = int(cap.get("pool_max", 6)) + 1  # the pool's maximum, plus LISTEN
    steps = cap.get("lifecycle", [])
    by_batch: dict[int, dict[str, dict[str, float]]] = {}
    for s in steps:
        by_batch.setdefault(int(s["batch"]), {})[s["step"]] = s
    single = by_batch.get(1, {})
    batched = by_batch.get(64, {})
    single_cpu = sum(s["cpu_us_per_call"] for s in single.values())
    single_wal = sum(s["wal_bytes_per_call"] for s in single.values())
    batched_cpu = sum(s["cpu_us_per_call"] for s in batched.values())
    batched_wal = sum(s["wal_bytes_per_call"] for s in batched.values())
    base = [w for w in dead.get("windows", []) if w["phase"] == "baseline" and w["finished_per_s"]]
    steady_pg_us = _med(
        [w["cores"].get("postgres", 0.0) / w["finished_per_s"] * US for w in base if w["cores"]]
    )
    steady_worker_us = _med(
        [w["cores"].get("sut", 0.0) / w["finished_per_s"] * US for w in base if w["cores"]]
    )
    steady_wal = _med([w["wal_bytes_per_call"] for w in base])
    steady_rate = dead.get("plan", {}).get("rate", 0)
    ceilings = cap.get("ceilings", [])
    notify_on = max((c["per_s"] for c in ceilings if c["trigger"] == "on"), default=0.0)
    notify_on_min = min((c["per_s"] for c in ceilings if c["trigger"] == "on"), default=0.0)
    notify_off = max((c["per_s"] for c in ceilings if c["trigger"] == "off"), default=0.0)
    commit_ms = cap.get("commit_ms", {}).get("p50", float("nan"))
    max_conn = int(results["meta"]["machine"]["settings"].get("max_connections", "100"))
    nproc = int(results["meta"]["machine"].get("nproc") or 2)

    # Derived.
    # The lock is held for a whole commit; 1 / ceiling is how long, on average, per call.
    notify_hold_ms = 1000.0 / notify_on if notify_on else float("nan")
    drain_total_us = worker_us + pg_drain_us + pg_enq_us + up_us
    this_box_rate = nproc * US / drain_total_us if drain_total_us else 0.0
    budget_us = BIG_BOX_VCPU * DB_UTILISATION * US
    big_drain_rate = budget_us / (pg_drain_us + pg_enq_us) if pg_drain_us else 0.0
    big_steady_rate = budget_us / steady_pg_us if steady_pg_us == steady_pg_us else 0.0
    conn_workers = (max_conn - CONNECTION_RESERVE) // max(1, configured)
    return {
        "measured": {
            "per_worker_per_s": round(per_worker),
            "worker_us_per_call": round(worker_us),
            "pg_us_per_call_drain": round(pg_drain_us),
            "pg_us_per_created_batch": round(pg_enq_us),
            "upstream_us_per_call": round(up_us),
            "pg_us_per_invocation_steady": round(steady_pg_us) if base else None,
            "worker_us_per_call_steady": round(steady_worker_us) if base else None,
            "steady_rate": steady_rate,
            "wal_drain": round(wal_drain),
            "wal_enqueue": round(wal_enq),
            "wal_steady": round(steady_wal) if base else None,
            "lifecycle_single_cpu_us": round(single_cpu),
            "lifecycle_single_wal": round(single_wal),
            "lifecycle_batched_cpu_us": round(batched_cpu),
            "lifecycle_batched_wal": round(batched_wal),
            "connections_per_worker": conns,
            "connections_per_worker_dead": dead_conns,
            "connections_per_worker_max": configured,
            "listening_per_worker": listening,
            "notify_ceiling_per_s": round(notify_on),
            "notify_ceiling_min_per_s": round(notify_on_min),
            "no_trigger_per_s": round(notify_off),
            "commit_ms_p50": commit_ms,
            "max_connections": max_conn,
        },
        "derived": {
            "this_box_rate": round(this_box_rate),
            "this_box_workers": round(_per(per_worker, this_box_rate), 2),
            "big_box_vcpu": BIG_BOX_VCPU,
            "big_drain_rate": round(big_drain_rate),
            "big_drain_workers": round(_per(per_worker, big_drain_rate), 1),
            "big_steady_rate": round(big_steady_rate),
            "big_steady_workers": round(_per(per_worker, big_steady_rate), 1),
            "connection_limited_workers": conn_workers,
            "connection_limited_rate": round(conn_workers * per_worker),
            "wal_mb_s_at_big_steady": round(big_steady_rate * (steady_wal or 0) / 2**20, 1),
            "wal_mb_s_at_big_drain": round(big_drain_rate * (wal_drain + wal_enq) / 2**20, 1),
            "notify_bound_from_commit": round(1000.0 / commit_ms) if commit_ms else 0,
            "notify_hold_ms": round(notify_hold_ms, 3),
            "notify_at_slow_commit": round(1000.0 / (SLOW_COMMIT_MS + notify_hold_ms - commit_ms))
            if notify_on
            else 0,
        },
    }


def _per(per_worker: float, rate: float) -> float:
    return rate / per_worker if per_worker else 0.0


def _meta(results: dict[str, Any], json_name: str) -> list[str]:
    meta = results["meta"]
    m = meta["machine"]
    noise = meta.get("noise", {})
    settings = m.get("settings", {})
    sz = meta["sizes"]
    return [
        "# History, dead tuples and capacity (python -m bench.history)",
        "",
        f"Written by `python -m bench.history` ({meta['mode']} mode); what is measured and how:",
        "[docs/scaling.md](../docs/scaling.md#a-hot-path-that-stays-small). Raw data:"
        f" `bench/out/{json_name}` (not committed).",
        "",
        f"- date: {meta['date']} (run took {meta.get('duration_s', 0):.0f} s)",
        f"- machine: {m['nproc']} cores ({m['cpu']}), {m['memory_gb']} GB RAM, Linux"
        f" {m['kernel']}, Python {m['python']}",
        f"- PostgreSQL {m['postgres']} ({m['postgres_source']}); shared_buffers"
        f" {settings.get('shared_buffers')}, max_connections {settings.get('max_connections')},"
        f" synchronous_commit {settings.get('synchronous_commit')}, fsync"
        f" {settings.get('fsync')}, full_page_writes {settings.get('full_page_writes')},"
        f" wal_compression {settings.get('wal_compression')}, **autovacuum"
        f" {settings.get('autovacuum')}**, idle_in_transaction_session_timeout"
        f" {settings.get('idle_in_transaction_session_timeout')}",
        f"- code measured: {meta['git']}",
        f"- other load on the machine (shared): {noise.get('idle_cores_before', '?')} cores busy"
        f" before, {noise.get('idle_cores_after', '?')} after; load average"
        f" {' / '.join(str(x) for x in noise.get('loadavg_before', []))} before,"
        f" {' / '.join(str(x) for x in noise.get('loadavg_after', []))} after",
        f"- sizes: {sz['small']:,} vs {sz['large']:,} finished invocations, {sz['drain_n']:,}"
        f" per drain, {sz['rounds']} rounds; claim explained {sz['probe_repeats']} times with"
        f" {sz['probe_runnable']} runnable; dead tuples at {sz['dead']['rate']}/s:"
        f" {sz['dead']['baseline_s']:g} s baseline, {sz['dead']['held_s']:g} s held,"
        f" {sz['dead']['released_s']:g} s released",
        "",
    ]


def _drains(results: dict[str, Any]) -> list[str]:
    drains = results.get("drains") or []
    if not drains:
        return []
    v = results["verdict"]
    small, large = v["small"], v["large"]
    out = [f"## 1. {small} vs {large} finished invocations in the table", ""]
    fill = results.get("fill", {})
    rows = []
    for label, f in fill.items():
        s = f["sizes"]
        rows.append(
            [label, _n(f["n"]), f"{f['seconds']:.1f}", _n(s["heap"] / 2**20, 1),
             _n(s["indexes"] / 2**20, 1), _n(s["attempts_total"] / 2**20, 1),
             str(s.get("tool_invocations_pkey_levels", "?")),
             _n(s["runnable_idx"] / 1024), str(s.get("tool_invocations_runnable_idx_levels", "?"))]
        )  # fmt: skip
    out += _table(
        ["history", "finished rows", "fill s", "heap MB", "indexes MB", "attempts MB (total)",
         "pkey levels", "runnable idx KB", "runnable idx levels"], rows,
    )  # fmt: skip
    out += [
        f"Every drain, in the order run (each one: {results['meta']['sizes']['drain_n']:,} fresh"
        " invocations, one worker, concurrency 64; a CHECKPOINT before creating them and again"
        " before the drain, so each drain pays full-page images for every page it touches"
        " first; FPI = full-page images per call, cluster-wide; `other` = cores busy on the"
        " machine outside the benchmark's processes):",
        "",
    ]
    rows = []
    for d in drains:
        p, k = d["probe"], d["probe_picked"]
        hot = 100.0 * d["hot_updates"] / d["updates"] if d["updates"] else 0.0
        rows.append(
            [str(d["round"]), d["label"], _n(d["per_s"]), f"{d['window_s']:.2f}",
             f"{d['cpu_us_per_call'].get('sut', 0):.0f} / {d['cpu_us_per_call'].get('postgres', 0):.0f}",
             _n(d["enqueue_per_s"]), _n(d["wal_bytes_per_call"]), f"{d.get('fpi_per_call', 0):.2f}",
             _n(d["wal_enqueue_bytes_per_call"]),
             f"{d.get('blocks_hit_per_call', 0):.0f} / {d.get('blocks_read_per_call', 0):.2f}",
             f"{hot:.1f}", f"{p['execution_ms']['median']:.3f} ({p['execution_ms']['min']:.3f}-{p['execution_ms']['max']:.3f})",
             f"{p['shared_hit']['median']:.0f} / {p['index_hit']['median']:.0f}",
             f"{k['execution_ms']['median']:.3f} / {k['shared_hit']['median']:.0f}",
             str(d["duplicates"]), f"{d['cores'].get('other', 0):.2f}",
             " / ".join(f"{x:g}" for x in d["loadavg"])]
        )  # fmt: skip
    out += _table(
        ["round", "history", "drain/s", "window s", "CPU µs/call worker / pg", "enqueue/s",
         "WAL B/call drain", "FPI/call drain", "WAL B/call create",
         "blocks/call hit / read", "HOT %", "claim ms median (min-max)",
         "claim buffers all / index", "picked scan ms / buffers", "dup", "other cores",
         "loadavg"], rows,
    )  # fmt: skip
    names = {
        "drain_per_s": "drain (calls/s)",
        "claim_ms": "claim, execution ms",
        "claim_buffers": "claim, shared buffers hit",
        "claim_index_buffers": "claim, runnable index buffers",
        "picked_ms": "claim scan (picked CTE), ms",
        "picked_buffers": "claim scan, buffers",
        "enqueue_per_s": "create (fn_invoke_tool x5,000/statement)/s",
        "worker_us_per_call": "worker CPU µs/call",
        "pg_us_per_call": "PostgreSQL CPU µs/call (drain)",
        "wal_bytes_per_call": "WAL bytes/call (drain)",
        "wal_enqueue_bytes_per_call": "WAL bytes/call (create)",
        "fpi_per_call": "full-page images/call (drain)",
        "blocks_hit_per_call": "shared buffers hit/call (drain, both tables + indexes)",
        "blocks_read_per_call": "blocks read/call (not in shared_buffers)",
        "hot_pct": "HOT share of updates %",
        "other_cores": "other load (cores)",
    }
    out += _summary(v, names)
    within = "yes" if v["within_10pct"] else "no"
    low, high = v.get("paired_ci95", [float("nan"), float("nan")])
    out += [
        f"**Verdict.** Drain throughput {large} / {small} = {v['drain_ratio']:.3f} (medians);"
        f" per round, back to back: {', '.join(f'{r:.3f}' for r in v['paired_ratios'])}."
        f" Within 10 %: **{within}**. Noise: repeats of the same case spread (max - min) /"
        f" median by up to {v['noise_pct']:.1f} %; the paired ratios average"
        f" {v.get('paired_mean', float('nan')):.3f}, 95 % interval {low:.3f} - {high:.3f}"
        + (
            ", inside 0.9 - 1.1: the measurement resolves 10 %."
            if v["resolvable"]
            else ", wider than 0.9 - 1.1: at this noise the drain rate alone cannot tell a 10 %"
            " difference; the buffer, WAL and read counts below it are deterministic and are the"
            " sharper comparison."
        ),
        "",
    ]
    return out + _v7(results, names)


def _summary(v: dict[str, Any], names: dict[str, str]) -> list[str]:
    small, large = v["small"], v["large"]
    out: list[str] = []
    rows = []
    for key, title in names.items():
        m = v["metrics"][key]
        a, b = m[small], m[large]
        rows.append(
            [title, _g(a["median"]), f"{_g(a['min'])} - {_g(a['max'])}", _g(b["median"]),
             f"{_g(b['min'])} - {_g(b['max'])}",
             f"{m['ratio']:.3f}" if m["ratio"] is not None else "", _ci(m.get("paired_ci95"))]
        )  # fmt: skip
    out += ["Median and range of the rounds:", ""]
    out += _table(
        ["measure", f"{small} median", f"{small} range", f"{large} median", f"{large} range",
         f"{large} / {small}", "paired per round: mean (95 % interval)"], rows,
    )  # fmt: skip
    return out


def _ci(values: list[float] | None) -> str:
    if not values or values[0] != values[0]:
        return ""
    mean, low, high = values
    return f"{mean:.3f} ({low:.3f} - {high:.3f})"


def _v7(results: dict[str, Any], names: dict[str, str]) -> list[str]:
    v = results.get("verdict_v7")
    if not v or not any(d.get("time_ordered_ids") for d in results.get("drains", [])):
        return []
    keep = ("drain_per_s", "pg_us_per_call", "wal_bytes_per_call", "wal_enqueue_bytes_per_call",
            "fpi_per_call", "blocks_hit_per_call", "blocks_read_per_call", "claim_ms",
            "claim_buffers", "hot_pct")  # fmt: skip
    out = [
        f"### Experiment: time-ordered ids with the {v['small']} history",
        "",
        f"`{v['large']}`: the same {v['small']} database, but during its drains the id default of"
        " agents.tool_invocations is a UUIDv7-style function (48 bits of milliseconds first)"
        " instead of gen_random_uuid(), so new ids go to one edge of the primary key and of the"
        " attempts' (invocation_id, attempt) index. Scratch database only; src/ unchanged.",
        "",
    ]
    out += _summary(v, {k: names[k] for k in keep if k in names})
    out += [
        f"Drain throughput {v['large']} / {v['small']} = {v['drain_ratio']:.3f} (medians); per"
        f" round: {', '.join(f'{r:.3f}' for r in v['paired_ratios'])}; noise up to"
        f" {v['noise_pct']:.1f} %.",
        "",
    ]
    return out


def _dead(results: dict[str, Any]) -> list[str]:
    dead = results.get("dead")
    if not dead:
        return []
    plan = dead["plan"]
    out = [
        f"## 2. Dead tuples under a transaction held open ({plan['rate']}/s flowing)",
        "",
        f"{dead['generated']:,} invocations created at {dead['achieved_per_s']:,.0f}/s achieved"
        f" ({dead['not_completed']} not completed). The held transaction (REPEATABLE READ, one"
        f" SELECT, then idle) spans t = {plan['baseline_s']:g}-"
        f"{plan['baseline_s'] + plan['held_s']:g} s. A VACUUM of the table runs every"
        f" {plan['vacuum_every_s']:g} s (autovacuum is off on this server; this stands in for it)."
        f" The worker's connections, most at once: {dead.get('worker_connections', {})}.",
        "",
    ]
    rows = []
    for w in dead["windows"]:
        lat = w["latency_ms"]
        rows.append(
            [f"{w['start']:.0f}-{w['end']:.0f}", w["phase"], _n(w["created_per_s"]),
             _n(w["finished_per_s"]), f"{lat['p50']:.1f} / {lat['p99']:.1f}",
             _n(w["dead_tup"]), _n(w["dead_exact"]), _n(w["runnable_idx_kb"]),
             f"{w['total_mb']:.1f}", f"{w['claim_ms']:.3f}", _n(w["claim_hit"]),
             f"{w['hot_pct']:.0f}", _n(w["wal_bytes_per_call"]), str(w["running"]),
             _n(w["xmin_age"]), f"{w['cores'].get('postgres', 0):.2f}",
             f"{w['cores'].get('sut', 0):.2f}", f"{w['cores'].get('machine', 0):.2f}"]
        )  # fmt: skip
    out += _table(
        ["t s", "phase", "created/s", "finished/s", "latency p50 / p99 ms", "n_dead_tup",
         "dead (pgstattuple)", "runnable idx KB", "table+idx MB", "claim scan ms",
         "claim buffers", "HOT %", "WAL B/call", "running", "oldest xmin age",
         "pg cores", "worker cores", "all cores"], rows,
    )  # fmt: skip
    rows = [
        [f"{v['t']:.1f}", v["phase"], _n(v["removed"]), _n(v.get("items_removed", 0)),
         _n(v["remain"]), _n(v["not_removable"]), _n(v["cutoff_age"]), f"{v['seconds']:.2f}"]
        for v in dead["vacuums"]
    ]  # fmt: skip
    out += ["The VACUUMs (VERBOSE):", ""]
    out += _table(
        ["t s", "phase", "row versions removed", "dead item ids removed", "remain",
         "dead but not yet removable",
         "removable cutoff age (xids)", "seconds"], rows,
    )  # fmt: skip
    return out


def _capacity(results: dict[str, Any]) -> list[str]:
    cap = results.get("capacity")
    if not cap:
        return []
    out = ["## 3. Capacity inputs", "", "An invocation's life, step by step (each step its own"
           " autocommit transaction as the worker runs it; WAL: median over batches, per"
           " invocation; CPU: the backend's, from /proc):", ""]  # fmt: skip
    rows = [
        [s["step"], str(s["batch"]), _n(s["invocations"]), _n(s["wal_bytes_per_call"]),
         _n(s["cpu_us_per_call"]), f"{s['wall_ms_median']:.3f}"]
        for s in cap["lifecycle"]
    ]  # fmt: skip
    for batch in sorted({int(s["batch"]) for s in cap["lifecycle"]}):
        ss = [s for s in cap["lifecycle"] if int(s["batch"]) == batch]
        rows.append(
            ["**whole life**", str(batch), "", _n(sum(s["wal_bytes_per_call"] for s in ss)),
             _n(sum(s["cpu_us_per_call"] for s in ss)), f"{sum(s['wall_ms_median'] for s in ss):.3f}"]
        )  # fmt: skip
    out += _table(["step", "batch", "invocations", "WAL bytes/invocation",
                   "PostgreSQL CPU µs/invocation", "wall ms/statement (median)"], rows)  # fmt: skip
    ff = cap.get("fillfactor") or []
    if ff:
        out += [
            "HOT updates by fillfactor of agents.tool_invocations (set in the scratch database"
            " for the run; new rows honour it at once; migration 0010 ships 70). Of the three"
            " updates of an invocation, claim and mark_sent can be HOT, finish cannot (it changes"
            " `status`, which the partial indexes' predicates read), so 66.7 % is the ceiling:",
            "",
        ]
        out += _table(
            ["fillfactor", "batch", "updates", "HOT", "HOT %", "WAL B/invocation (whole life)",
             "PostgreSQL CPU µs/invocation"],
            [[str(x["fillfactor"]), str(x["batch"]), _n(x["updates"]), _n(x["hot"]),
              f"{x['hot_pct']:.1f}", _n(x["wal_bytes_per_call"]), _n(x["cpu_us_per_call"])]
             for x in ff],
        )  # fmt: skip
    c = cap["commit_ms"]
    out += [
        f"One durable commit (a one-row INSERT, autocommit, sequential): p50 {c['p50']:.3f} ms,"
        f" p95 {c['p95']:.3f} ms, p99 {c['p99']:.3f} ms.",
        "",
        "`fn_invoke_tool` as fast as C connections can call it (each call its own transaction),"
        " NOTIFY trigger on (as shipped), off, and `conditional` (an experiment in the scratch"
        " database: NOTIFY only when no other unleased runnable invocation exists; with no worker"
        " running, as here, that is the backlog case, where only the first call notifies);"
        " what the callers' backends were doing (share of samples of active backends; `CPU` ="
        " no wait event):",
        "",
    ]
    rows = []
    for x in cap["ceilings"]:
        waits = ", ".join(f"{k} {v:.0f}%" for k, v in list(x["waits_pct"].items())[:4])
        rows.append(
            [str(x["connections"]), str(x["trigger"]), _n(x["per_s"]),
             f"{x['latency_ms']['p50']:.2f} / {x['latency_ms']['p99']:.2f}",
             _n(x["pg_us_per_call"]), _n(x["wal_bytes_per_call"]),
             f"{x['cores'].get('postgres', 0):.2f} / {x['cores'].get('machine', 0):.2f}", waits]
        )  # fmt: skip
    out += _table(["connections", "NOTIFY trigger", "invocations/s", "p50 / p99 ms",
                   "pg CPU µs/call", "WAL B/call", "pg / all cores", "waits"], rows)  # fmt: skip
    model = capacity_model(results)
    if not model:
        return out
    m, d = model["measured"], model["derived"]
    out += ["## 4. Capacity model (measured → derived)", ""]
    rows = [
        ["measured", "one worker (concurrency 64) drains", f"{m['per_worker_per_s']:,}/s"],
        ["measured", "worker CPU per call (drain)", f"{m['worker_us_per_call']} µs"],
        ["measured", "PostgreSQL CPU per call, drain (claim + mark_sent + finish)",
         f"{m['pg_us_per_call_drain']} µs"],
        ["measured", "PostgreSQL CPU per invocation created, 5,000 per statement",
         f"{m['pg_us_per_created_batch']} µs"],
        ["measured", f"PostgreSQL CPU per invocation at a steady {m['steady_rate']}/s"
         " (one statement per creation + dispatch)", f"{m['pg_us_per_invocation_steady']} µs"],
        ["measured", "WAL per invocation: drain / batch creation / steady (all of it)",
         f"{m['wal_drain']:,} / {m['wal_enqueue']:,} / {m['wal_steady']} B"],
        ["measured", "whole life, step by step: batch 1 / batch 64",
         f"{m['lifecycle_single_cpu_us']} / {m['lifecycle_batched_cpu_us']} µs CPU;"
         f" {m['lifecycle_single_wal']:,} / {m['lifecycle_batched_wal']:,} B WAL"],
        ["measured", "connections per worker, most at once: drain / dead-tuple run / the pool's"
         " maximum + LISTEN", f"{m['connections_per_worker']} / {m['connections_per_worker_dead']}"
         f" / {m['connections_per_worker_max']} (LISTEN: {m['listening_per_worker']})"],
        ["measured", "single-statement invocations/s, NOTIFY trigger on (best / worst of the"
         " connection counts) / off", f"{m['notify_ceiling_per_s']:,} /"
         f" {m['notify_ceiling_min_per_s']:,} / {m['no_trigger_per_s']:,}"],
        ["measured", "one durable commit (p50)", f"{m['commit_ms_p50']:.3f} ms"],
        ["derived", "this box (2 cores, workers and database together): 2 cores / (worker +"
         " pg drain + pg create + upstream µs)",
         f"{d['this_box_rate']:,}/s ≈ {d['this_box_workers']} workers' worth"],
        ["derived", f"a {d['big_box_vcpu']}-vCPU database at {DB_UTILISATION:.0%}, workers"
         " elsewhere, batch-created queue", f"{d['big_drain_rate']:,}/s = {d['big_drain_workers']}"
         f" workers, WAL {d['wal_mb_s_at_big_drain']} MB/s"],
        ["derived", "the same database, steady single-statement creation",
         f"{d['big_steady_rate']:,}/s = {d['big_steady_workers']} workers, WAL"
         f" {d['wal_mb_s_at_big_steady']} MB/s"],
        ["derived", f"workers that fit max_connections {m['max_connections']} (minus"
         f" {CONNECTION_RESERVE} reserved) at {m['connections_per_worker_max']} each, without a"
         " pooler", f"{d['connection_limited_workers']} workers ="
         f" {d['connection_limited_rate']:,}/s"],
        ["derived", "NOTIFY bound from the commit latency alone (1 / commit)",
         f"≤ {d['notify_bound_from_commit']:,}/s"],
        ["derived", f"NOTIFY ceiling if a commit took {SLOW_COMMIT_MS:g} ms (lock held"
         f" {d['notify_hold_ms']:.2f} ms per call here, of which {m['commit_ms_p50']:.2f} ms"
         " commit)", f"≈ {d['notify_at_slow_commit']:,}/s, whatever the cores"],
    ]  # fmt: skip
    out += _table(["", "what", "value"], rows)
    return out


def write_markdown(results: dict[str, Any], path: Path, json_name: str) -> None:
    lines = _meta(results, json_name) + _drains(results) + _dead(results) + _capacity(results)
    if results.get("failures"):
        lines += ["## Failures", ""] + [f"- {f}" for f in results["failures"]] + [""]
    path.write_text("\n".join(lines).rstrip() + "\n", "utf-8")
