"""Calls made in a process that runs a worker go to that worker directly (migration 0036).

``serve`` makes calls (the API's invoke, MCP's tools/call) and runs a worker in the same
event loop. Before making a call it reserves a slot of that worker; the call is inserted
already claimed for it (lease owner, lease, attempt 1), and handed over once committed: no
NOTIFY, no wake-up, no claim scan. Where the worker is full, stopping or absent, the call
is made as any other and notifies. If the process dies in between, the lease runs out and
any worker claims the call again, as after a worker that died holding it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from toolrelay.registry.service import Claim

if TYPE_CHECKING:
    from toolrelay.dispatch.worker import Worker

__all__ = ["HandOff"]


class HandOff:
    """The in-process worker's door, for this process's calls; used in its event loop."""

    def __init__(self) -> None:
        self.worker: Worker | None = None

    def reserve(self) -> Claim | None:
        """Before making a call: the claim to make it with, or None (made unclaimed)."""
        return self.worker.reserve() if self.worker is not None else None

    def settle(self, claim: Claim | None, invocation_id: UUID | None) -> None:
        """After making it (``invocation_id`` None: none was made)."""
        if claim is not None and self.worker is not None:
            self.worker.adopt(invocation_id)
