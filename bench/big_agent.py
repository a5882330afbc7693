"""An agent with many tools: what one MCP call costs it (issue 14, migration 0021).

``python -m bench.big_agent [--quick]``: two fresh databases on DATABASE_URL's server (else
an embedded one), one migrated up to 0020 (the row-level security policies as they were),
one migrated fully; in each an agent with 12 tools and one with 1,200 (GitHub's size),
then, for each, ``Registry.call`` as the agent (the MCP door's database work: the lookup
once, then one round trip with the insert and the agents' list stamp), and the stamp
alone. Median milliseconds of wall time per call, from this process; the same code and
the same machine for both schemas, rounds alternating.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.setup import create_database, drop_database, server_admin_url
from bench.tables import print_table as print_rows
from toolrelay.db import Database
from toolrelay.db.connect import owner_identity
from toolrelay.db.migrate import migrate
from toolrelay.registry import Registry, ToolSpec

SIZES = (12, 1200)
CALLS, QUICK_CALLS, ROUNDS = 60, 15, 3
BEFORE = "0020"  # the last migration before the policies were rewritten


def world(url: str, tools: int) -> tuple[Database, Registry]:
    """An owner's agent assigned ``tools`` tools; the registry acting as that agent."""
    db = Database(url)
    owner = Registry(db, uuid.uuid4())
    agent = owner.create_agent("big")
    owner.register_tools([
        ToolSpec.from_mapping({
            "key": f"gh.op_{i:04d}", "name": f"op {i}", "http_method": "GET",
            "endpoint_url": "http://127.0.0.1:9/x", "egress_class": "read_only",
            "schema_input": {"type": "object", "properties": {"q": {"type": "string"}}},
        })
        for i in range(tools)
    ])  # fmt: skip
    with db.as_owner(owner.owner) as conn:
        conn.execute("SELECT fn_assign_tool(%s, t.id, true) FROM agents.tools_registry t", (agent,))
    return db, Registry(db, owner.owner, agent_id=agent)


def per_call_ms(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(as_agent: Registry, calls: int) -> dict[str, float]:
    as_agent.call("gh.op_0001", {"q": "warm"})  # read once: the next calls are one trip
    stamp = ("SELECT agents.agent_tools_stamp(%(a)s)", {"a": as_agent.agent_id})
    identity = owner_identity(as_agent.owner, as_agent.agent_id)
    with as_agent.db.trips() as trips:
        stamp_ms = per_call_ms(lambda: trips.run(identity, [stamp]), calls)
    call_ms = per_call_ms(lambda: as_agent.call("gh.op_0001", {"q": "x"}), calls)
    return {"call_ms": call_ms, "stamp_ms": stamp_ms}


def main(quick: bool) -> list[dict[str, object]]:
    calls = QUICK_CALLS if quick else CALLS
    scratch = Path(tempfile.mkdtemp(prefix="toolrelay-big-agent-"))
    scratch.chmod(0o755)  # an embedded server runs as its own user
    admin_url, _, stop = server_admin_url(scratch)
    urls = {"before (0020)": create_database(admin_url, "big_before"),
            "after (0021)": create_database(admin_url, "big_after")}  # fmt: skip
    try:
        migrate(urls["before (0020)"], target=BEFORE)
        migrate(urls["after (0021)"])
        worlds = {(s, n): world(url, n) for s, url in urls.items() for n in SIZES}
        runs: dict[tuple[str, int], list[dict[str, float]]] = {key: [] for key in worlds}
        for _ in range(1 if quick else ROUNDS):
            for key, (_, as_agent) in worlds.items():
                runs[key].append(measure(as_agent, calls))
        rows = []
        for (schema, tools), measured in runs.items():
            row: dict[str, object] = {"schema": schema, "tools": tools}
            for name in ("call_ms", "stamp_ms"):
                row[name] = statistics.median(m[name] for m in measured)
            rows.append(row)
        for db, _ in worlds.values():
            db.close()
        return rows
    finally:
        for url in urls.values():
            drop_database(admin_url, url)
        stop()


def print_table(rows: list[dict[str, object]]) -> None:
    cells = [[str(r["schema"]), str(r["tools"]), f"{r['call_ms']:.2f}", f"{r['stamp_ms']:.2f}"]
             for r in rows]  # fmt: skip
    print_rows(["schema", "tools", "Registry.call ms", "stamp alone ms"], cells)


if __name__ == "__main__":
    print_table(main("--quick" in sys.argv[1:]))
