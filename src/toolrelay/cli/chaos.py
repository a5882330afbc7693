"""`toolrelay chaos`: run the dispatcher under faults and check that nothing was lost."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import typer

from toolrelay import logs
from toolrelay.cli.context import console, err_console


def chaos(
    invocations: int | None = typer.Option(
        None, min=0, help="How many invocations (default 10000; 1000 with --quick)."
    ),
    workers: int | None = typer.Option(None, min=2, help="Worker processes (default 4)."),
    concurrency: int = typer.Option(32, min=1, help="Calls in flight per worker."),
    lease_seconds: float | None = typer.Option(None, min=1, help="Workers' --lease-seconds."),
    create_seconds: float | None = typer.Option(
        None, min=0, help="Spread the invocations' creation over this many seconds."
    ),
    kill_every: float | None = typer.Option(
        None, min=0.5, help="Seconds between SIGKILLs of a random worker."
    ),
    stall_every: float | None = typer.Option(
        None, min=0.5, help="Seconds between SIGSTOPs of a random worker past its lease."
    ),
    db_restart: bool = typer.Option(
        False, help="Restart PostgreSQL once mid-run (local pg_ctlcluster or embedded pg_ctl)."
    ),
    quick: bool = typer.Option(False, help="The CI run: about 1,000 invocations, ~1 minute."),
    seed: int = typer.Option(1, help="Seed of every random choice (faults, upstream, inputs)."),
    report: Path = typer.Option(Path("chaos-report.json"), help="Where to write the JSON report."),
    out: Path = typer.Option(Path("chaos-out"), help="Directory for worker logs and events."),
    keep_database: bool = typer.Option(False, help="Keep the run's database for inspection."),
    unsafe_no_fencing: bool = typer.Option(
        False,
        help="Workers record results without lease fencing: a deliberately broken build that"
        " the checks must catch. Never use it for anything else.",
    ),
    unsafe_no_binding: bool = typer.Option(
        False,
        help="Workers skip the approval digest, fingerprint and gating checks: a deliberately"
        " broken build that requests_as_approved must catch. Never use it for anything else.",
    ),
    log_level: str = typer.Option("WARNING", help="The chaos driver's own log level."),
) -> None:
    """Run workers under faults against a misbehaving upstream, then check the invariants.

    Starts a fresh database (on DATABASE_URL's server, or an embedded one), an upstream,
    an OAuth token endpoint and canaries on loopback, and worker processes; kills and
    freezes workers while invocations run; checks that nothing was lost, no write was sent
    twice, no secret was stored or logged, and no blocked address was contacted.
    Exits 1 when any check fails.
    """
    from toolrelay.chaos.config import ChaosConfig
    from toolrelay.chaos.report import render, write_json
    from toolrelay.chaos.runner import run_chaos

    logs.configure(log_level)
    overrides: dict[str, Any] = {
        "invocations": invocations,
        "workers": workers,
        "lease_seconds": lease_seconds,
        "create_seconds": create_seconds,
        "kill_every": kill_every,
        "stall_every": stall_every,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    given |= {
        "concurrency": concurrency,
        "db_restart": db_restart,
        "seed": seed,
        "report_path": report,
        "out_dir": out,
        "keep_database": keep_database,
        "unsafe_no_fencing": unsafe_no_fencing,
        "unsafe_no_binding": unsafe_no_binding,
    }
    try:
        cfg = ChaosConfig.quick(**given) if quick else ChaosConfig(**given)
    except ValueError as exc:
        err_console.print(f"error: {exc}", markup=False)
        raise typer.Exit(code=2) from None
    if unsafe_no_fencing:
        err_console.print("warning: --unsafe-no-fencing: workers run WITHOUT lease fencing")
    if unsafe_no_binding:
        err_console.print("warning: --unsafe-no-binding: workers send what was NOT approved")
    console.print(
        f"chaos: {cfg.invocations} invocations, {cfg.workers} workers, lease"
        f" {cfg.lease_seconds:g} s, a SIGKILL every {cfg.kill_every:g} s, a stall every"
        f" {cfg.stall_every:g} s{', one database restart' if cfg.db_restart else ''}",
        markup=False,
    )
    result = asyncio.run(run_chaos(cfg))
    write_json(result, cfg.report_path)
    render(result, console)
    console.print(f"report: {cfg.report_path}; logs: {cfg.out_dir}/logs", markup=False)
    if not result.ok:
        raise typer.Exit(code=1)
