"""The worker in a private network namespace, with private addresses on its loopback.

``unshare --net`` gives a child process a network namespace of its own that holds nothing but
``lo``. The child (this module run with ``-m``) brings ``lo`` up, adds the private addresses a
test needs (10.0.0.5, 169.254.169.254, ...), starts stand-in internal services on them, runs
``toolrelay worker --drain`` and prints what every service saw. So a broken guard is seen (a
service counts the connection) and nothing can leave the machine: the namespace has no other
interface and no route.

The database is reached over a Unix socket, which works across network namespaces; when
DATABASE_URL is TCP, ``unix_database_url`` relays a socket in a temporary directory to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.pgtest import create_database, drop_database
from tests.scale.netns import Network, run
from toolrelay.db import migrate
from toolrelay.dispatch.executor import INVOCATION_HEADER

ROOT = Path(__file__).resolve().parents[2]
WORKER_TIMEOUT = 90.0  # seconds for `toolrelay worker --drain` to finish
CHILD_TIMEOUT = WORKER_TIMEOUT + 30.0
RELAY_CHUNK = 65536  # bytes


# --- the worker, as its command line runs it ------------------------------------------------


def worker_command() -> list[str]:
    return [
        sys.executable, "-m", "toolrelay.cli", "worker", "--drain", "--log-level", "DEBUG",
        "--lease-seconds", "5", "--poll-interval", "0.2",
    ]  # fmt: skip


async def run_worker(env: dict[str, str]) -> tuple[int | None, str]:
    """``toolrelay worker --drain`` with ``env`` added; its exit code and all it logged."""
    home = tempfile.mkdtemp(prefix="toolrelay-home-")
    proc = await asyncio.create_subprocess_exec(
        *worker_command(),
        env=os.environ | {"TOOLRELAY_HOME": home} | env,
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), WORKER_TIMEOUT)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return proc.returncode, (out + err).decode("utf-8", "replace")


@pytest.fixture
def worker_database(admin_url: str) -> Iterator[str]:
    """A database of its own for a worker process: --drain drains whatever a database holds."""
    url = create_database(admin_url, prefix="toolrelay_worker")
    migrate(url)
    yield url
    drop_database(admin_url, url)


# --- the parent side ------------------------------------------------------------------------


async def why_unavailable() -> str | None:
    """Why no private network namespace can be made here, or None."""
    reason = Network.why_unavailable()
    if reason is None and shutil.which("unshare") is None:
        reason = "util-linux's unshare is not installed"
    if reason is None:
        try:
            await run("unshare", "--net", "true")
        except RuntimeError as exc:
            reason = f"`unshare --net` does not work here: {exc}"
    return reason


@dataclass
class ServiceSpec:
    """An HTTP service inside the namespace. Any path answers JSON naming the service, but
    ``/go?to=URL`` redirects there (an open redirect) and ``/hop`` redirects to ``/data``."""

    name: str
    address: str
    port: int


@dataclass
class Seen:
    connections: int = 0
    invocations: list[str] = field(default_factory=list)  # X-Toolrelay-Invocation per request
    paths: list[str] = field(default_factory=list)


@dataclass
class Report:
    services: dict[str, Seen]
    returncode: int | None
    log: str  # everything the worker wrote


async def run_private(
    addresses: list[str], services: list[ServiceSpec], worker_env: dict[str, str]
) -> Report:
    """Run the worker in a new network namespace among ``services``; what happened."""
    config = {
        "addresses": addresses,
        "services": [asdict(s) for s in services],
        "env": worker_env,
    }
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--net", sys.executable, "-m", "tests.security.private_net",
        cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(config).encode()), CHILD_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"the namespaced child exited {proc.returncode}: {err.decode()}")
    data = json.loads(out)
    return Report(
        services={name: Seen(**seen) for name, seen in data["services"].items()},
        returncode=data["returncode"],
        log=data["log"],
    )


@contextlib.asynccontextmanager
async def unix_database_url(url: str) -> AsyncIterator[str]:
    """``url`` as a process in another network namespace reaches it: over a Unix socket."""
    params = conninfo_to_dict(url)
    host = str(params.get("host") or "")
    if not host or host.startswith("/"):
        yield url  # already a Unix socket
        return
    port = str(params.get("port") or 5432)
    directory = tempfile.mkdtemp(prefix="toolrelay-relay-")

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_unix_server(relay, path=f"{directory}/.s.PGSQL.{port}")
    try:
        yield make_conninfo(url, host=directory, port=port)
    finally:
        server.close()
        await server.wait_closed()
        shutil.rmtree(directory, ignore_errors=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(RELAY_CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


# --- the child, inside the namespace --------------------------------------------------------


def _require_private_namespace() -> None:
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"]:
        raise SystemExit(f"refusing to run: not a private network namespace ({interfaces})")


async def _serve(spec: ServiceSpec, seen: Seen) -> asyncio.AbstractServer:
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        seen.invocations.append(request.headers.get(INVOCATION_HEADER, ""))
        seen.paths.append(request.path)
        if request.path in ("/go", "/hop"):
            target = request.query["to"] if request.path == "/go" else "/data"
            return web.Response(status=302, headers={"Location": target})
        return web.json_response({"service": spec.name, "path": request.path})

    http = web.Server(handle)

    def connection() -> asyncio.BaseProtocol:
        seen.connections += 1
        return http()

    loop = asyncio.get_running_loop()
    return await loop.create_server(connection, spec.address, spec.port)


async def _child(config: dict[str, Any]) -> dict[str, Any]:
    _require_private_namespace()
    await run("ip", "link", "set", "lo", "up")
    for address in config["addresses"]:
        await run("ip", "addr", "add", f"{address}/32", "dev", "lo")
    specs = [ServiceSpec(**s) for s in config["services"]]
    seen = {spec.name: Seen() for spec in specs}
    servers = [await _serve(spec, seen[spec.name]) for spec in specs]
    try:
        returncode, log = await run_worker(config["env"])
    finally:
        for server in servers:
            server.close()
    services = {name: asdict(saw) for name, saw in seen.items()}
    return {"services": services, "returncode": returncode, "log": log}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_child(json.loads(sys.stdin.read())))))
