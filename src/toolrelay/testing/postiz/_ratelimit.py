"""Postiz's throttler on POST /posts: a fixed window per organization, opened by its first hit."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_RATE_LIMIT = 30  # posts per window; Postiz's docker-compose value (code default 90)
DEFAULT_RATE_WINDOW_SECONDS = 3600.0


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_seconds: int  # whole seconds until the window closes, never 0 while it is open

    def headers(self) -> dict[str, str]:
        values = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset_seconds),
        }
        if not self.allowed:
            values["Retry-After"] = str(self.reset_seconds)
        return values


@dataclass
class _Window:
    opened_at: float
    hits: int = 0


class RateLimiter:
    """Counts every hit, refused ones too, the way NestJS's ThrottlerGuard does."""

    def __init__(
        self,
        limit: int = DEFAULT_RATE_LIMIT,
        window_seconds: float = DEFAULT_RATE_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_seconds = window_seconds
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def hit(self, key: str) -> RateDecision:
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window.opened_at >= self.window_seconds:
            window = self._windows[key] = _Window(opened_at=now)
        window.hits += 1
        left = window.opened_at + self.window_seconds - now
        return RateDecision(
            allowed=window.hits <= self.limit,
            limit=self.limit,
            remaining=max(self.limit - window.hits, 0),
            # float rounding can push ceil() one past the window length
            reset_seconds=min(max(math.ceil(left), 1), max(math.ceil(self.window_seconds), 1)),
        )

    def reset(self, key: str | None = None) -> None:
        """Forget one organization's window, or all of them."""
        if key is None:
            self._windows.clear()
        else:
            self._windows.pop(key, None)
