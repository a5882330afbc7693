"""Request size limit (an ASGI middleware) and a per-caller token bucket."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # 1 MiB
DEFAULT_RATE_PER_SECOND = 20.0  # requests per second, sustained, per token
DEFAULT_BURST = 60  # requests a token may make at once after being idle
MAX_TRACKED_KEYS = 10_000  # buckets kept before idle (full) ones are dropped


class _BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    """Answers 413 when a request body is larger than ``max_bytes``, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        too_large = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large:  # whatever the app made of the aborted read, the answer is 413
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await self._refuse(send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except _BodyTooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "payload_too_large",
                    "message": f"the request body is larger than {self.max_bytes} bytes",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def retry_after_seconds(wait: float) -> int:
    """Whole seconds for Retry-After (errors.py's formula), for a body to say the same."""
    return max(1, round(wait + 0.5))


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key, in memory (per process): ``rate`` per second, ``burst`` deep."""

    def __init__(
        self,
        rate: float = DEFAULT_RATE_PER_SECOND,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Spend one token: 0.0 when allowed, else the seconds until one is available."""
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= MAX_TRACKED_KEYS:
                    self._prune(now)
                bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= 1:
                bucket.tokens -= 1
                return 0.0
            return (1 - bucket.tokens) / self.rate

    def _prune(self, now: float) -> None:
        full_after = self.burst / self.rate
        stale = [k for k, b in self._buckets.items() if now - b.updated >= full_after]
        for key in stale or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[key]
