"""Counters and a latency histogram, rendered in Prometheus' text format."""

from __future__ import annotations

from collections import Counter

from aiohttp import web

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # s


class Metrics:
    def __init__(self) -> None:
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (status, error_code)
        self.claimed = 0
        self.recovered = 0
        self.lost_leases = 0
        self.bucket_counts = [0] * len(LATENCY_BUCKETS)
        self.latency_sum = 0.0
        self.latency_count = 0

    def observe(self, status: str, error_code: str | None, seconds: float) -> None:
        self.outcomes[(status, error_code or "")] += 1
        self.latency_sum += seconds
        self.latency_count += 1
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.bucket_counts[i] += 1

    def render(self) -> str:
        lines = [
            "# TYPE toolrelay_invocations_total counter",
            *(
                f'toolrelay_invocations_total{{status="{s}",error_code="{c}"}} {n}'
                for (s, c), n in sorted(self.outcomes.items())
            ),
            "# TYPE toolrelay_claimed_total counter",
            f"toolrelay_claimed_total {self.claimed}",
            "# TYPE toolrelay_recovered_leases_total counter",
            f"toolrelay_recovered_leases_total {self.recovered}",
            "# TYPE toolrelay_lost_leases_total counter",
            f"toolrelay_lost_leases_total {self.lost_leases}",
            "# TYPE toolrelay_attempt_seconds histogram",
            *(
                f'toolrelay_attempt_seconds_bucket{{le="{b}"}} {n}'
                for b, n in zip(LATENCY_BUCKETS, self.bucket_counts, strict=True)
            ),
            f'toolrelay_attempt_seconds_bucket{{le="+Inf"}} {self.latency_count}',
            f"toolrelay_attempt_seconds_sum {self.latency_sum}",
            f"toolrelay_attempt_seconds_count {self.latency_count}",
        ]
        return "\n".join(lines) + "\n"


async def serve_metrics(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
