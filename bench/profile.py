"""RESULTS.md's "Profile of one worker": where a worker's CPU goes, in one more drain of
throughput.py's (Sizes.profile_n queued, one worker) under py-spy (pyinstrument when ptrace
is refused; full run only).

py-spy samples the worker at PROFILE_RATE_HZ without touching it and writes collapsed
stacks (bench/out/profile-<stamp>.pyspy.txt); the summary reads them into the share of
samples per function (self time), inclusive time of the dispatcher's main steps (STEPS),
and self time per area (psycopg, aiohttp, the event loop, logging ...: AREAS). The drain's
rate is reported, not judged.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.constants import PROFILE_RATE_HZ, PROFILE_TOP
from bench.procs import python_module
from bench.session import Context
from bench.throughput import DrainResult, drain_toolrelay

# Inclusive time of these frames (function name as py-spy prints it) tells the story.
STEPS = {
    "claim (DispatchStore.claim)": "DispatchStore.claim",
    "credential resolve (CredentialResolver.resolve)": "CredentialResolver.resolve",
    "precheck (incl. jsonschema)": "precheck",
    "render request (render_request)": "render_request",
    "mark sent (Worker._flush_sent)": "Worker._flush_sent",
    "HTTP exchange (http.send)": "send",
    "record result (Worker._flush_results)": "Worker._flush_results",
    "per-invocation log line (Logger.info)": "Logger.info",
    "building attempt rows / outcome (Worker._record)": "Worker._record",
}
# Self time by the file of the innermost frame.
AREAS = (
    ("psycopg / psycopg_pool", re.compile(r"\(psycopg")),
    ("aiohttp / yarl / multidict", re.compile(r"\((aiohttp|yarl|multidict)/")),
    ("asyncio event loop + selectors", re.compile(r"\((asyncio/|selectors\.py)")),
    ("json", re.compile(r"\(json/")),
    ("logging", re.compile(r"\(logging/|toolrelay/logs\.py")),
    ("jsonschema / referencing", re.compile(r"\((jsonschema|referencing|rpds|attr)")),
    ("toolrelay", re.compile(r"\(toolrelay/")),
    ("cryptography", re.compile(r"\(cryptography/")),
    ("ipaddress / socket / ssl", re.compile(r"\((ipaddress|socket|ssl)\.py")),
    ("imports (startup)", re.compile(r"<frozen importlib")),
)
PYINSTRUMENT_LINES = 80  # of its text report kept in the results
_LINE = re.compile(r":\d+\)$")


@dataclass
class ProfileResult:
    tool: str
    path: str
    samples: int
    drain: dict[str, Any]
    steps_pct: dict[str, float] = field(default_factory=dict)
    areas_pct: dict[str, float] = field(default_factory=dict)
    top_self_pct: list[tuple[str, float]] = field(default_factory=list)
    text: str = ""  # pyinstrument's report when it was used instead

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _function(frame: str) -> str:
    return frame.split(" (", 1)[0]


def stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    """py-spy's collapsed stacks (``--format raw``): each stack's frames and its samples."""
    for line in path.read_text("utf-8", "replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            yield stack.split(";"), int(count)


def inclusive_samples(path: Path) -> tuple[int, Counter[str]]:
    """All samples, and per function name the samples with it anywhere on the stack."""
    inclusive: Counter[str] = Counter()
    total = 0
    for frames, n in stacks(path):
        total += n
        for name in {_function(f) for f in frames}:
            inclusive[name] += n
    return total, inclusive


def summarize(
    path: Path,
) -> tuple[int, dict[str, float], dict[str, float], list[tuple[str, float]]]:
    self_time: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total, inclusive = inclusive_samples(path)
    for frames, n in stacks(path):
        leaf = frames[-1]
        self_time[_LINE.sub(")", leaf)] += n
        area = next((a for a, rx in AREAS if rx.search(leaf)), None)
        if area is None and any("<frozen importlib" in f for f in frames):
            area = "imports (startup)"
        areas[area or "other (C extensions, builtins)"] += n
    if not total:
        return 0, {}, {}, []

    def pct(n: int) -> float:
        return round(100.0 * n / total, 1)

    steps = {label: pct(inclusive[name]) for label, name in STEPS.items()}
    by_area = {a: pct(n) for a, n in areas.most_common()}
    top = [(frame, pct(n)) for frame, n in self_time.most_common(PROFILE_TOP)]
    return total, steps, by_area, top


def py_spy() -> str | None:
    """py-spy on PATH, else beside this interpreter (the venv's bin/)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def run(ctx: Context, n: int, out_dir: Path, stamp: str) -> ProfileResult:
    out_dir.mkdir(parents=True, exist_ok=True)  # a fresh checkout has no bench/out yet
    spy = py_spy()
    if spy is not None:
        path = out_dir / f"profile-{stamp}.pyspy.txt"
        interpreter = [spy, "record", "--rate", str(PROFILE_RATE_HZ), "--format", "raw"]
        interpreter += ["--output", str(path), "--", sys.executable]
        try:
            drain = drain_toolrelay(ctx, n, 1, "profile", interpreter)
        except RuntimeError:
            drain = None
        if drain is not None and path.exists() and path.stat().st_size > 0:
            samples, steps, areas, top = summarize(path)
            return ProfileResult("py-spy", str(path), samples, _brief(drain), steps, areas, top)
    return _pyinstrument(ctx, n, out_dir, stamp)


def _pyinstrument(ctx: Context, n: int, out_dir: Path, stamp: str) -> ProfileResult:
    path = out_dir / f"profile-{stamp}.pyinstrument.txt"
    interpreter = python_module("pyinstrument", "--renderer", "text", "--outfile", str(path))
    drain = drain_toolrelay(ctx, n, 1, "profile", interpreter)
    text = path.read_text("utf-8", "replace") if path.exists() else ""
    lines = "\n".join(text.splitlines()[:PYINSTRUMENT_LINES])
    return ProfileResult("pyinstrument", str(path), 0, _brief(drain), text=lines)


def _brief(drain: DrainResult) -> dict[str, Any]:
    return {"n": drain.n, "per_s": round(drain.per_s, 1), "cores": drain.cores}
