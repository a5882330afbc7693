"""Issue 12, finding 10: slow clients cannot hold `toolrelay serve`'s connections.

The real app under uvicorn with toolrelay's protocol (``toolrelay.api.server``), on loopback,
with shortened deadlines. 200 sockets trickle a request line and headers one byte at a time
(each stops by itself after a bounded number of bytes): the server keeps at most
``max_slow`` of them, closing the oldest as new ones come; a normal request is answered
within 1 s meanwhile; those kept are answered 408 and closed at the header deadline. A
kept-alive connection that trickles its next request and a request whose body trickles are
closed at their deadlines too. Plain uvicorn keeps every one of these sockets open.

Nothing here sleeps to synchronise: the trickle's pace is a read that waits for the server's
answer or EOF with a timeout, and everything else waits on events with timeouts.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from tests.api.conftest import settings
from toolrelay.api import create_app
from toolrelay.api.server import ConnectionLimits, GuardedH11Protocol, protocol_class

HOST = "127.0.0.1"
LIMITS = ConnectionLimits(header_timeout=2.0, body_timeout=2.0, max_slow=50)
SLOW = 200  # slow sockets
PACE = 0.2  # seconds between a slow client's bytes
MAX_BYTES = 40  # each slow client gives up after this many bytes (8 s, four deadlines)
NORMAL_WITHIN = 1.0  # seconds for a normal request during the attack
SLACK = 1.5  # seconds a deadline may be late on a loaded machine
START_TIMEOUT = 30.0

HEADERS = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\nX-Padding: " + b"a" * 64
BODY_HEADERS = (b"POST /v1/agent/invocations HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")  # fmt: skip


class _Server(uvicorn.Server):
    """uvicorn's server, saying when it listens (an event, not a poll)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


@dataclass
class Served:
    port: int
    protocol: type[GuardedH11Protocol]


@pytest.fixture(scope="module")
def served(database_url: str) -> Iterator[Served]:
    protocol = protocol_class(LIMITS)
    app = create_app(settings(database_url, None, run_worker=False))
    config = uvicorn.Config(app, host=HOST, port=0, http=protocol, log_level="warning",
                            lifespan="on", access_log=False)  # fmt: skip
    server = _Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-slowloris", daemon=True)
    thread.start()
    assert server.listening.wait(START_TIMEOUT), "the server did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Served(port, protocol)
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT)


@dataclass
class Closed:
    after: float  # seconds from the first byte of the slow part (connecting, for headers)
    answer: bytes  # what the server wrote before closing, then "reset" if it reset (it
    # does when it closes with bytes of ours unread)


