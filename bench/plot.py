"""docs/img/bench.png: throughput against the baselines, against workers, and latency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from bench.constants import TARGET_P50_200_MS, TARGET_P99_200_MS, TARGET_P99_1000_MS

FIGSIZE_IN = (15.0, 5.6)
DPI = 110
COLORS = {"toolrelay": "#2b6cb0", "raw": "#718096", "peer": "#dd6b20", "finish": "#9f7aea"}
RATE_COLORS = {200: "#2b6cb0", 1000: "#c53030"}


def _bar_labels(ax: Axes, bars: Any, fmt: str = "{:,.0f}") -> None:
    for bar in bars:
        ax.annotate(
            fmt.format(bar.get_height()),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
            xytext=(0, 2),
            textcoords="offset points",
        )


def _throughput(ax: Axes, tp: dict[str, Any]) -> None:
    names = [
        "raw aiohttp\n(no queue)",
        "toolrelay\n1 worker",
        tp["peer"]["system"].replace(" ", "\n"),
    ]
    values = [tp["raw"]["per_s"], tp["toolrelay"]["per_s"], tp["peer"]["per_s"]]
    bars = ax.bar(names, values, color=[COLORS["raw"], COLORS["toolrelay"], COLORS["peer"]])
    _bar_labels(ax, bars)
    ax.set_ylabel("HTTP calls per second")
    ax.set_title(f"Draining {tp['toolrelay']['n']:,} POSTs, concurrency 64")
    ax.set_ylim(0, max(values) * 1.15)


def _scaling(ax: Axes, scaling: list[dict[str, Any]], tp: dict[str, Any] | None) -> None:
    workers = [str(s["workers"]) for s in scaling]
    values = [s["per_s"] for s in scaling]
    bars = ax.bar(workers, values, color=COLORS["toolrelay"], label="toolrelay")
    _bar_labels(ax, bars)
    top = max(values)
    if tp:
        ax.axhline(
            tp["peer"]["per_s"], color=COLORS["peer"], ls="--", label="procrastinate, 1 worker"
        )
        top = max(top, tp["peer"]["per_s"])
    for bar, s in zip(bars, scaling, strict=True):
        busy = s.get("cores", {}).get("machine")
        if busy is not None:
            ax.text(
                bar.get_x() + bar.get_width() / 2,
                top * 0.05,
                f"CPU\n{busy:.1f}/2",
                ha="center",
                color="white",
                fontsize=8,
            )
    ax.set_xlabel("worker processes")
    ax.set_ylabel("invocations per second")
    ax.set_title("Throughput against worker processes (2 cores)")
    ax.set_ylim(0, top * 1.2)
    ax.legend(loc="upper left", fontsize=8)


def _latency(ax: Axes, latency: list[dict[str, Any]]) -> None:
    for r in latency:
        color = RATE_COLORS.get(r["rate"], "black")
        for key, style, what in (
            ("samples_request_ms", "-", "request"),
            ("samples_finish_ms", ":", "finished"),
        ):
            values = sorted(v for v in r[key] if v > 0)
            if not values:
                continue
            ys = [(i + 1) / len(values) * 100 for i in range(len(values))]
            offered = f"{r['rate']:,}/s"
            if r["achieved_per_s"] < r["rate"] * 0.95:
                offered += f" (achieved {r['achieved_per_s']:,.0f}/s)"
            label = f"{offered} → {what}"
            ax.plot(values, ys, ls=style, color=color, label=label)
    # Targets as points on the CDF: (latency, percentile) a curve must pass left of.
    marks = (
        (TARGET_P50_200_MS, 50, RATE_COLORS[200], "o", f"target @200/s: p50 ≤ {TARGET_P50_200_MS:g} ms"),
        (TARGET_P99_200_MS, 99, RATE_COLORS[200], "s", f"target @200/s: p99 ≤ {TARGET_P99_200_MS:g} ms"),
        (TARGET_P99_1000_MS, 99, RATE_COLORS[1000], "s", f"target @1,000/s: p99 ≤ {TARGET_P99_1000_MS:g} ms"),
    )  # fmt: skip
    for x, y, color, marker, label in marks:
        ax.plot([x], [y], marker=marker, ms=7, mfc="white", mec=color, mew=1.5, ls="", label=label)
    ax.axhline(99, color="#a0aec0", lw=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("ms after created_at (log scale)")
    ax.set_ylabel("% of invocations")
    ax.set_title("Latency, one worker: CDF from created_at")
    ax.set_ylim(0, 101)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=7, frameon=False)
    ax.grid(True, which="both", alpha=0.25)


def render(results: dict[str, Any], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=FIGSIZE_IN, dpi=DPI)
    tp = results.get("throughput")
    if tp:
        _throughput(axes[0], tp)
    if results.get("scaling"):
        _scaling(axes[1], results["scaling"], tp)
    if results.get("latency_samples"):
        _latency(axes[2], results["latency_samples"])
    meta = results["meta"]
    noise = meta.get("noise", {})
    fig.suptitle(
        f"toolrelay dispatcher benchmark, {meta['mode']} run — {meta['date']}, "
        f"{meta['machine']['nproc']} cores, PostgreSQL {meta['machine']['postgres'].split()[0]}, "
        f"other load before/after the run: {noise.get('idle_cores_before', 0):.1f}/"
        f"{noise.get('idle_cores_after', 0):.1f} cores",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
