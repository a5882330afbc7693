"""Section 6 of RESULTS.md: invoke cost with a worker running (issue 14, goal 3, the
worker's side).

bench/invoke.py measures the invoking side alone (no worker: nobody asleep, nobody
registered). Here one worker (`toolrelay worker --no-drain`) dispatches every call while the
same invoke variants run, twice: with the worker following migration 0018's sleep
protocol (it registers, so calls notify only while it sleeps) and with
`--no-sleep-protocol` (nobody registered: every call notifies, as before 0016). The
question is goal 3's: does nothing serialize all invokers, i.e. is fn_invoke_tool from 32
connections at least as fast as from 8, with the dispatcher there. Counted as in invoke.py
(invoke.hammer), for 0.3 x Sizes.invoke_seconds per variant; the worker is the system under
test in ``cores``, and each variant starts once it has finished the previous one's calls.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.constants import INVOKE_THREADS
from bench.invoke import WIDE_THREADS, Call, Close, InvokeResult, hammer, registry_call, sql_call
from bench.session import Context
from bench.setup import clear_invocations, wait_until
from bench.workers import wait_listening
from toolrelay.db import Database

PROTOCOLS = (("", ()), (", every call notifies", ("--no-sleep-protocol",)))
REGISTERED_SQL = "SELECT count(*) AS n FROM agents.dispatch_workers WHERE expires_at > now()"
REGISTER_TIMEOUT_S = 10.0
DRAIN_WAIT_S = 120.0  # for the worker to finish one variant's calls before the next
RUNNING_SQL = (
    "SELECT EXISTS (SELECT 1 FROM agents.tool_invocations WHERE status = 'running') AS busy"
)


def _wait_registered(url: str, expected: bool) -> None:
    what = f"the worker's registration is not {'live' if expected else 'absent'}"
    wait_until(
        url, REGISTERED_SQL, lambda row: bool(row["n"]) == expected, what, REGISTER_TIMEOUT_S
    )


def _wait_drained(url: str) -> None:
    """Until the worker has finished every call: the table is not truncated under a
    running worker (TRUNCATE and its finish take their locks in opposite orders)."""
    what = "the worker did not finish the calls of the last variant"
    wait_until(url, RUNNING_SQL, lambda row: not row["busy"], what, DRAIN_WAIT_S)


def run(ctx: Context, seconds: float) -> list[InvokeResult]:
    fx = ctx.fx
    db = Database(fx.url, pool_size=INVOKE_THREADS)
    variants: list[tuple[str, Callable[[], tuple[Call, Close]], int]] = [
        ("fn_invoke_tool", lambda: sql_call(fx), INVOKE_THREADS),
        ("fn_invoke_tool", lambda: sql_call(fx), WIDE_THREADS),
        ("Registry.invoke", lambda: registry_call(db, fx.owner), INVOKE_THREADS),
    ]
    results: list[InvokeResult] = []
    try:
        for label, options in PROTOCOLS:
            clear_invocations(fx.url)
            ctx.upstream.reset()
            launch = ctx.launch(drain=False, extra=options)
            worker = launch.start(f"wake-w{len(results) // len(variants) + 1}")
            ctx.running = [worker]
            try:
                wait_listening(fx.url, worker)
                _wait_registered(fx.url, expected=not options)
                for name, make, threads_n in variants:
                    _wait_drained(fx.url)
                    name = f"{name}, worker running{label}"
                    results.append(hammer(ctx, name, make, seconds, threads_n))
            finally:
                usage = worker.stop()
                ctx.running = []
            if usage.returncode != 0:
                raise RuntimeError(f"worker exited {usage.returncode}:\n{worker.tail()}")
    finally:
        db.close()
    clear_invocations(fx.url)
    return results
