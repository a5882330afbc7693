"""Counters and a latency histogram, rendered in Prometheus' text format.

The same counters feed the worker's periodic summary line (``Counts`` and ``since``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # s
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    """One metric family: its HELP and TYPE lines, then its samples."""
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


@dataclass(frozen=True)
class Counts:
    """The counters at one moment, or the difference between two moments."""

    claimed: int = 0
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    lost_leases: int = 0
    unrecorded: int = 0

    def status(self, status: str) -> int:
        return sum(n for (s, _), n in self.outcomes.items() if s == status)

    def by_code(self, status: str) -> dict[str, int]:
        return {c or "none": n for (s, c), n in sorted(self.outcomes.items()) if s == status and n}

    def since(self, earlier: Counts) -> Counts:
        outcomes = Counter(self.outcomes)
        outcomes.subtract(earlier.outcomes)
        return Counts(
            claimed=self.claimed - earlier.claimed,
            outcomes=+outcomes,  # drops the zeros
            lost_leases=self.lost_leases - earlier.lost_leases,
            unrecorded=self.unrecorded - earlier.unrecorded,
        )


class Metrics:
    def __init__(self) -> None:
        # (status, error_code) of every result recorded: completed, failed, expired, pending
        # (sent back to approval) or running (to be retried).
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.claimed = 0
        self.recovered = 0
        self.lost_leases = 0
        self.unrecorded = 0  # results decided but not written (the database went away)
        self.in_flight = 0
        self.bucket_counts = [0] * len(LATENCY_BUCKETS)
        self.latency_sum = 0.0
        self.latency_count = 0
        self.extra: list[Callable[[], list[str]]] = []  # more families (webhook deliveries)

    def observe(self, status: str, error_code: str | None, seconds: float) -> None:
        self.outcomes[(status, error_code or "")] += 1
        self.latency_sum += seconds
        self.latency_count += 1
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.bucket_counts[i] += 1

    def counts(self) -> Counts:
        return Counts(self.claimed, Counter(self.outcomes), self.lost_leases, self.unrecorded)

    def lines(self) -> list[str]:
        """The worker's metric families, one line each (no trailing newline)."""
        return [
            *family(
                "toolrelay_invocations_total",
                "counter",
                "Results recorded by this worker, by status and error code.",
                (
                    f'toolrelay_invocations_total{{status="{escape_label(s)}",'
                    f'error_code="{escape_label(c)}"}} {n}'
                    for (s, c), n in sorted(self.outcomes.items())
                ),
            ),
            *family(
                "toolrelay_claimed_total",
                "counter",
                "Invocations claimed (each attempt counts).",
                [f"toolrelay_claimed_total {self.claimed}"],
            ),
            *family(
                "toolrelay_recovered_leases_total",
                "counter",
                "Claims of calls a previous attempt may have sent (a dead worker's lease).",
                [f"toolrelay_recovered_leases_total {self.recovered}"],
            ),
            *family(
                "toolrelay_lost_leases_total",
                "counter",
                "Calls whose lease another worker took over before the result was written.",
                [f"toolrelay_lost_leases_total {self.lost_leases}"],
            ),
            *family(
                "toolrelay_unrecorded_results_total",
                "counter",
                "Results that could not be written (database unavailable); the lease expires.",
                [f"toolrelay_unrecorded_results_total {self.unrecorded}"],
            ),
            *family(
                "toolrelay_in_flight",
                "gauge",
                "Calls claimed by this worker and not finished.",
                [f"toolrelay_in_flight {self.in_flight}"],
            ),
            *family(
                "toolrelay_attempt_seconds",
                "histogram",
                "Duration of one attempt: from sending (or from the claim, if nothing was sent) to its outcome.",
                [
                    *(
                        f'toolrelay_attempt_seconds_bucket{{le="{b}"}} {n}'
                        for b, n in zip(LATENCY_BUCKETS, self.bucket_counts, strict=True)
                    ),
                    f'toolrelay_attempt_seconds_bucket{{le="+Inf"}} {self.latency_count}',
                    f"toolrelay_attempt_seconds_sum {self.latency_sum}",
                    f"toolrelay_attempt_seconds_count {self.latency_count}",
                ],
            ),
            *(line for more in self.extra for line in more()),
        ]

    def render(self) -> str:
        return "\n".join(self.lines()) + "\n"


async def serve_metrics(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
