"""Settings of one chaos run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

UNSAFE_NO_FENCING_ENV = "TOOLRELAY_TEST_UNSAFE_NO_FENCING"


@dataclass
class ChaosConfig:
    invocations: int = 10_000
    workers: int = 4  # worker processes besides the final --drain one; at least 2
    concurrency: int = 32  # per worker
    lease_seconds: float = 3.0
    create_seconds: float = 60.0  # invocations are created over this long
    kill_every: float = 3.0  # seconds between SIGKILLs of a random worker
    stall_every: float = 15.0  # seconds between SIGSTOPs (past the lease) of a random worker
    db_restart: bool = False
    seed: int = 1
    tool_timeout: float = 1.0  # timeout_seconds of the chaos tools
    approval_ttl: float = 8.0  # approval_ttl_seconds of the tool left partly unapproved
    probe_invocations: int = 8  # the stale-lease probe
    settle_seconds: float = 10.0  # faults go on this long after the last invocation
    quiesce_timeout: float = 120.0
    drain_timeout: float = 180.0
    token_failure_rate: float = 0.25
    mutate_every: float = 1.0  # seconds between owner mutations, while invocations are created
    max_mutations: int = 80
    binding_probe: int = 6  # calls approved, then changed before any worker runs
    unsafe_no_fencing: bool = False
    unsafe_no_binding: bool = False  # workers send approved calls as they render at claim
    server_url: str | None = None  # None: DATABASE_URL, else an embedded server
    out_dir: Path = field(default_factory=lambda: Path("chaos-out"))
    report_path: Path = field(default_factory=lambda: Path("chaos-report.json"))
    keep_database: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        if self.workers < 2:
            raise ValueError(
                "--workers must be at least 2 (the probe needs a stalled and a live one)"
            )
        if self.invocations < 0:
            raise ValueError("--invocations must not be negative")
        if self.lease_seconds < 1:
            raise ValueError("--lease-seconds must be at least 1")
        if self.mutate_every <= 0 or self.max_mutations < 0:
            raise ValueError("mutate_every must be positive and max_mutations not negative")

    @classmethod
    def quick(cls, **overrides: Any) -> ChaosConfig:
        """The CI run: about 1,000 invocations, a few kills and stalls, no database restart."""
        settings: dict[str, Any] = {
            "invocations": 1000,
            "workers": 3,
            "lease_seconds": 2.0,
            "create_seconds": 15.0,
            "kill_every": 3.0,
            "stall_every": 8.0,
            "settle_seconds": 5.0,
            "approval_ttl": 6.0,
            "mutate_every": 0.5,
            "max_mutations": 40,
        }
        return cls(**(settings | overrides))

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        data["out_dir"] = str(self.out_dir)
        data["report_path"] = str(self.report_path)
        data["server_url"] = "(set)" if self.server_url else None
        return data
