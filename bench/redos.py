"""``python -m bench.redos``: a catastrophic owner pattern against upstream output (issue 12,
finding 7), in about two seconds, no database.

- **toolrelay**: the worker's own output check (``executor.schema_mismatch``: RE2 underneath)
  with ``^(a+)+$`` against ``"a" * 10_000 + "!"`` (10 kB that almost matches), as a
  ``pattern`` and as a ``patternProperties`` key; the median of several runs, target < 10 ms.
- **Python's re** (what jsonschema uses by itself): the same pattern through a stock
  jsonschema validator on 16, 18, 20, … characters, each in a child process killed past its
  budget, stopping at the first length over budget: what the worker's event loop stalled
  for before, and how fast that grows (it doubles with every character).

Writes bench/out/redos-<UTC timestamp>.json; exits 1 when a toolrelay row misses its target.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.constants import OUT_DIR
from bench.procs import Child
from bench.tables import print_table as print_rows
from toolrelay.dispatch.executor import schema_mismatch

EVIL = "^(a+)+$"
TEXT_CHARS = 10_000  # the adversarial text: this many "a", then "!"
TARGET_MS = 10.0  # per check of the 10 kB text
RUNS = 21  # the median is reported
RE_LENGTHS = range(16, 41, 2)  # characters tried with Python's re, until one is over budget
RE_BUDGET_S = 0.5  # a length taking longer ends the series
RE_KILL_S = 10.0  # a child still running past this is killed (its length counts as over)

CHILD = """
import sys, time
from jsonschema import Draft202012Validator
n = int(sys.argv[1])
check = Draft202012Validator({"type": "string", "pattern": sys.argv[2]})
started = time.perf_counter()
check.is_valid("a" * n + "!")
print(time.perf_counter() - started)
"""


@dataclass
class Row:
    engine: str
    case: str
    chars: int
    ms: float
    target: str
    met: bool | None


def _median_ms(schema: dict[str, Any], output: Any) -> float:
    assert schema_mismatch(schema, output)  # compiled (and cached) outside the timing
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        mismatch = schema_mismatch(schema, output)
        times.append(time.perf_counter() - started)
        assert mismatch is not None
    return statistics.median(times) * 1000


def toolrelay_rows() -> list[Row]:
    text = "a" * TEXT_CHARS + "!"
    cases: list[tuple[str, dict[str, Any], Any]] = [
        ("pattern", {"type": "string", "pattern": EVIL}, text),
        (
            "patternProperties key",
            {"patternProperties": {EVIL: {"type": "string"}}, "additionalProperties": False},
            {text: 1},
        ),
    ]
    rows = []
    for case, schema, output in cases:
        ms = _median_ms(schema, output)
        rows.append(
            Row("toolrelay (RE2)", case, len(text), ms, f"< {TARGET_MS:g} ms", ms < TARGET_MS)
        )
    return rows


def python_re_rows() -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="toolrelay-redos-") as scratch:
        for n in RE_LENGTHS:
            argv = [sys.executable, "-c", CHILD, str(n), EVIL]
            child = Child(
                f"re-{n}", argv, os.environ, Path(scratch) / "re.log", capture_stdout=True
            )
            try:
                usage = child.wait(RE_KILL_S)
            except TimeoutError:
                ms = RE_KILL_S * 1000  # at least
            else:
                if usage.returncode != 0:
                    raise RuntimeError(f"the re child failed: {child.tail()}")
                ms = float(child.readline()) * 1000
            rows.append(Row("Python re (stock jsonschema)", "pattern", n + 1, ms, "", None))
            if ms > RE_BUDGET_S * 1000:
                break
    return rows


def growth_per_char(rows: list[Row]) -> float | None:
    """How much longer each extra character makes Python's re take (from the last two)."""
    if len(rows) < 2 or rows[-2].ms <= 0:
        return None
    return float((rows[-1].ms / rows[-2].ms) ** (1 / (rows[-1].chars - rows[-2].chars)))


def print_table(rows: list[Row], growth: float | None) -> None:
    status = {None: "", True: "met", False: "MISSED"}
    cells = [[r.engine, r.case, f"{r.chars:,}", f"{r.ms:,.3f}", r.target, status[r.met]]
             for r in rows]  # fmt: skip
    head = ["engine", "case", "characters", "time ms", "target", "status"]
    print_rows(head, cells, "ReDoS: ^(a+)+$ against a text that almost matches")
    if growth is not None:
        print(
            f"Python's re: x{growth:.2f} per extra character; stopped at the first length over"
            f" {RE_BUDGET_S:g} s. RE2 checks {TEXT_CHARS:,} characters in the time above."
        )


def main() -> int:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    ours, theirs = toolrelay_rows(), python_re_rows()
    growth = growth_per_char(theirs)
    print_table([*ours, *theirs], growth)
    results = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "pattern": EVIL,
        "rows": [asdict(r) for r in [*ours, *theirs]],
        "python_re_growth_per_char": growth,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"redos-{stamp}.json"
    path.write_text(json.dumps(results, indent=1) + "\n", "utf-8")
    print(f"results: {path}")
    return 0 if all(r.met for r in ours) else 1


if __name__ == "__main__":
    sys.exit(main())
