"""Worker processes (``python -m toolrelay.cli worker``) that the run starts, kills and stalls."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

RESTART_DELAY = 0.3  # seconds between a worker's death and its successor
STOP_TIMEOUT = 20.0  # seconds a worker gets to stop after SIGTERM


@dataclass
class Slot:
    index: int
    generation: int = 0
    process: asyncio.subprocess.Process | None = None
    log: IO[bytes] | None = None
    stalled: bool = False
    expected_exit: bool = False


@dataclass
class WorkerPool:
    """``size`` slots, each running one worker process at a time; logs go to ``log_dir``."""

    size: int
    env: Mapping[str, str]
    log_dir: Path
    lease_seconds: float
    concurrency: int
    module: str = "toolrelay.cli"  # or the deliberately broken toolrelay.chaos.unbound
    slots: list[Slot] = field(default_factory=list)
    events: Counter[str] = field(default_factory=Counter)
    exits: list[dict[str, object]] = field(default_factory=list)
    frozen_pids: set[int] = field(default_factory=set)  # every process ever stalled
    _watchers: set[asyncio.Task[None]] = field(default_factory=set)
    _closing: bool = False

    def __post_init__(self) -> None:
        self.slots = [Slot(i) for i in range(self.size)]
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def command(self, drain: bool = False) -> list[str]:
        cmd = [sys.executable, "-m", self.module, "worker"]
        cmd += [
            "--lease-seconds",
            f"{self.lease_seconds:g}",
            "--concurrency",
            str(self.concurrency),
        ]
        return [*cmd, "--drain"] if drain else cmd

    async def start(self, index: int) -> None:
        slot = self.slots[index]
        slot.generation += 1
        path = self.log_dir / f"worker-{index}-{slot.generation}.log"
        slot.log = path.open("wb")
        slot.process = await asyncio.create_subprocess_exec(
            *self.command(),
            env=dict(self.env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=slot.log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        slot.stalled = False
        slot.expected_exit = False
        self.events["started"] += 1
        task = asyncio.create_task(self._watch(slot, slot.process, slot.generation))
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _watch(
        self, slot: Slot, process: asyncio.subprocess.Process, generation: int
    ) -> None:
        """A worker that dies on its own (not killed by us) is recorded and replaced."""
        code = await process.wait()
        if slot.expected_exit or self._closing or slot.generation != generation:
            return
        self.events["unexpected_exit"] += 1
        self.exits.append({"slot": slot.index, "generation": generation, "code": code})
        await asyncio.sleep(RESTART_DELAY)
        if not self._closing and slot.generation == generation:
            await self.start(slot.index)

    def alive(self) -> list[int]:
        return [
            s.index
            for s in self.slots
            if s.process is not None and s.process.returncode is None and not s.stalled
        ]

    async def kill(self, index: int, restart: bool = True) -> None:
        """SIGKILL: the worker gets no chance to finish or hand anything back."""
        slot = self.slots[index]
        if slot.process is None or slot.process.returncode is not None:
            return
        slot.expected_exit = True
        with contextlib.suppress(ProcessLookupError):
            slot.process.send_signal(signal.SIGKILL)
        await slot.process.wait()
        self.events["killed"] += 1
        if restart:
            await asyncio.sleep(RESTART_DELAY)
            await self.start(index)

    def stall(self, index: int) -> None:
        """SIGSTOP: the process freezes (a long GC pause, a suspended VM) with work in flight."""
        slot = self.slots[index]
        if slot.process is not None and slot.process.returncode is None:
            slot.process.send_signal(signal.SIGSTOP)
            slot.stalled = True
            self.frozen_pids.add(slot.process.pid)
            self.events["stalled"] += 1

    def resume(self, index: int) -> None:
        slot = self.slots[index]
        if slot.process is not None and slot.process.returncode is None:
            slot.process.send_signal(signal.SIGCONT)
        slot.stalled = False

    async def stop_all(self, graceful: bool = True) -> None:
        """SIGTERM (after SIGCONT) every worker and wait; SIGKILL what does not stop.

        ``graceful=False`` SIGKILLs at once: a stopping worker hands back claims it holds,
        which is only safe to do when nothing is in flight.
        """
        self._closing = True
        for slot in self.slots:
            if slot.process is None or slot.process.returncode is not None:
                continue
            slot.expected_exit = True
            with contextlib.suppress(ProcessLookupError):
                slot.process.send_signal(signal.SIGCONT)
                slot.process.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT
        for slot in self.slots:
            if slot.process is None:
                continue
            try:
                await asyncio.wait_for(slot.process.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(signal.SIGKILL)
                await slot.process.wait()
                self.events["killed_at_stop"] += 1
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        for slot in self.slots:
            if slot.log is not None:
                slot.log.close()

    async def drain(self, timeout: float) -> tuple[int | None, float]:
        """Run one ``--drain`` worker to the end; returns its exit code (None: timed out)."""
        started = time.monotonic()
        with (self.log_dir / "worker-drain.log").open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                *self.command(drain=True),
                env=dict(self.env),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code: int | None = await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                process.send_signal(signal.SIGKILL)
                await process.wait()
                code = None
        return code, time.monotonic() - started


def worker_env(
    database_url: str, master_key: str, home: Path, unsafe_no_fencing: bool
) -> dict[str, str]:
    from toolrelay.chaos.config import UNSAFE_NO_FENCING_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLRELAY_")}
    env |= {
        "DATABASE_URL": database_url,
        "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1",
        "TOOLRELAY_MASTER_KEY": master_key,
        "TOOLRELAY_HOME": str(home),
        "PYTHONUNBUFFERED": "1",
    }
    if unsafe_no_fencing:
        env[UNSAFE_NO_FENCING_ENV] = "1"
    return env
