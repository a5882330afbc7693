"""Child processes (with their CPU time and peak RSS) and machine-wide CPU sampling.

The one way bench/ starts a process (``Child``, ``python_module``; ready when ``wait_http``
says so) and reads CPU and memory from /proc: ``Timeline`` samples every 100 ms, for windows
known only afterwards (from the database's timestamps); ``CpuGroups`` (``cpu_of`` /
``cpu_between``) reads a window's two edges, for windows the harness opens and closes itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bench.constants import CHILD_POLL_S, REPO_DIR

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # ticks per second in /proc/<pid>/stat
KIB = 1024
MIB = 1024 * 1024


@dataclass
class Usage:
    """What a finished child cost: wall seconds, CPU seconds, peak RSS (VmHWM)."""

    wall_s: float
    cpu_s: float
    max_rss_mb: float  # VmHWM as last polled before exit
    returncode: int


class Child:
    """A child process whose resource usage is read with wait4 when it exits."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        capture_stdout: bool = False,
        cwd: Path = REPO_DIR,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("wb")
        self.popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture_stdout else self._log,
            stderr=self._log,
        )
        self.started = time.monotonic()
        self.usage: Usage | None = None
        self.hwm_mb = 0.0  # VmHWM as last polled: peak RSS since exec (ru_maxrss is not:
        # it keeps the forked harness's peak from before exec)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def readline(self) -> str:
        assert self.popen.stdout is not None
        return self.popen.stdout.readline().decode("utf-8", "replace").strip()

    def poll(self) -> Usage | None:
        """The usage once exited (reaped here, with its rusage), else None."""
        if self.usage is not None:
            return self.usage
        pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        code = os.waitstatus_to_exitcode(status)
        self.popen.returncode = code  # reaped: Popen must not wait for it again
        self.usage = Usage(
            wall_s=time.monotonic() - self.started,
            cpu_s=rusage.ru_utime + rusage.ru_stime,
            max_rss_mb=self.hwm_mb,
            returncode=code,
        )
        self._log.close()
        return self.usage

    def wait(self, timeout: float) -> Usage:
        deadline = time.monotonic() + timeout
        while True:
            self.sample_hwm()
            usage = self.poll()
            if usage is not None:
                return usage
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.name} did not finish within {timeout:g} s")
            time.sleep(CHILD_POLL_S)

    def stop(self, timeout: float = 15.0) -> Usage:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            while self.poll() is None:
                time.sleep(CHILD_POLL_S)

    def sample_hwm(self) -> None:
        """Poll VmHWM; called by the Timeline every tick while the child runs."""
        if self.usage is not None:
            return
        self.hwm_mb = max(self.hwm_mb, peak_rss_mb(self.pid) or 0.0)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def wait_all(children: Sequence[Child], timeout: float) -> list[Usage]:
    deadline = time.monotonic() + timeout
    while True:
        for child in children:
            child.sample_hwm()
        usages = [child.poll() for child in children]
        if all(u is not None for u in usages):
            return [u for u in usages if u is not None]
        if time.monotonic() > deadline:
            for child in children:
                child.kill()
            raise TimeoutError(f"children did not finish within {timeout:g} s")
        time.sleep(CHILD_POLL_S)


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


HTTP_POLL_S = 0.05  # between two readiness requests


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on now, for a child server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, child: Child, timeout: float, statuses: tuple[int, ...] = (200,)) -> None:
    """Until GET ``url`` answers with one of ``statuses``; RuntimeError when ``child`` exits
    first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"{child.name} exited: {child.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2.0) as resp:
                status = resp.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except OSError:
            status = 0  # not listening yet
        if status in statuses:
            return
        time.sleep(HTTP_POLL_S)
    raise RuntimeError(f"{child.name} did not answer {url} within {timeout:g} s: {child.tail()}")


@dataclass
class CpuSample:
    busy: float  # ticks
    total: float  # ticks
    at: float  # monotonic seconds


def cpu_sample() -> CpuSample:
    with open("/proc/stat", encoding="ascii") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # without guest time, already counted in user
    return CpuSample(busy=total - idle, total=total, at=time.monotonic())


def busy_cores(start: CpuSample, end: CpuSample) -> float:
    """Average cores busy between two samples (all processes of the machine)."""
    total = end.total - start.total
    if total <= 0:
        return 0.0
    return (end.busy - start.busy) / total * (os.cpu_count() or 1)


def noise_sample(seconds: float) -> float:
    """Cores busy while this benchmark runs nothing: other people's load."""
    start = cpu_sample()
    time.sleep(seconds)
    return busy_cores(start, cpu_sample())


def loadavg() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return (round(one, 2), round(five, 2), round(fifteen, 2))


def memory_total_mb() -> float:
    with open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * KIB / MIB
    return 0.0


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


