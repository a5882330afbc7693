"""The MCP SDK's own cost per ``tools/call``: the floor under the agent path's CPU goal.

``python -m bench.mcp_floor [--quick]``: the official SDK's low-level server on the stack
`toolrelay serve` uses (uvicorn, streamable HTTP sessions), with one tool that returns a
constant: no database, no dispatch, in a child process. The same SDK client as
bench/agent_path.py calls it from this process in SESSIONS sessions, back to back, for
SECONDS s. Counted: calls completed in that window, and the server child's CPU seconds
(``procs.CpuGroups``, /proc/<pid>/stat) read before and after it, per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.procs import Child, CpuGroups, free_port, python_module, wait_http

SESSIONS, SECONDS, QUICK_SECONDS = 4, 8.0, 3.0
START_TIMEOUT_S = 30.0


def serve(port: int) -> None:
    import mcp_types as types
    import uvicorn
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.applications import Starlette
    from starlette.routing import Mount

    async def call_tool(_ctx: Any, _params: Any) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(text=json.dumps({"ok": True}))])

    async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

    server: Server[Any] = Server("floor", on_call_tool=call_tool, on_list_tools=list_tools)
    manager = StreamableHTTPSessionManager(app=server, security_settings=None)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        async with manager.run():
            yield

    async def handle(scope: Any, receive: Any, send: Any) -> None:
        await manager.handle_request(scope, receive, send)

    app = Starlette(routes=[Mount("/mcp", app=handle)], lifespan=lifespan)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


async def calls(url: str, seconds: float) -> int:
    import httpx2
    from mcp.client.client import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(timeout=60.0)
    async with http, Client(streamable_http_client(url, http_client=http)) as mcp:
        done, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            await mcp.call_tool("t", {})
            done += 1
        return done


def main(quick: bool) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="toolrelay-mcp-floor-") as scratch:
        argv = python_module("bench.mcp_floor", "serve", str(port))
        child = Child("floor", argv, os.environ, Path(scratch) / "serve.log")
        try:
            # Only /mcp is routed: the root's 404 says uvicorn is listening.
            wait_http(f"http://127.0.0.1:{port}/", child, START_TIMEOUT_S, statuses=(200, 404))
            seconds = QUICK_SECONDS if quick else SECONDS
            cpu = CpuGroups(server=lambda: [child.pid])
            before = cpu.sample()

            async def run() -> int:
                url = f"http://127.0.0.1:{port}/mcp/"
                return sum(await asyncio.gather(*(calls(url, seconds) for _ in range(SESSIONS))))

            done = asyncio.run(run())
            used = cpu.used(before, cpu.sample())["server"]
            return {"calls_per_s": done / seconds, "server_cpu_ms_per_call": used / done * 1000}
        finally:
            child.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(int(sys.argv[2]))
    else:
        result = main("--quick" in sys.argv[1:])
        print(f"MCP SDK alone, {SESSIONS} sessions: {result['calls_per_s']:.0f} calls/s,"
              f" server CPU {result['server_cpu_ms_per_call']:.2f} ms per tools/call")  # fmt: skip
