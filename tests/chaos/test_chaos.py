"""A small chaos run passes; the same run with lease fencing removed must fail.

The second half is what makes the first mean something: a check that cannot fail proves
nothing. Removing fencing (TOOLRELAY_TEST_UNSAFE_NO_FENCING=1, set by --unsafe-no-fencing)
lets a worker frozen past its lease record its late result over the rescuer's. The run's
stale-lease probe makes that happen every time, not by luck: see docs/reliability.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolrelay.chaos import ChaosConfig, ChaosReport, run_chaos
from toolrelay.chaos.report import write_json

FENCING_CHECKS = {"result_from_last_claim", "stale_lease_probe"}


def small_run(admin_url: str, out: Path, unsafe: bool) -> ChaosConfig:
    return ChaosConfig(
        invocations=200,
        workers=2,
        concurrency=16,
        lease_seconds=2.0,
        create_seconds=4.0,
        kill_every=2.0,
        stall_every=4.0,
        settle_seconds=2.0,
        approval_ttl=2.0,
        probe_invocations=6,
        quiesce_timeout=60.0,
        drain_timeout=60.0,
        seed=7,
        server_url=admin_url,
        out_dir=out,
        report_path=out / "chaos-report.json",
        unsafe_no_fencing=unsafe,
    )


def failed(report: ChaosReport) -> dict[str, list[str]]:
    return {c.name: c.violations for c in report.checks if not c.ok}


async def test_small_chaos_run_keeps_every_invariant(admin_url: str, tmp_path: Path) -> None:
    cfg = small_run(admin_url, tmp_path, unsafe=False)
    report = await run_chaos(cfg)
    write_json(report, cfg.report_path)
    assert report.error is None, report.error
    assert report.ok, failed(report)
    numbers = report.numbers
    assert numbers["faults"]["kills"] >= 1
    assert numbers["rescued_leases"] >= cfg.probe_invocations
    assert numbers["by_outcome"].get("failed/outcome_unknown", 0) >= 1
    assert numbers["writes_processed_n_times"].get("2", 0) == 0


async def test_without_fencing_the_chaos_check_fails(admin_url: str, tmp_path: Path) -> None:
    cfg = small_run(admin_url, tmp_path, unsafe=True)
    report = await run_chaos(cfg)
    assert report.error is None, report.error
    assert not report.ok
    broken = failed(report)
    assert set(broken) >= FENCING_CHECKS, broken
    probe = next(c for c in report.checks if c.name == "stale_lease_probe")
    assert probe.violation_count == cfg.probe_invocations  # every time, not by luck
    assert all("stale claim" in v for v in broken["result_from_last_claim"])


def test_a_run_needs_two_workers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ChaosConfig(workers=1, out_dir=tmp_path)
