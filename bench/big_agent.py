"""An agent with many tools: what one MCP call costs it (issue 14, migrations 0021, 0035).

``python -m bench.big_agent [--quick]``: fresh databases on DATABASE_URL's server (else an
embedded one), one per schema level in ``LEVELS``: 0034 (the list stamp hashed over every
tool the agent may call) and fully migrated (0035: the stamp is the agent's tools version);
in each an agent with 12 tools and one with
1,200 (GitHub's size), then, for each, ``Registry.call`` as the agent (the MCP door's
database work: the lookup once, then one round trip with the insert and the agent's list
stamp), the stamp alone, and two writes by the owner that renew the stamp since 0035: one
tool's description (``Registry.update_tool``) and every tool's in one plain SQL UPDATE.
Median milliseconds of wall time per operation, from this process; the same code and the
same machine for every schema, rounds alternating.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable

from bench.setup import scratch_server
from bench.tables import print_table as print_rows
from toolrelay.db import Database
from toolrelay.db.connect import owner_identity
from toolrelay.db.migrate import migrate
from toolrelay.registry import Registry, ToolSpec

SIZES = (12, 1200)
CALLS, QUICK_CALLS, ROUNDS = 60, 15, 3
# label -> the last migration applied (None: all): 0034, before the stamp became a version
# (0035). 0020 (before 0021's policies) no longer runs today's Registry.call (it needs
# 0028's functions): RESULTS.md keeps the 0020/0021 runs made with the code of their day.
LEVELS: dict[str, str | None] = {"0034": "0034", "latest": None}
WRITES, QUICK_WRITES = 10, 4


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


def measure(as_agent: Registry, calls: int, writes: int) -> dict[str, float]:
    as_agent.call("gh.op_0001", {"q": "warm"})  # read once: the next calls are one trip
    stamp = ("SELECT agents.agent_tools_stamp(%(a)s)", {"a": as_agent.agent_id})
    identity = owner_identity(as_agent.owner, as_agent.agent_id)
    with as_agent.db.trips() as trips:
        stamp_ms = per_call_ms(lambda: trips.run(identity, [stamp]), calls)
    call_ms = per_call_ms(lambda: as_agent.call("gh.op_0001", {"q": "x"}), calls)
    owner = Registry(as_agent.db, as_agent.owner)
    n = iter(range(10**9))
    update_ms = per_call_ms(
        lambda: owner.update_tool("gh.op_0002", {"description": f"d{next(n)}"}), writes
    )

    def update_all() -> None:
        with as_agent.db.as_owner(as_agent.owner) as conn:
            conn.execute("UPDATE agents.tools_registry SET description = %s", (f"d{next(n)}",))

    update_all_ms = per_call_ms(update_all, max(1, writes // 2))
    return {"call_ms": call_ms, "stamp_ms": stamp_ms, "update_ms": update_ms,
            "update_all_ms": update_all_ms}  # fmt: skip


def main(quick: bool) -> list[dict[str, object]]:
    calls = QUICK_CALLS if quick else CALLS
    writes = QUICK_WRITES if quick else WRITES
    with scratch_server("toolrelay-big-agent-") as server:
        urls = {label: server.database(f"big_{label}") for label in LEVELS}
        for label, target in LEVELS.items():
            migrate(urls[label], target=target)
        worlds = {(s, n): world(url, n) for s, url in urls.items() for n in SIZES}
        runs: dict[tuple[str, int], list[dict[str, float]]] = {key: [] for key in worlds}
        for _ in range(1 if quick else ROUNDS):
            for key, (_, as_agent) in worlds.items():
                runs[key].append(measure(as_agent, calls, writes))
        for db, _ in worlds.values():
            db.close()
    rows = []
    for (schema, tools), measured in runs.items():
        row: dict[str, object] = {"schema": schema, "tools": tools}
        for name in measured[0]:
            row[name] = statistics.median(m[name] for m in measured)
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    names = ("call_ms", "stamp_ms", "update_ms", "update_all_ms")
    cells = [[str(r["schema"]), str(r["tools"]), *(f"{r[name]:.2f}" for name in names)]
             for r in rows]  # fmt: skip
    print_rows(
        ["schema", "tools", "Registry.call ms", "stamp alone ms", "update 1 tool ms",
         "update all tools ms"],
        cells,
    )  # fmt: skip


if __name__ == "__main__":
    print_table(main("--quick" in sys.argv[1:]))
