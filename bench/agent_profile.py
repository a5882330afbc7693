"""Where the serve process's CPU goes on the agent path: ``python -m bench.agent_path
--profile`` runs py-spy on it through each door's 16-session window.

py-spy (``--gil``: only the thread holding the GIL, so a sample is Python CPU being spent,
not a thread waiting) samples the serve child at RATE_HZ and writes collapsed stacks to
bench/out/agent-path-<door>.pyspy.txt. The summary turns the inclusive samples of each of
STEPS into milliseconds of the serve process's Python CPU per call (samples / rate / calls
made in the window); the steps overlap where one runs inside another (the route holds the
invoke), so they are not a sum.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.profile import inclusive_samples, py_spy

RATE_HZ = 250
# Inclusive samples of these frames (function name as py-spy prints it), per call.
STEPS = {
    "MCP SDK: session manager to handler": ("StreamableHTTPSessionManager.handle_request",),
    "API route (FastAPI, its dependencies)": ("APIRoute.handle",),
    "token check (Authenticator.authenticate)": (
        "Authenticator.authenticate",
        "Authenticator.authenticate_async",
    ),
    "invoke (Registry.call / .invoke)": (
        "Registry.call",
        "Registry.call_async",
        "Registry.invoke",
        "Registry.invoke_async",
    ),
    "  of which input validation": ("validate_input",),
    "read after the wake (Registry.get_invocation)": ("Registry.get_invocation",),
    "worker: a call from claim to outcome (Worker._handle)": ("Worker._handle",),
    "worker: the hand-off's read (Worker._flush_adopted)": ("Worker._flush_adopted",),
    "worker: claim (DispatchStore.claim)": ("DispatchStore.claim",),
    "worker: mark sent (Worker._flush_sent)": ("Worker._flush_sent",),
    "worker: record results (Worker._flush_results)": ("Worker._flush_results",),
    "HTTP exchange with the upstream (http.send)": ("send",),
    "logging (Logger.handle)": ("Logger.handle",),
    "thread hand-offs (anyio run_sync_in_worker_thread)": (
        "AsyncIOBackend.run_sync_in_worker_thread",
    ),
    "psycopg (anywhere)": ("BaseCursor._execute_gen", "AsyncCursor.execute"),
}


def record(pid: int, seconds: float, path: Path) -> subprocess.Popen[bytes] | None:
    """py-spy attached to ``pid`` for ``seconds``; None without py-spy."""
    spy = py_spy()
    if spy is None:
        return None
    argv = [spy, "record", "--pid", str(pid), "--gil", "--rate", str(RATE_HZ), "--format",
            "raw", "--duration", str(int(seconds)), "--nonblocking", "--output", str(path)]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarize(path: Path, calls: int) -> dict[str, float]:
    """Milliseconds of Python CPU per call, per step, and ``all`` (every sample)."""
    total, inclusive = inclusive_samples(path)

    def per_call(samples: int) -> float:
        return round(samples / RATE_HZ / max(calls, 1) * 1000, 3)

    steps = {label: per_call(sum(inclusive[n] for n in names)) for label, names in STEPS.items()}
    return {"all": per_call(total), **steps}
