"""``python -m bench.routing``: what finding its route costs an agent's request on /v1, in
a second, no database (issue 14, goal 1).

FastAPI tries the app's routes in order, each a regular expression: the app's router walks
every included router's routes until one matches, then that router finds its own route again
among its few. Measured here: the first walk, for each of the agent door's requests, with the routes as ``create_app`` orders them (the agents' first) and,
as the baseline in the same run, with the owners' 30 routes moved ahead of them (the order
before session 15). Rounds alternate between the two orders; the medians are printed.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from starlette.routing import Match

from bench.tables import print_table
from toolrelay.api import ApiSettings, create_app

REQUESTS = [
    ("POST", "/v1/agent/invocations"),
    ("GET", "/v1/agent/invocations/6f1c0f9e-5d7a-4c1e-9d0b-2a1e3c4b5d6f"),
]
ROUNDS, PER_ROUND = 7, 2_000


def _scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": "",
            "headers": [], "query_string": b""}  # fmt: skip


def match_us(routes: list[Any], method: str, path: str) -> float:
    """µs for one pass over ``routes`` to the one that matches (PER_ROUND passes, averaged)."""
    started = time.perf_counter()
    for _ in range(PER_ROUND):
        scope = _scope(method, path)
        for route in routes:
            if route.matches(scope)[0] == Match.FULL:
                break
    return (time.perf_counter() - started) / PER_ROUND * 1e6


def owners_first(routes: list[Any]) -> list[Any]:
    """The same routes with the owners' /v1 router ahead of the agents' /v1/agent one."""

    def prefix(route: Any) -> str | None:
        return getattr(getattr(route, "original_router", None), "prefix", None)

    agents = next(i for i, r in enumerate(routes) if prefix(r) == "/v1/agent")
    owners = next(i for i, r in enumerate(routes) if prefix(r) == "/v1")
    reordered = list(routes)
    reordered[agents], reordered[owners] = routes[owners], routes[agents]
    return reordered


def main() -> None:
    # Building the app connects to nothing; the URL is never used.
    app = create_app(ApiSettings(database_url="postgresql://unused", run_worker=False))
    orders = {"as built": list(app.router.routes), "owners first": owners_first(app.router.routes)}
    rows = []
    for method, path in REQUESTS:
        times: dict[str, list[float]] = {label: [] for label in orders}
        for _ in range(ROUNDS):
            for label, routes in orders.items():
                times[label].append(match_us(routes, method, path))
        built, before = (statistics.median(times[k]) for k in orders)
        rows.append(
            [f"{method} {path[:40]}", f"{built:.1f}", f"{before:.1f}", f"{before / built:.1f}x"]
        )
    print_table(["request", "as built µs", "owners first µs", "saved"], rows,
                "route matching: the app router's walk to the matching route")  # fmt: skip


if __name__ == "__main__":
    main()
