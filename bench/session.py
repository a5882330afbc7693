"""One ``python -m bench`` session: fresh databases, the upstream, the CPU timeline, the
context every phase gets; all torn down at the end."""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import peer
from bench.constants import PROCESS_START_TIMEOUT_S, REPO_DIR, Sizes
from bench.procs import Child, ServerProcesses, Timeline, memory_total_mb
from bench.setup import Fixture, postmaster_of, provision, scratch_server, server_version
from bench.upstream import UpstreamProcess
from bench.workers import WorkerLaunch

TIMELINE_INTERVAL_S = 0.1  # CPU and VmHWM sampling period
Say = Callable[[str], None]


@dataclass
class Context:
    """What every phase of ``python -m bench`` needs: the database and fixture, the upstream,
    where logs go, the CPU timeline and which children it counts as the system under test."""

    sizes: Sizes
    quick: bool
    fx: Fixture
    peer_url: str
    upstream: UpstreamProcess
    logs: Path
    home: Path
    timeline: Timeline
    running: list[Child] = field(default_factory=list)  # the timeline's "system under test"
    worker_source: Path | None = None  # the src/ the workers run: a snapshot, or --worker-src

    def launch(self, drain: bool = True, extra: tuple[str, ...] = ()) -> WorkerLaunch:
        """Workers of this run (from its copy of src/), with more `toolrelay worker` options."""
        fx, source = self.fx, self.worker_source
        return WorkerLaunch(fx, self.logs, self.home, drain=drain, source=source, extra=extra)

    def sample_memory(self) -> None:
        for child in list(self.running):
            child.sample_hwm()

    def sut_pids(self) -> list[int]:
        return [child.pid for child in self.running if child.usage is None]

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Average cores over an epoch window: machine, system under test, upstream, postgres."""
        return self.timeline.cores(start, end)


def machine(pg_url: str, pg_source: str) -> dict[str, Any]:
    cpu = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(memory_total_mb() / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgres": server_version(pg_url),
        "postgres_source": pg_source,
    }


def snapshot_source(into: Path) -> Path:
    """Copy src/toolrelay as it is now; the workers run from the copy, so edits made to the
    work tree during a run (a shared machine) cannot change or break what is measured."""
    shutil.copytree(
        REPO_DIR / "src" / "toolrelay",
        into / "toolrelay",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    argv = [sys.executable, "-c", "import toolrelay.cli.main"]
    env = dict(os.environ, PYTHONPATH=str(into))
    check = Child("import-check", argv, env, into.parent / "import-check.log")
    if check.wait(PROCESS_START_TIMEOUT_S).returncode != 0:
        raise RuntimeError(f"src/ does not import as it is now:\n{check.tail(30)}")
    return into


def source_digest(root: Path) -> str:
    digest = hashlib.sha1()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".sql") and "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def git_state() -> str:
    """The commit measured, and whether the work tree had local changes under src/."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO_DIR, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "src")
    return f"{head}{' + uncommitted changes in src/' if dirty else ''}"


def stop_all(
    ctx: Context | None, timeline: Timeline, upstream: UpstreamProcess | None, ok: bool, say: Say
) -> None:
    """Stop every process a session started, in order; one failed step must not skip the
    rest (the databases and the server are scratch_server's)."""
    cleanups: list[Callable[[], object]] = []
    if ctx is not None:
        cleanups += [child.kill for child in ctx.running]
    if timeline.is_alive():
        cleanups.append(timeline.stop)
    if upstream is not None:
        cleanups.append(upstream.stop if ok else upstream.child.kill)
    for cleanup in cleanups:
        try:
            cleanup()
        except Exception as exc:
            say(f"cleanup failed: {exc!r}")


@contextmanager
def open_session(
    sizes: Sizes, quick: bool, say: Say, worker_src: Path | None = None, keep_logs: bool = False
) -> Iterator[tuple[Context, dict[str, Any]]]:
    """Yields the context and a description of the machine and code; cleans up afterwards.

    The workers run from ``worker_src`` when given, else from a snapshot of src/ taken now.
    """
    with scratch_server("toolrelay-bench-", say, keep_logs) as server:
        scratch = server.scratch
        logs, home = scratch / "logs", scratch / "home"
        logs.mkdir()
        home.mkdir()
        code = {"git": git_state(), "worker_src": str(worker_src) if worker_src else "snapshot"}
        source = worker_src.resolve() if worker_src else snapshot_source(scratch / "src")
        code["src_sha1"] = source_digest(source / "toolrelay")
        main_url, peer_url = server.database("main"), server.database("peer")
        upstream: UpstreamProcess | None = None
        timeline = Timeline({}, TIMELINE_INTERVAL_S)
        ctx: Context | None = None
        ok = False
        try:
            upstream = UpstreamProcess(dict(os.environ), logs / "upstream.log")
            fx = provision(main_url, upstream.url)
            asyncio.run(peer.apply_schema(peer_url))
            ctx = Context(sizes, quick, fx, peer_url, upstream, logs, home, timeline)
            ctx.worker_source = source
            upstream_pid = upstream.child.pid
            timeline.add("sut", ctx.sut_pids)
            timeline.hooks.append(ctx.sample_memory)
            timeline.add("upstream", lambda: [upstream_pid])
            timeline.add("harness", lambda: [os.getpid()])
            postmaster = postmaster_of(main_url)
            if postmaster is not None:
                timeline.add("postgres", ServerProcesses(postmaster))
            timeline.start()
            yield ctx, machine(main_url, server.source) | {"code": code}
            ok = True
        finally:
            stop_all(ctx, timeline, upstream, ok, say)
