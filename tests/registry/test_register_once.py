"""Registering a tool upserts it once (found by the audit log's cost, 2026-12-01): written
``SELECT (fn_register_tool(...)).*`` PostgreSQL called the function once per column of its
row: 31 upserts a tool. 150 of Stripe's tools took 3.6 s to register (9.0 s with the audit
log of migration 0023); in FROM, 0.9 s (1.1 s)."""

from __future__ import annotations

import psycopg
from psycopg.rows import dict_row

from toolrelay.db.connect import owner_identity
from toolrelay.registry import Registry, ToolSpec
from toolrelay.registry.service import REGISTER_SQL, _adapt


def test_one_registration_is_one_insert_and_one_audit_row(
    registry: Registry, database_url: str
) -> None:
    spec = ToolSpec.from_mapping({
        "key": "once.get", "name": "once", "endpoint_url": "https://api.example.com/x",
        "http_method": "GET", "egress_class": "read_only",
    })  # fmt: skip
    params = {k: _adapt(k, v) for k, v in spec.as_dict().items()}
    role, sub, claims = owner_identity(registry.owner)
    # A connection of its own: a pooled one may carry counts of earlier transactions.
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        conn.execute(f"SET LOCAL ROLE {role}")
        conn.execute("SELECT set_config('request.jwt.claim.sub', %s, true),"
                     " set_config('request.jwt.claims', %s, true)", (sub, claims))  # fmt: skip
        conn.execute(REGISTER_SQL, params).fetchone()
        counts = conn.execute(
            "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables"
            " WHERE schemaname = 'agents' AND relname = 'tools_registry'"
        ).fetchone()
        audited = conn.execute(
            "SELECT count(*) AS n FROM agents.config_audit WHERE object_label = 'once.get'"
        ).fetchone()
    assert counts == {"n_tup_ins": 1, "n_tup_upd": 0}
    assert audited == {"n": 1}
