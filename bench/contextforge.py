"""A peer on the agent path: IBM's ContextForge MCP gateway, serving the same tool over MCP.

``python -m bench.contextforge`` installs it (once), starts it, registers the tool, makes a
few calls with agent_path's client (the official MCP SDK's, over streamable HTTP) and stops
it: a smoke test of the setup. ``python -m bench.agent_path`` measures it beside toolrelay's
MCP door (``--no-peer`` leaves it out): same client, same echo upstream, alternating rounds.
What it costs per call: c=1 p50/p99, 16 sessions' calls/s, its process's CPU per call.

- Install: its own venv outside the repository, ``~/.cache/toolrelay-bench/contextforge-1.0.7``
  (``python3.11 -m venv``, ``pip install mcp-contextforge-gateway==1.0.7``), reused when
  present. When that cannot be done (no Python 3.11, no package index) ``Unavailable`` says
  why, and the bench prints it as its skip line.
- Start: ``mcpgateway --host 127.0.0.1 --port P``: one uvicorn process, as ``toolrelay serve``
  is, in a scratch directory, so its default database (SQLite, ``sqlite:///./mcp.db``) lands
  there. Its environment is not the harness's (no ``DATABASE_URL``, nothing of toolrelay's):
  PATH, HOME (the scratch directory), ``SETTINGS`` below, and fresh random secrets (it
  refuses a default or weak JWT key).
- Register, as its platform admin (a JWT from its own ``mcpgateway.utils.create_jwt_token``,
  the way its docs mint a test token): a REST tool that GETs the upstream with ``n`` in the
  query, as toolrelay's read tool does, with the same ``X-Api-Key`` header (stored
  encrypted, as its ``authheaders`` auth), marked read-only; a virtual server exposing it, whose MCP door is ``/servers/<id>/mcp``; one API
  token per session (``POST /tokens``: stored, checked per request, as toolrelay's are).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.constants import API_KEY_HEADER, API_KEY_PREFIX, API_KEY_SECRET, READ_TOOL_KEY
from bench.procs import Child, free_port, wait_http

VERSION = "1.0.7"
NAME = f"ContextForge {VERSION}"
PACKAGE = f"mcp-contextforge-gateway=={VERSION}"
VENV = Path.home() / ".cache" / "toolrelay-bench" / f"contextforge-{VERSION}"
INSTALLED = VENV / ".installed"  # written once pip succeeded: a half-made venv is redone
INSTALL_TIMEOUT_S = 900.0
START_TIMEOUT_S = 120.0  # its first start creates the schema (alembic) and the admin
ADMIN = "admin@example.com"
SETTINGS = {
    "SSRF_ALLOW_LOCALHOST": "true",  # the upstream is on 127.0.0.1 (toolrelay: its egress allow)
    "RATE_LIMITING_ENABLED": "false",  # 100 requests/min for MCP by default (toolrelay: raised)
    "MCPGATEWAY_CATALOG_ENABLED": "false",  # no catalog of public MCP servers to load
    "PLATFORM_ADMIN_EMAIL": ADMIN,
}


class Unavailable(Exception):
    """ContextForge cannot be installed here; the message says why."""


def install(log_dir: Path) -> Path:
    """The venv's ``mcpgateway`` script, installing it first when needed."""
    script = VENV / "bin" / "mcpgateway"
    if INSTALLED.exists() and script.exists():
        return script
    python = shutil.which("python3.11")
    if python is None:
        raise Unavailable(f"no python3.11 on PATH ({PACKAGE} is installed with Python 3.11)")
    shutil.rmtree(VENV, ignore_errors=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    for name, argv in (
        ("venv", [python, "-m", "venv", str(VENV)]),
        ("pip", [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet",
                 "--disable-pip-version-check", "--timeout", "30", "--retries", "1", PACKAGE]),
    ):  # fmt: skip
        child = Child(f"contextforge-{name}", argv, dict(os.environ), log_dir / f"cf-{name}.log")
        usage = child.wait(INSTALL_TIMEOUT_S)
        if usage.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            last = " | ".join(child.tail(2).splitlines())
            raise Unavailable(f"{name} failed (exit {usage.returncode}): {last}")
    INSTALLED.write_text(PACKAGE + "\n")
    return script


@dataclass
class Peer:
    """A running ContextForge: ``f"{base}/mcp"`` is its virtual server's MCP door."""

    pid: int  # its process (with procs.ServerProcesses: and its children, if any)
    base: str
    tokens: list[str]  # bearer tokens (Authorization header), one per session
    tool: str  # the tool's name on that door

    @property
    def mcp_url(self) -> str:
        return f"{self.base}/mcp"


def _request(url: str, token: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {token}"})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30.0) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{req.get_method()} {url}: {exc.code} {exc.read()[:500]!r}") from exc


def _admin_token(secret: str, scratch: Path) -> str:
    argv = [str(VENV / "bin" / "python"), "-m", "mcpgateway.utils.create_jwt_token",
            "--username", ADMIN, "--exp", "240", "--secret", secret]  # fmt: skip
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(scratch), "JWT_SECRET_KEY": secret}
    child = Child("contextforge-token", argv, env, scratch / "cf-token.log", True, cwd=scratch)
    lines = [child.readline() for _ in range(20)]
    if child.wait(60.0).returncode != 0:
        raise RuntimeError(f"create_jwt_token failed: {child.tail()}")
    found = [line for line in lines if line.startswith("eyJ")]
    if not found:
        raise RuntimeError(f"create_jwt_token printed no token: {lines}")
    return found[0]


