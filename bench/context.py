"""What every phase needs: the database and fixture, the upstream, where logs go."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.constants import Sizes
from bench.procs import Child, Timeline
from bench.setup import Fixture
from bench.upstream import UpstreamProcess
from bench.workers import WorkerLaunch


@dataclass
class Context:
    sizes: Sizes
    quick: bool
    fx: Fixture
    peer_url: str
    upstream: UpstreamProcess
    logs: Path
    home: Path
    timeline: Timeline
    running: list[Child] = field(default_factory=list)  # the timeline's "system under test"
    worker_source: Path | None = None  # the src/ the workers run: a snapshot, or --worker-src

    def launch(self, drain: bool = True) -> WorkerLaunch:
        return WorkerLaunch(self.fx, self.logs, self.home, drain=drain, source=self.worker_source)

    def sample_memory(self) -> None:
        for child in list(self.running):
            child.sample_hwm()

    def sut_pids(self) -> list[int]:
        return [child.pid for child in self.running if child.usage is None]

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Average cores over an epoch window: machine, system under test, upstream, postgres."""
        return self.timeline.cores(start, end)
