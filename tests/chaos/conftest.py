"""The chaos upstream on loopback, answering every request 2xx."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from toolrelay.chaos.upstream import ChaosUpstream


@pytest.fixture
async def upstream() -> AsyncIterator[ChaosUpstream]:
    server = ChaosUpstream(seed=1, timeout_seconds=5.0, blocked_targets=[], weights={"ok": 1})
    await server.start()
    yield server
    await server.close()