def _register(pid: int, url: str, admin: str, upstream_url: str, sessions: int) -> Peer:
    """The tool, the virtual server exposing it, one API token per session."""
    tool = _request(f"{url}/tools", admin, {"tool": {
        "name": READ_TOOL_KEY, "description": "Benchmark GET", "url": upstream_url,
        "integration_type": "REST", "request_type": "GET",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},
                         "required": ["n"]},
        "annotations": {"readOnlyHint": True},
        "auth_type": "authheaders",
        "auth_headers": [{"key": API_KEY_HEADER, "value": API_KEY_PREFIX + API_KEY_SECRET}],
        "visibility": "public",
    }})  # fmt: skip
    server = _request(f"{url}/servers", admin, {"server": {
        "name": "bench", "description": "the benchmark's tool", "associated_tools": [tool["id"]],
        "visibility": "public",
    }})  # fmt: skip
    tokens = [
        _request(f"{url}/tokens", admin, {"name": f"session-{i}", "expires_in_days": 1})[
            "access_token"
        ]
        for i in range(sessions)
    ]
    # its MCP name is a slug of ours: bench.get -> bench-get
    return Peer(pid, f"{url}/servers/{server['id']}", tokens, str(tool["name"]))


@contextmanager
def running(upstream_url: str, port: int, scratch: Path, sessions: int) -> Iterator[Peer]:
    """ContextForge on 127.0.0.1:``port`` with the tool registered; stopped on the way out.

    Raises ``Unavailable`` when it cannot be installed, RuntimeError when it does not start.
    """
    script = install(scratch)
    home = scratch / "contextforge"
    home.mkdir(exist_ok=True)
    secret = secrets.token_hex(32)
    env = SETTINGS | {
        "PATH": os.environ.get("PATH", ""), "HOME": str(home),
        "JWT_SECRET_KEY": secret, "AUTH_ENCRYPTION_SECRET": secrets.token_hex(32),
        "PLATFORM_ADMIN_PASSWORD": secrets.token_urlsafe(16),
    }  # fmt: skip
    argv = [str(script), "--host", "127.0.0.1", "--port", str(port)]
    child = Child("contextforge", argv, env, scratch / "contextforge.log", cwd=home)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", child, START_TIMEOUT_S)
        yield _register(child.pid, url, _admin_token(secret, home), upstream_url, sessions)
    finally:
        child.stop()


if __name__ == "__main__":
    from bench.agent_path import sequential
    from bench.upstream import UpstreamProcess

    work = Path(tempfile.mkdtemp(prefix="toolrelay-contextforge-"))
    upstream = UpstreamProcess(dict(os.environ), work / "upstream.log")
    try:
        with running(upstream.url, free_port(), work, 2) as peer:
            print(f"{NAME}: {peer.mcp_url}, tool {peer.tool!r}")
            times = asyncio.run(sequential("mcp", peer.base, peer.tokens[0], 20, 5, peer.tool))
            print(f"20 calls after 5, answers checked: p50 {statistics.median(times):.1f} ms")
    except Unavailable as exc:
        print(f"{NAME}: skipped, {exc}")
        sys.exit(0)
    finally:
        upstream.stop()
        shutil.rmtree(work, ignore_errors=True)
