"""toolrelay.heap: a long-running process's startup objects out of the collector's scans."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from toolrelay import heap


@pytest.fixture
def restored() -> Iterator[None]:
    """The test process's collector as it was: unfrozen, default thresholds."""
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_settle_freezes_what_lives_and_collects_what_does_not(restored: None) -> None:
    kept = Node()
    dropped = weakref.ref(Node())  # garbage already, in a cycle
    heap.settle()
    assert dropped() is None  # collected first, not frozen for ever
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(kept) and not any(kept is o for o in gc.get_objects())  # permanent
    assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD


def test_objects_made_after_settling_are_still_collected(restored: None) -> None:
    heap.settle()
    later = weakref.ref(Node())  # garbage in a cycle, in the youngest generation
    made = [[] for _ in range(2 * heap.YOUNG_THRESHOLD)]  # enough to start a collection
    assert later() is None  # by the collector on its own, not by an explicit gc.collect()
    assert len(made) == 2 * heap.YOUNG_THRESHOLD
