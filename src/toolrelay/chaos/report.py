"""The run's report: a JSON file and rich tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from toolrelay.chaos.runner import ChaosReport


def write_json(report: ChaosReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2, default=str) + "\n", "utf-8")


def render(report: ChaosReport, console: Console) -> None:
    numbers = report.numbers
    if numbers:
        console.print(_numbers_table(report))
        console.print(_outcomes_table(numbers))
    checks = Table(title="invariants", show_lines=False)
    checks.add_column("check")
    checks.add_column("", justify="center")
    checks.add_column("checked", justify="right")
    checks.add_column("what holds / what broke")
    for check in report.checks:
        mark = "[green]ok[/]" if check.ok else "[bold red]FAIL[/]"
        checks.add_row(check.name, mark, str(check.checked), check.summary)
        for violation in check.violations[:5]:
            checks.add_row("", "", "", f"[red]{_escape(violation)}[/]")
        if check.violation_count > 5:
            checks.add_row("", "", "", f"[red]… {check.violation_count - 5} more[/]")
    if report.checks:
        console.print(checks)
    if report.error:
        console.print(f"[bold red]run failed:[/] {_escape(report.error)}")
    verdict = "[bold green]PASSED[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(f"chaos {verdict} in {report.duration_seconds:.0f} s")


def _numbers_table(report: ChaosReport) -> Table:
    n: dict[str, Any] = report.numbers
    faults = n["faults"]
    table = Table(title="chaos run", show_header=False)
    table.add_column("what")
    table.add_column("value")
    rows = [
        ("date", f"{report.started_at} (revision {report.machine.get('revision')})"),
        (
            "machine",
            f"{report.machine.get('cpus')} cpu, {report.machine.get('platform')},"
            f" PostgreSQL {report.machine.get('postgresql')} ({report.machine.get('database')})",
        ),
        ("duration", f"{report.duration_seconds:.0f} s ({_phases(report.phases)})"),
        ("invocations", f"{n['invocations']} ({n['probe_invocations']} in the stale-lease probe)"),
        ("upstream requests", str(n["upstream_requests"])),
        ("attempt rows", str(n["attempt_rows"])),
        ("retries", str(n["retries"])),
        ("rescued leases", str(n["rescued_leases"])),
        ("stale results discarded", str(n["stale_results_discarded"])),
        ("writes processed 0/1/2+ times", _write_counts(n["writes_processed_n_times"])),
        (
            "faults",
            f"{faults['kills']} SIGKILL, {faults['stalls']} SIGSTOP past the lease,"
            f" {faults['db_restarts']} database restart(s)"
            + (f" ({faults['db_restart_seconds']} s)" if faults["db_restart_seconds"] else ""),
        ),
        ("blocked redirects", str(n["blocked_redirects_issued"])),
        (
            "token endpoint",
            f"{n['token_endpoint']['requests']} requests,"
            f" {sum(n['token_endpoint']['failures'].values())} failed on purpose",
        ),
        ("approvals", ", ".join(f"{k} {v}" for k, v in n["approvals"].items())),
        (
            "owner mutations",
            ", ".join(f"{k} {v}" for k, v in n["mutations"].items())
            + f" ({n['configurations_written']} tool configurations written)",
        ),
        ("binding probe", _binding(n["binding_probe"])),
        ("drain", f"exit {n['drain'].get('exit_code')} after {n['drain'].get('seconds')} s"),
    ]
    for key, value in rows:
        table.add_row(key, _escape(value))
    return table


def _outcomes_table(numbers: dict[str, Any]) -> Table:
    kinds = numbers["by_kind"]
    outcomes = sorted(set(kinds["write"]) | set(kinds["idempotent"]))
    table = Table(title="outcomes")
    table.add_column("status/error_code")
    table.add_column("writes", justify="right")
    table.add_column("reads & idempotent", justify="right")
    for outcome in outcomes:
        table.add_row(
            outcome, str(kinds["write"].get(outcome, 0)), str(kinds["idempotent"].get(outcome, 0))
        )
    return table


def _binding(probe: dict[str, int]) -> str:
    return (
        f"{probe['refused_unsent']} of {probe['approved_then_changed']} approved-then-changed"
        f" refused unsent, {probe['waited_for_approval']} of {probe['made_ungated_then_gated']}"
        " made-ungated-then-gated waited for approval"
    )


def _write_counts(counts: dict[str, int]) -> str:
    more = sum(v for k, v in counts.items() if int(k) >= 2)
    return f"{counts.get('0', 0)} / {counts.get('1', 0)} / {more}"


def _phases(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())


def _escape(text: str) -> str:
    return text.replace("[", r"\[")
