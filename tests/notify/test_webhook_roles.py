"""A webhook's URL can be its credential (a Slack incoming webhook's path is the secret):
only admins read or change subscriptions, and the audit log records their changes without
the URL (migration 0027)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from toolrelay.credentials import Keyring
from toolrelay.db import Database
from toolrelay.errors import PermissionDenied
from toolrelay.notify.subscriptions import Webhooks
from toolrelay.registry.members import Members
from toolrelay.tokens import Caller

SLACK = "https://hooks.slack.example/services/T0/B0/s3cr3t-path-token"


def test_only_admins_see_subscriptions_and_the_log_has_no_url(
    owner: SimpleNamespace, ndb: Database, keyring: Keyring
) -> None:
    members = Members(ndb)
    viewer = members.add(owner.id, "Vic", "viewer")
    approver = members.add(owner.id, "Ann", "approver")
    made, _secret = owner.webhooks.add(SLACK, ["invocation.pending"], "slack")
    assert [w["url"] for w in owner.webhooks.list()] == ["https://hooks.slack.example/…"]  # admin
    for member in (viewer, approver):
        hooks = Webhooks(ndb, Caller(owner=owner.id, member_id=member.id), keyring)
        assert hooks.list() == []  # not even the URL
        with pytest.raises(PermissionDenied, match="needs the admin role"):
            hooks.add("https://example.test/hook", ["invocation.pending"])
    with ndb.as_owner(owner.id) as conn:
        logged = conn.execute(
            "SELECT action, changes FROM agents.config_audit WHERE kind = 'webhook'"
            " AND object_id = %s", (made["id"],),
        ).fetchall()  # fmt: skip
    assert [row["action"] for row in logged] == ["insert"]
    assert set(logged[0]["changes"]) == {"format", "events", "enabled", "created_at",
                                         "secret_rotated_at"}  # fmt: skip
    assert "s3cr3t" not in str(logged)
