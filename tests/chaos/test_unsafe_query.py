"""The deliberately broken build differs from the real one by the fence, and only by it."""

from __future__ import annotations

from typing import Any

import pytest

from toolrelay.chaos.config import UNSAFE_NO_FENCING_ENV
from toolrelay.db.queries import load
from toolrelay.dispatch.store import FINISH_FENCE, FINISH_ROWS, DispatchStore


def test_the_fence_is_in_the_finish_query() -> None:
    assert FINISH_FENCE in load("dispatch")["finish"]


@pytest.mark.parametrize(("value", "fenced"), [(None, True), ("0", True), ("1", False)])
def test_the_store_runs_unfenced_only_when_told(
    monkeypatch: pytest.MonkeyPatch, value: str | None, fenced: bool
) -> None:
    if value is None:
        monkeypatch.delenv(UNSAFE_NO_FENCING_ENV, raising=False)
    else:
        monkeypatch.setenv(UNSAFE_NO_FENCING_ENV, value)
    pool: Any = None  # not used until a query runs
    query = DispatchStore(pool, "w", written_rows=True).finish_query
    assert (FINISH_FENCE in query) is fenced
    assert query.replace(FINISH_FENCE, "") == load("dispatch")["finish"].replace(FINISH_FENCE, "")


def test_a_worker_alone_selects_only_the_ids_written() -> None:
    """Without waiters to hand rows to, `finish` returns ids: its only other difference."""
    pool: Any = None
    query = DispatchStore(pool, "w").finish_query
    assert FINISH_ROWS not in query
    assert query.replace("SELECT done.id", FINISH_ROWS) == load("dispatch")["finish"]
