"""Invoke cost with a worker running (issue 14, goal 3, the worker's side).

bench/invoke.py measures the invoking side alone (no worker: nobody asleep, nobody
registered). Here one worker (`toolrelay worker --no-drain`) dispatches every call while the
same invoke variants run, twice: with the worker following migration 0018's sleep
protocol (it registers, so calls notify only while it sleeps) and with
`--no-sleep-protocol` (nobody registered: every call notifies, as before 0016). The
question is goal 3's: does nothing serialize all invokers, i.e. is fn_invoke_tool from 32
connections at least as fast as from 8, with the dispatcher there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench import invoke
from bench.constants import INVOKE_THREADS
from bench.context import Context
from bench.invoke import WIDE_THREADS, InvokeResult
from bench.latency import wait_listening
from bench.setup import admin, clear_invocations
from bench.workers import WorkerLaunch
from toolrelay.db import Database

PROTOCOLS = (("", ()), (", every call notifies", ("--no-sleep-protocol",)))
REGISTERED_SQL = "SELECT count(*) AS n FROM agents.dispatch_workers WHERE expires_at > now()"
REGISTER_TIMEOUT_S = 10.0
DRAIN_WAIT_S = 120.0  # for the worker to finish one variant's calls before the next
RUNNING_SQL = (
    "SELECT EXISTS (SELECT 1 FROM agents.tool_invocations WHERE status = 'running') AS busy"
)


class _KeepWorker:
    """The context as invoke._hammer sees it: its ``running = []`` must not hide the
    worker from the CPU timeline (the worker is the system under test here)."""

    def __init__(self, ctx: Context) -> None:
        object.__setattr__(self, "_ctx", ctx)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "running":
            setattr(self._ctx, name, value)


def _wait_registered(url: str, expected: bool) -> None:
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while time.monotonic() < deadline:
        with admin(url) as conn:
            row = conn.execute(REGISTERED_SQL).fetchone()
        if bool(row and row["n"]) == expected:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the worker's registration is not {'live' if expected else 'absent'}")


def _wait_drained(url: str) -> None:
    """Until the worker has finished every call: the table is not truncated under a
    running worker (TRUNCATE and its finish take their locks in opposite orders)."""
    deadline = time.monotonic() + DRAIN_WAIT_S
    while time.monotonic() < deadline:
        with admin(url) as conn:
            row = conn.execute(RUNNING_SQL).fetchone()
        if not (row and row["busy"]):
            return
        time.sleep(0.1)
    raise TimeoutError("the worker did not finish the calls of the last variant")


def run(ctx: Context, seconds: float) -> list[InvokeResult]:
    fx = ctx.fx
    db = Database(fx.url, pool_size=INVOKE_THREADS)
    variants: list[tuple[str, Callable[[], tuple[invoke.Call, invoke.Close]], int]] = [
        ("fn_invoke_tool", lambda: invoke._sql_call(fx), INVOKE_THREADS),
        ("fn_invoke_tool", lambda: invoke._sql_call(fx), WIDE_THREADS),
        ("Registry.invoke", lambda: invoke._registry_call(db, fx.owner), INVOKE_THREADS),
    ]
    results: list[InvokeResult] = []
    try:
        for label, options in PROTOCOLS:
            clear_invocations(fx.url)
            ctx.upstream.reset()
            launch = WorkerLaunch(
                fx, ctx.logs, ctx.home, drain=False, source=ctx.worker_source, extra=options
            )
            worker = launch.start(f"wake-w{len(results) // len(variants) + 1}")
            ctx.running = [worker]
            try:
                wait_listening(fx.url, worker)
                _wait_registered(fx.url, expected=not options)
                for name, make, threads_n in variants:
                    _wait_drained(fx.url)
                    name = f"{name}, worker running{label}"
                    keep: Any = _KeepWorker(ctx)
                    results.append(invoke._hammer(keep, name, make, seconds, threads_n))
            finally:
                usage = worker.stop()
                ctx.running = []
            if usage.returncode != 0:
                raise RuntimeError(f"worker exited {usage.returncode}:\n{worker.tail()}")
    finally:
        db.close()
    clear_invocations(fx.url)
    return results