# --- one process, from /proc: the only readers of /proc/<pid>/stat and status in bench/ ---


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far; None once it is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def peak_rss_mb(pid: int) -> float | None:
    """VmHWM: the peak resident memory since exec (ru_maxrss is not: it keeps the forking
    process's peak from before exec); None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * KIB / MIB
    except OSError:
        pass
    return None


def cpu_of(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds per pid, for the pids still there."""
    now = {pid: cpu_seconds(pid) for pid in pids}
    return {pid: s for pid, s in now.items() if s is not None}


def cpu_between(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU seconds used between two ``cpu_of`` readings by pids present in both (a process
    that exits or starts in between does not count, so a sum never runs backwards)."""
    return sum(s - before[pid] for pid, s in after.items() if pid in before)


class CpuGroups:
    """CPU seconds of named process groups (each a callable listing its pids) read at a
    window's two edges: ``used(before, after)`` counts, as Timeline does, only pids present
    at both."""

    def __init__(self, **groups: Callable[[], Sequence[int]]) -> None:
        self.groups = groups

    def sample(self) -> dict[str, dict[int, float]]:
        return {name: cpu_of(pids()) for name, pids in self.groups.items()}

    @staticmethod
    def used(
        before: Mapping[str, Mapping[int, float]], after: Mapping[str, Mapping[int, float]]
    ) -> dict[str, float]:
        return {name: cpu_between(before[name], after[name]) for name in after}


def children_of(parent: int) -> list[int]:
    """Processes whose parent is ``parent`` (e.g. the backends of a postmaster)."""
    pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return [pid for pid in pids if parent_pid(pid) == parent]


@dataclass
class _Tick:
    at: float  # epoch seconds
    busy: float  # machine ticks busy so far
    total: float  # machine ticks so far
    groups: dict[str, float]  # cumulative CPU seconds per group


class Timeline(threading.Thread):
    """Samples machine CPU and the CPU of process groups, so that any window can be read.

    A group is a callable listing its pids (read at each sample: backends come and go);
    its counter only adds what pids present in two consecutive samples used in between,
    so a process that exits does not make it run backwards.
    """

    def __init__(self, groups: Mapping[str, Callable[[], Sequence[int]]], interval: float) -> None:
        super().__init__(daemon=True, name="cpu-timeline")
        self.groups = dict(groups)
        self.interval = interval
        self.ticks: list[_Tick] = []
        self._last: dict[str, dict[int, float]] = {name: {} for name in self.groups}
        self._sums: dict[str, float] = dict.fromkeys(self.groups, 0.0)
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.hooks: list[Callable[[], object]] = []  # run at every tick (e.g. VmHWM polls)

    def add(self, name: str, pids: Callable[[], Sequence[int]]) -> None:
        with self._lock:
            self.groups[name] = pids
            self._last[name] = {}
            self._sums[name] = 0.0

    def _sample(self) -> None:
        for hook in self.hooks:
            hook()
        machine = cpu_sample()
        with self._lock:
            for name, pids in self.groups.items():
                now = cpu_of(pids())
                self._sums[name] += cpu_between(self._last[name], now)
                self._last[name] = now
            self.ticks.append(_Tick(time.time(), machine.busy, machine.total, dict(self._sums)))

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Average cores used between two epoch times: 'machine' and each group."""
        with self._lock:
            ticks = list(self.ticks)
        inside = [t for t in ticks if start <= t.at <= end]
        if len(inside) < 2:
            return {}
        first, last = inside[0], inside[-1]
        span = last.at - first.at
        cpus = os.cpu_count() or 1
        out = {"machine": (last.busy - first.busy) / max(1, last.total - first.total) * cpus}
        for name in last.groups:
            used = last.groups[name] - first.groups.get(name, 0.0)
            out[name] = used / span
        return {k: round(v, 3) for k, v in out.items()}


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


class ServerProcesses:
    """A server's main process and its children; follows the server across a restart
    (a new main process with the same command line), which shared machines do see."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cmdline = _cmdline(pid)
        self.restarts = 0

    def __call__(self) -> list[int]:
        if _cmdline(self.pid) != self.cmdline:
            for entry in os.listdir("/proc"):
                if entry.isdigit() and _cmdline(int(entry)) == self.cmdline:
                    self.pid = int(entry)
                    self.restarts += 1
                    break
            else:
                return []
        return [self.pid, *children_of(self.pid)]


class DatabaseBackends:
    """The PostgreSQL processes working for the benchmark's own databases: the server's
    children whose command line names one of them (backends, autovacuum workers). Other
    people's databases on a shared server are left out, and so are the shared background
    processes (WAL writer, checkpointer), so this undercounts a little; ``postgres`` counts
    everything."""

    def __init__(self, server: Callable[[], list[int]], names: Sequence[str]) -> None:
        self.server = server
        self.names = [f" {name} ".encode() for name in names]  # as the process title has it

    def __call__(self) -> list[int]:
        found = []
        for pid in self.server()[1:]:  # the first is the postmaster itself
            line = _cmdline(pid).replace(b"\0", b" ") + b" "
            if any(name in line for name in self.names):
                found.append(pid)
        return found