async def trickle(
    port: int, payload: bytes, *, warm_up: bytes = b"", prefix: bytes = b""
) -> Closed | None:
    """Optionally make a whole request first (``warm_up``, its answer read: the connection is
    kept alive) and send ``prefix`` at once; then send ``payload`` one byte every PACE
    seconds until the server answers or closes. None: MAX_BYTES were sent and the server
    kept the connection open."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection(HOST, port)
    answer = b""
    try:
        if warm_up:
            writer.write(warm_up)
            answer = await read_response(reader)
            started = loop.time()  # the next request's deadline starts at its first byte
        if prefix:
            writer.write(prefix)
            started = loop.time()
        for byte in payload[:MAX_BYTES]:
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(4096), PACE)
            except TimeoutError:
                continue
            if data:  # an answer: read on to the EOF that must follow it
                data += await asyncio.wait_for(reader.read(), SLACK)
            return Closed(loop.time() - started, answer + data)
        return None
    except (ConnectionResetError, BrokenPipeError):
        return Closed(loop.time() - started, answer + b"reset")
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), SLACK)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))  # fmt: skip
    return head + await asyncio.wait_for(reader.readexactly(length), SLACK)


async def test_slow_headers_are_bounded_and_closed_at_the_deadline(served: Served) -> None:
    slow = served.protocol.slow
    evicted_before = slow.evicted
    closed = 0
    enough = asyncio.Event()  # all but max_slow slow clients were closed

    def one_closed(task: asyncio.Task[Closed | None]) -> None:
        nonlocal closed
        if not task.cancelled() and task.result() is not None:
            closed += 1
            if closed >= SLOW - LIMITS.max_slow:
                enough.set()

    loop = asyncio.get_running_loop()
    began = loop.time()
    clients = [asyncio.create_task(trickle(served.port, HEADERS)) for _ in range(SLOW)]
    for task in clients:
        task.add_done_callback(one_closed)
    try:
        # The bound: as they connect the oldest are closed, long before any deadline.
        await asyncio.wait_for(enough.wait(), LIMITS.header_timeout * 0.75)
        assert loop.time() - began < LIMITS.header_timeout
        assert slow.peak <= LIMITS.max_slow
        assert len(slow) <= LIMITS.max_slow
        still_open = sum(not task.done() for task in clients)
        assert 0 < still_open <= LIMITS.max_slow

        # Meanwhile a normal request is served at once.
        async with httpx.AsyncClient(base_url=f"http://{HOST}:{served.port}") as http:
            asked = loop.time()
            response = await http.get("/healthz", timeout=NORMAL_WITHIN)
            assert response.status_code == 200
            assert loop.time() - asked < NORMAL_WITHIN

        # The ones kept are closed at the header deadline, with a 408.
        results = await asyncio.wait_for(
            asyncio.gather(*clients), LIMITS.header_timeout + SLACK * 2
        )
    finally:
        for task in clients:
            task.cancel()
    assert all(result is not None for result in results), "a slow socket was left open"
    ends = [result for result in results if result is not None]
    # Closed as the bound was passed (503, or a reset when the server closed with a byte of
    # ours unread), long before the deadline; or at the deadline (408, or a reset).
    bounced = [end for end in ends if end.after < LIMITS.header_timeout / 2]
    timed_out = [end for end in ends if end.after >= LIMITS.header_timeout / 2]
    assert len(bounced) >= SLOW - LIMITS.max_slow
    assert slow.evicted - evicted_before >= SLOW - LIMITS.max_slow
    assert all(end.answer.startswith((b"HTTP/1.1 503 ", b"reset")) for end in bounced)
    assert all(end.answer.startswith((b"HTTP/1.1 408 ", b"reset")) for end in timed_out)
    for end in timed_out:
        assert LIMITS.header_timeout * 0.9 <= end.after <= LIMITS.header_timeout + SLACK
    assert len(slow) == 0


async def test_a_kept_alive_connection_that_trickles_its_next_request_is_closed(
    served: Served,
) -> None:
    first = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    end = await asyncio.wait_for(trickle(served.port, HEADERS, warm_up=first), 10.0)
    assert end is not None, "the kept-alive connection was left open"
    assert end.answer.startswith(b"HTTP/1.1 200 ")  # the first request was answered
    assert end.answer.endswith(b"reset") or b"HTTP/1.1 408 " in end.answer  # then 408, closed
    assert LIMITS.header_timeout * 0.9 <= end.after <= LIMITS.header_timeout + SLACK


async def test_a_trickled_body_is_closed_at_the_body_deadline(served: Served) -> None:
    body = b'{"tool": "x", "input": {"padding": "' + b"b" * 900
    end = await asyncio.wait_for(trickle(served.port, body, prefix=BODY_HEADERS), 10.0)
    assert end is not None, "the connection trickling its body was left open"
    assert end.answer.startswith((b"HTTP/1.1 408 ", b"reset")), end.answer[:80]
    assert LIMITS.body_timeout * 0.9 <= end.after <= LIMITS.body_timeout + SLACK


async def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        ConnectionLimits(header_timeout=0)
    with pytest.raises(ValueError):
        ConnectionLimits(max_slow=0)
