"""The owner mutations write valid configurations, each rendering differently, and the
deliberately broken worker differs from the real one by the binding checks only."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.records import claim_row, tool_row
from toolrelay.chaos import unbound
from toolrelay.chaos.mutations import (
    DEFAULT_MARK,
    binding_change,
    hosts_variants,
    regating_change,
    tool_change,
)
from toolrelay.chaos.scenario import TOOLS
from toolrelay.chaos.workers import WorkerPool
from toolrelay.dispatch import executor
from toolrelay.dispatch.executor import build_request, request_digest
from toolrelay.registry.validation import check_tool

BASE = "http://127.0.0.1:8080"
INPUT = {"n": 3, "text": "x y", "chaos": "ok"}


@pytest.mark.parametrize("plan", TOOLS, ids=lambda p: p.key)
def test_every_mutation_is_valid_and_renders_anew(plan: Any) -> None:
    row = tool_row(BASE, plan.key, plan.method, name=plan.key, is_dangerous=False)
    if plan.gated:
        row |= {"egress_class": "write", "requires_approval": True}
    seen = {request_digest(build_request(row | {"id": "i", "input": INPUT}))}
    for rev in range(1, 13):
        kind = ("gate", "template", "defaults", "endpoint")[rev % 4]
        row = row | tool_change(kind, row, rev, BASE)
        check_tool(row)  # what Registry.update_tool checks after writing
        rendered = build_request(row | {"id": "i", "input": INPUT})
        assert DEFAULT_MARK not in str(rendered)
        digest = request_digest(rendered)
        assert digest not in seen, (rev, kind)
        seen.add(digest)
        assert rendered.url.startswith(f"{BASE}/api/{plan.key}")


def test_gate_toggles_both_ways() -> None:
    read = tool_row(BASE, "r", "GET", is_dangerous=False)
    gated = read | tool_change("gate", read, 1, BASE)
    assert gated["requires_approval"] is True
    assert (gated | tool_change("gate", gated, 2, BASE))["requires_approval"] is False
    write = tool_row(BASE, "w", "POST", is_dangerous=False)
    assert tool_change("gate", write, 1, BASE)["egress_class"] == "write"


def test_probe_changes_and_host_bindings() -> None:
    bind = tool_row(BASE, "chaos.bind", "POST", egress_class="write", is_dangerous=False)
    before = request_digest(build_request(bind | {"id": "i", "input": INPUT}))
    changed = bind | binding_change("binding probe", bind, 1, BASE)
    check_tool(changed)
    assert request_digest(build_request(changed | {"id": "i", "input": INPUT})) != before
    assert regating_change("re-gating probe", bind, 1, BASE)["requires_approval"] is True
    assert hosts_variants(0, 8080) == [["127.0.0.1:8080"]]
    assert hosts_variants(1, 8080) == [["127.0.0.1:8081"], ["127.0.0.1"]]


def approved_row(**fields: Any) -> dict[str, Any]:
    row = claim_row(tool_row(BASE, "t", "POST"), str(uuid.uuid4()), INPUT)
    return row | {"approval_status": "approved"} | fields


def test_the_unbound_worker_skips_only_the_binding_checks() -> None:
    changed = approved_row(config_fingerprint="old", current_fingerprint="new")
    assert executor.precheck(changed) is not None  # tool_changed
    assert unbound.unbound_precheck(changed) is None
    regated = approved_row(approval_status="not_required", gated_now=True)
    pending = executor.precheck(regated)
    assert pending is not None and pending.status == "pending"
    assert unbound.unbound_precheck(regated) is None
    rendered = build_request(changed)
    assert executor.check_digest(changed | {"request_digest": "0" * 64}, rendered) is not None
    assert unbound.unbound_check_digest(changed, rendered) is None
    # every other refusal stays
    for broken in (approved_row(tool_status="disabled"), approved_row(assignment_allowed=False)):
        assert executor.precheck(broken) == unbound.unbound_precheck(broken)


def test_unbind_patches_the_executor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "precheck", executor.precheck)  # restored afterwards
    monkeypatch.setattr(executor, "check_digest", executor.check_digest)
    unbound.unbind()
    assert executor.precheck is unbound.unbound_precheck
    assert executor.check_digest is unbound.unbound_check_digest


def test_the_pool_runs_the_module_it_is_given(tmp_path: Path) -> None:
    pool = WorkerPool(1, {}, tmp_path, 2.0, 4, module="toolrelay.chaos.unbound")
    assert pool.command()[:4] == [sys.executable, "-m", "toolrelay.chaos.unbound", "worker"]
    assert WorkerPool(1, {}, tmp_path, 2.0, 4).command()[2] == "toolrelay.cli"
