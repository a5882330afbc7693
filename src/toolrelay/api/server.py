"""HTTP/1.1 for `toolrelay serve`: uvicorn's h11 protocol with the deadlines uvicorn lacks.

uvicorn (0.54) has a keep-alive timeout but no deadline for a request's headers or body: a
client that sends one byte now and then keeps its connection forever, and a few hundred of
them hold a server's sockets (slowloris). ``protocol_class(limits)`` gives a subclass of
uvicorn's ``H11Protocol`` (the one ``http="auto"`` picks without httptools; passed to
``uvicorn.Config(http=...)`` explicitly, so which parser serves is never left to what else is
installed) that adds:

- a **header deadline**: a request's line and headers must be complete within
  ``header_timeout`` seconds of the connection being made, or on a kept-alive connection of
  the next request's first byte; else 408 and the connection is closed;
- a **bound on connections still sending headers** (``max_slow``): past it the one that has
  been waiting longest is closed (503), so new clients are served while a flood of slow ones
  only ever evicts itself;
- a **body deadline**: once the headers are in, the whole body must arrive within
  ``body_timeout`` seconds; else the connection is closed (408 if nothing was answered yet;
  the app sees a disconnect).

Idle kept-alive connections are left to uvicorn's ``timeout_keep_alive`` (5 s).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ConnectionLimits", "GuardedH11Protocol", "SlowConnections", "protocol_class"]

log = logging.getLogger("toolrelay.api.server")

DEFAULT_HEADER_TIMEOUT = 10.0  # seconds for a request line and headers
DEFAULT_BODY_TIMEOUT = 30.0  # seconds for a whole request body once the headers are in
DEFAULT_MAX_SLOW = 100  # connections that may be sending headers at once
WARN_EVERY = 60.0  # seconds between warnings about slow connections being closed


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_slow: int = DEFAULT_MAX_SLOW

    def __post_init__(self) -> None:
        if self.header_timeout <= 0 or self.body_timeout <= 0:
            raise ValueError("header_timeout and body_timeout must be positive")
        if self.max_slow < 1:
            raise ValueError("max_slow must be at least 1")


def _answer(status: bytes, text: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: " + str(len(text)).encode() + b"\r\nconnection: close\r\n\r\n" + text
    )


HEADERS_TOO_SLOW = _answer(b"408 Request Timeout", b"request headers not received in time\n")
BODY_TOO_SLOW = _answer(b"408 Request Timeout", b"request body not received in time\n")
TOO_MANY_SLOW = _answer(b"503 Service Unavailable", b"too many slow connections\n")


class SlowConnections:
    """The connections of one server still sending headers, oldest first, with counts."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._waiting: dict[GuardedH11Protocol, None] = {}  # insertion order: oldest first
        self.peak = 0  # most ever waiting at once
        self.timed_out = 0  # closed by a header or body deadline
        self.evicted = 0  # closed because the bound was reached
        self._warned = -WARN_EVERY

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, connection: GuardedH11Protocol) -> None:
        self._waiting[connection] = None
        while len(self._waiting) > self.limits.max_slow:
            oldest = next(iter(self._waiting))
            self.discard(oldest)
            self.evicted += 1
            self._warn("the bound on connections sending headers was reached")
            oldest.close_with(TOO_MANY_SLOW)
        self.peak = max(self.peak, len(self._waiting))

    def discard(self, connection: GuardedH11Protocol) -> None:
        self._waiting.pop(connection, None)

    def timeout(self) -> None:
        self.timed_out += 1
        self._warn("a request's headers or body did not arrive in time")

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY:
            self._warned = now
            log.warning(
                f"closing slow connections: {what} (so far {self.timed_out} timed out,"
                f" {self.evicted} over the bound of {self.limits.max_slow})",
                extra={"action": "slow_connections"},
            )


class GuardedH11Protocol(H11Protocol):
    """``H11Protocol`` with header and body deadlines and a bound on slow connections.
    Use ``protocol_class`` for a subclass bound to one server's ``SlowConnections``."""

    slow: ClassVar[SlowConnections]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = "idle"  # idle (between requests), headers, body, or busy (answering)
        self._deadline: asyncio.TimerHandle | None = None

    # --- uvicorn's protocol, with the phase kept up to date ----------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase == "idle":
            self._start_headers()  # a kept-alive connection starts its next request
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()  # the next cycle may have begun, with a pipelined request buffered

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._stop()  # the connection is no longer ours to time
        super().handle_websocket_upgrade(event)

    # --- phases ----------------------------------------------------------------------------

    def _follow(self) -> None:
        if self.transport.is_closing():
            self._stop()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._phase in ("body", "busy"):  # a new cycle started
                if self.conn.trailing_data[0]:
                    self._start_headers()
                else:
                    self._stop()
        elif state is h11.SEND_BODY:
            if self._phase == "headers":
                self._stop()
                self._phase = "body"
                self._arm(self.slow.limits.body_timeout, BODY_TOO_SLOW)
        elif self._phase != "busy":
            self._stop()
            self._phase = "busy"

    def _start_headers(self) -> None:
        self._stop()
        self._phase = "headers"
        self._arm(self.slow.limits.header_timeout, HEADERS_TOO_SLOW)
        self.slow.add(self)

    def _stop(self) -> None:
        self._phase = "idle"
        self.slow.discard(self)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _arm(self, seconds: float, answer: bytes) -> None:
        self._deadline = self.loop.call_later(seconds, self._too_slow, answer)

    def _too_slow(self, answer: bytes) -> None:
        self._deadline = None
        self.slow.timeout()
        self.close_with(answer)

    def close_with(self, answer: bytes) -> None:
        """Close the connection, answering ``answer`` first unless this request's response
        was begun (in the header phase nothing was: the last cycle, if any, is complete)."""
        unanswered = self._phase == "headers" or (
            self.cycle is not None and not self.cycle.response_started
        )
        self._stop()
        if self.transport.is_closing():
            return
        if unanswered:
            self.transport.write(answer)
        self.transport.close()


def protocol_class(limits: ConnectionLimits | None = None) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)``, with its own ``SlowConnections``
    (one per server: reach it as ``.slow``)."""
    slow = SlowConnections(limits or ConnectionLimits())
    return type("ToolrelayH11Protocol", (GuardedH11Protocol,), {"slow": slow})
