"""A deliberately broken worker: approvals bind nothing. For the chaos run's self-test only.

``python -m toolrelay.chaos.unbound worker …`` is the ordinary worker with the checks that
tie a call to what was approved turned off: the request digest, the configuration
fingerprint, and gating decided again at claim. An approved call is then sent as it
renders at claim, whatever the owner changed since, and a call made while its tool was
ungated is sent after the owner gated it — which ``requests_as_approved`` must catch (the
binding probe makes both happen every run). The switch lives here, not in the dispatcher,
so no production code path can turn it on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolrelay.dispatch import executor
from toolrelay.dispatch.outcome import Outcome
from toolrelay.dispatch.template import RenderedRequest

_precheck = executor.precheck


def unbound_precheck(row: Mapping[str, Any]) -> Outcome | None:
    """The real precheck, told that the configuration is the one the call was made with
    and that the tool is not gated now."""
    return _precheck(
        {**row, "current_fingerprint": row.get("config_fingerprint"), "gated_now": False}
    )


def unbound_check_digest(row: Mapping[str, Any], rendered: RenderedRequest) -> Outcome | None:
    return None


def unbind() -> None:
    """Patch the executor module: it looks both functions up at every call."""
    executor.precheck = unbound_precheck
    executor.check_digest = unbound_check_digest


if __name__ == "__main__":
    unbind()
    from toolrelay.cli.main import app

    app()
