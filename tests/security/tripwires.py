"""What a schema would touch if it reached outside itself: a loopback server that counts
every request, and an audit hook that records sockets, URL requests and opened files."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A fetched reference would get a schema back, so validation would go on with it.
SERVED_SCHEMA = {"type": "integer", "description": "served by the counting server"}


class CountingServer:
    """On its own thread, so a fetch made while the event loop is blocked still arrives."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        lock = threading.Lock()
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    requests.append(f"GET {self.path}")
                body = json.dumps(SERVED_SCHEMA).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def url(self, path: str = "/schema.json") -> str:
        return f"{self.base_url}{path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


WATCHED = frozenset(
    {
        "socket.connect",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "urllib.Request",
        "open",
        "subprocess.Popen",
    }
)
_recording: tuple[int, list[tuple[str, tuple[Any, ...]]]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    recording = _recording
    if recording is not None and event in WATCHED and threading.get_ident() == recording[0]:
        recording[1].append((event, args))


sys.addaudithook(_audit)  # once per process: audit hooks cannot be removed


@contextmanager
def io_events() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """The sockets, URL requests and files this thread touched inside the block."""
    global _recording
    events: list[tuple[str, tuple[Any, ...]]] = []
    _recording = (threading.get_ident(), events)
    try:
        yield events
    finally:
        _recording = None
