"""The deliberately broken build differs from the real one by the fence, and only by it."""

from __future__ import annotations

from typing import Any

import pytest

from toolrelay.chaos.config import UNSAFE_NO_FENCING_ENV
from toolrelay.db.queries import load
from toolrelay.dispatch.store import DispatchStore

FENCE = " AND i.attempt = r.attempt AND i.lease_owner = %(worker)s"


def body(query: str) -> str:
    return "\n".join(line for line in query.splitlines() if not line.startswith("--"))


def test_finish_unfenced_is_finish_without_the_fence() -> None:
    queries = load("dispatch")
    assert FENCE in queries["finish"]
    assert body(queries["finish"]).replace(FENCE, "") == body(queries["finish_unfenced"])


@pytest.mark.parametrize(
    ("value", "query"), [(None, "finish"), ("0", "finish"), ("1", "finish_unfenced")]
)
def test_the_store_runs_unfenced_only_when_told(
    monkeypatch: pytest.MonkeyPatch, value: str | None, query: str
) -> None:
    if value is None:
        monkeypatch.delenv(UNSAFE_NO_FENCING_ENV, raising=False)
    else:
        monkeypatch.setenv(UNSAFE_NO_FENCING_ENV, value)
    pool: Any = None  # not used until a query runs
    assert DispatchStore(pool, "w").finish_query == load("dispatch")[query]
