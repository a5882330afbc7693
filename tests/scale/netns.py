"""Hosts made of Linux network namespaces, and a private PostgreSQL that listens to them.

Layout (every address lives only inside what this module creates):

    root namespace                      namespace trhN (N = 1, 2, 3)
    trbr0 10.213.0.1/24 ── trhNh  ══veth══  trhNn 10.213.0.1N/24

The bridge address is local to the root namespace, so nothing is forwarded or routed
anywhere else; a host "loses its link" when its root-side veth goes down. ``Network.destroy``
removes every namespace, veth and the bridge, and runs even when a test fails. A lock file
keeps two test sessions on one machine from using the same names at once, and leftovers of
a run that was killed are removed (under the lock) before new ones are made.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import os
import pwd
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213.0.0/24"
GATEWAY = "10.213.0.1"  # the bridge: PostgreSQL and the upstream listen here
BRIDGE = "trbr0"
PREFIX = "trh"  # namespaces trh1.., veths trh1h (root side) / trh1n (namespace side)
COMMAND_TIMEOUT = 10.0  # seconds for any one `ip` command
LOCK_PATH = Path(tempfile.gettempdir()) / "toolrelay-netns.lock"
LOCK_TIMEOUT = 120.0  # seconds to wait for another session's network to go away


class NamespacesUnavailable(Exception):
    """Network namespaces cannot be made here; the message says why."""


async def run(*argv: str, timeout: float = COMMAND_TIMEOUT, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"{' '.join(argv)}: no answer within {timeout}s") from None
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err.decode().strip()}")
    return out.decode()


def host_address(index: int) -> str:
    return f"10.213.0.{10 + index}"


@dataclass
class Network:
    hosts: int
    namespaces: list[str] = field(default_factory=list)
    _lock: int | None = None

    @staticmethod
    def why_unavailable() -> str | None:
        if shutil.which("ip") is None:
            return "iproute2 is not installed (`apt-get install -y iproute2`)"
        if os.geteuid() != 0:
            return "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
        return None

    def namespace(self, index: int) -> str:
        return f"{PREFIX}{index}"

    def exec_prefix(self, index: int) -> list[str]:
        """Run a command inside host ``index`` (1-based)."""
        return ["ip", "netns", "exec", self.namespace(index)]

    async def create(self) -> None:
        """Raises NamespacesUnavailable when the very first namespace cannot be made."""
        reason = self.why_unavailable()
        if reason:
            raise NamespacesUnavailable(reason)
        await self._acquire_lock()
        await self._remove_leftovers()
        try:
            await run("ip", "netns", "add", self.namespace(1))
        except RuntimeError as exc:
            raise NamespacesUnavailable(f"`ip netns add` failed: {exc}") from None
        self.namespaces.append(self.namespace(1))
        await run("ip", "link", "add", BRIDGE, "type", "bridge", "forward_delay", "0")
        await run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        await run("ip", "link", "set", BRIDGE, "up")
        for index in range(1, self.hosts + 1):
            ns = self.namespace(index)
            if ns not in self.namespaces:
                await run("ip", "netns", "add", ns)
                self.namespaces.append(ns)
            outer, inner = f"{ns}h", f"{ns}n"
            await run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            await run("ip", "link", "set", inner, "netns", ns)
            await run("ip", "link", "set", outer, "master", BRIDGE, "up")
            await run(*self.exec_prefix(index), "ip", "link", "set", "lo", "up")
            await run(
                *self.exec_prefix(index), "ip", "addr", "add", f"{host_address(index)}/24",
                "dev", inner,
            )  # fmt: skip
            await run(*self.exec_prefix(index), "ip", "link", "set", inner, "up")

    async def cut(self, index: int) -> None:
        await run("ip", "link", "set", f"{self.namespace(index)}h", "down")

    async def restore(self, index: int) -> None:
        await run("ip", "link", "set", f"{self.namespace(index)}h", "up")

    async def destroy(self) -> list[str]:
        """Remove everything this network made; returns what could not be removed."""
        if self._lock is None:  # never got as far as making anything
            return []
        problems = await self._remove_leftovers()
        self.namespaces.clear()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                os.close(self._lock)
            self._lock = None
        return problems

    @staticmethod
    async def leftovers() -> tuple[list[str], list[str]]:
        """Namespaces and links in the root namespace that carry this module's names."""
        names = await run("ip", "netns", "list", check=False)
        links = await run("ip", "-o", "link", "show", check=False)
        spaces = [line.split()[0] for line in names.splitlines() if line.startswith(PREFIX)]
        ours = []
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            if name == BRIDGE or name.startswith(PREFIX):
                ours.append(name)
        return spaces, ours

    async def _remove_leftovers(self) -> list[str]:
        spaces, links = await self.leftovers()
        for name in spaces:  # deleting a namespace deletes the veth end inside it
            await run("ip", "netns", "del", name, check=False)
        for name in links:
            await run("ip", "link", "del", name, check=False)
        spaces, links = await self.leftovers()
        return spaces + links

    async def _acquire_lock(self) -> None:
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise RuntimeError(
                        f"{LOCK_PATH} stayed locked for {LOCK_TIMEOUT}s: another test session"
                        " is using the test network"
                    ) from None
                await asyncio.sleep(0.5)
        self._lock = fd


# --- a private PostgreSQL on the bridge address ---------------------------------------------


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class PrivatePostgres:
    """The pgserver wheel's binaries, run as the `pgserver` system user like pgserver does."""

    address: str
    trusted: str  # a CIDR allowed in without a password
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="toolrelay-netpg-")))
    port: int = 0
    user: str = "pgserver"

    @property
    def pgdata(self) -> Path:
        return self.root / "pgdata"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/{database}"

    def _bin(self, name: str) -> str:
        spec = importlib.util.find_spec("pgserver")  # without importing it: no side effects
        assert spec is not None and spec.submodule_search_locations, "pgserver is not installed"
        return str(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / name)

    async def _as_user(self, *argv: str, timeout: float = 60.0) -> None:
        proc = await asyncio.create_subprocess_exec(
            *argv, user=self.user, cwd=self.root,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"{argv[0]}: no answer within {timeout}s") from None
        if proc.returncode != 0:
            log = (self.root / "postgres.log").read_text() if self.has_log else ""
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {out.decode()}{log}")

    @property
    def has_log(self) -> bool:
        return (self.root / "postgres.log").exists()

    async def start(self) -> None:
        try:
            entry = pwd.getpwnam(self.user)
        except KeyError:  # what pgserver itself does when run as root
            await run("useradd", "-s", "/bin/bash", self.user)
            entry = pwd.getpwnam(self.user)
        self.root.chmod(0o755)
        os.chown(self.root, entry.pw_uid, entry.pw_gid)
        await self._as_user(
            self._bin("initdb"), "-D", str(self.pgdata), "--auth=trust", "-U", "postgres",
            "--encoding=utf8", "--no-sync",
        )  # fmt: skip
        with (self.pgdata / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.trusted} trust\n")
        with (self.pgdata / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '{self.address}'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 100\n"
            )
        self.port = free_port(self.address)
        await self._as_user(
            self._bin("pg_ctl"), "-D", str(self.pgdata), "-l", str(self.root / "postgres.log"),
            "-o", f"-p {self.port}", "-w", "-t", "30", "start",
        )  # fmt: skip

    async def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                await self._as_user(
                    self._bin("pg_ctl"), "-D", str(self.pgdata), "-m", "immediate", "-w",
                    "-t", "20", "stop", timeout=30.0,
                )  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)
