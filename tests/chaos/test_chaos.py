"""A small chaos run passes; the same run with lease fencing removed, or with approvals
bound to nothing, must fail.

The second half is what makes the first mean something: a check that cannot fail proves
nothing. Removing fencing (TOOLRELAY_TEST_UNSAFE_NO_FENCING=1, set by --unsafe-no-fencing)
lets a worker frozen past its lease record its late result over the rescuer's. The run's
stale-lease probe makes that happen every time, not by luck: see docs/reliability.md.
Unbinding approvals (the toolrelay.chaos.unbound worker) sends an approved call as it
renders at claim, and a call made ungated after its tool was gated; the binding probe makes
both happen every time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolrelay.chaos import ChaosConfig, ChaosReport, run_chaos
from toolrelay.chaos.mutations import KINDS
from toolrelay.chaos.report import write_json

FENCING_CHECKS = {"result_from_last_claim", "stale_lease_probe"}


def small_run(admin_url: str, out: Path, unsafe: bool, unbound: bool = False) -> ChaosConfig:
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
        mutate_every=0.25,
        probe_invocations=6,
        quiesce_timeout=60.0,
        drain_timeout=60.0,
        seed=7,
        server_url=admin_url,
        out_dir=out,
        report_path=out / "chaos-report.json",
        unsafe_no_fencing=unsafe,
        unsafe_no_binding=unbound,
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
    assert all(numbers["mutations"].get(kind, 0) >= 1 for kind in KINDS), numbers["mutations"]
    probe = numbers["binding_probe"]
    assert probe["refused_unsent"] == probe["waited_for_approval"] == cfg.binding_probe
    assert probe["changed_sent"] == probe["gated_sent_unapproved"] == 0


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


async def test_with_approvals_unbound_the_chaos_check_fails(admin_url: str, tmp_path: Path) -> None:
    cfg = small_run(admin_url, tmp_path, unsafe=False, unbound=True)
    report = await run_chaos(cfg)
    assert report.error is None, report.error
    broken = failed(report)
    assert "requests_as_approved" in broken, broken
    probe = report.numbers["binding_probe"]
    assert probe["changed_sent"] == probe["gated_sent_unapproved"] == cfg.binding_probe
    # The probe's calls are the first made: their violations come first, one each.
    check = next(c for c in report.checks if c.name == "requests_as_approved")
    assert check.violation_count >= 2 * cfg.binding_probe
    first = check.violations[: 2 * cfg.binding_probe]
    assert (
        sum("(chaos.bind)" in v and "received a different request" in v for v in first)
        == cfg.binding_probe
    )
    assert (
        sum("(chaos.regate)" in v and "closest configuration r1" in v for v in first)
        == cfg.binding_probe
    )


def test_a_run_needs_two_workers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ChaosConfig(workers=1, out_dir=tmp_path)
