"""Chaos testing of the dispatcher: faults on purpose, then invariants checked.

See docs/reliability.md. ``toolrelay chaos`` runs it; ``run_chaos`` is the same from Python.
"""

from toolrelay.chaos.checks import CheckResult, RunData, run_checks
from toolrelay.chaos.config import ChaosConfig
from toolrelay.chaos.runner import ChaosReport, run_chaos

__all__ = ["ChaosConfig", "ChaosReport", "CheckResult", "RunData", "run_chaos", "run_checks"]
