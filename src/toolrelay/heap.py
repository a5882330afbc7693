"""The heap of a long-running process (serve, worker): what its startup made is kept out of
the garbage collector's scans, and the youngest generation is collected less often.

CPython's cycle collector walks every tracked object of a generation at each collection; the
oldest holds what the imports and the app's construction made (~190,000 objects in serve),
and walking it took 40-150 ms a time on this project's benchmark machine: CPU, and a pause
for every call in flight. Those objects live as long as the process, so after one collection
they are frozen (``gc.freeze``): later collections walk only what was made since. An object
frozen and later dropped is still freed by reference counting; only a cycle among frozen
objects would stay (startup's own structures, never per-call data, which is made after).

The youngest generation is collected after ``YOUNG_THRESHOLD`` net allocations instead of
700: a call's objects mostly die with it (reference counting frees them), so fewer
collections find less to walk. In a drain of 20,000 calls the young and middle collections
went from ~2,360 (1.45 s) to ~190 (0.07 s); bench/RESULTS.md, "The garbage collector".
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle"]

YOUNG_THRESHOLD = 10_000  # CPython's default is 700


def settle() -> None:
    """Collect once, freeze what is left and raise the youngest generation's threshold
    (``gc.get_freeze_count()`` tells how much was frozen). Call it once a process has
    imported and built what it keeps, before it serves."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
