"""What PostgreSQL alone can do with the agent's statements: ``python -m bench.pg_rate
[--quick]`` (bench/RESULTS.md, "PostgreSQL's own rate").

bench/invoke.py drives its invokers from Python threads in the harness, whose CPU (0.2 to 0.6
of this machine's 2 cores) competes with the server it measures. Here pgbench (C: 10 to 40
µs of CPU a transaction, reported apart) sends the same one-round-trip strings the real code
sends (captured as in bench/instructions.py: BEGIN, the identity, the statement, COMMIT),
from 8 and from 32 connections, ROUNDS alternating rounds, with migration 0016's protocol on
(calls notify only while a worker sleeps: what a busy fleet sees) and, for the owner's
invoke, with every call notifying. Two floors made on the same server in the same run: an empty transaction and a
durable one-row INSERT into a table of one column, and one diagnostic: the owner's invoke
with ``synchronous_commit = off`` (what the WAL flush at each commit costs; never shipped).
Counted per row: transactions per second (median of the rounds, and each round), the whole
machine's CPU per transaction, and pgbench's own.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from psycopg import conninfo

from bench.constants import OUT_DIR
from bench.instructions import capture
from bench.procs import CLOCK_TICKS, cpu_sample
from bench.setup import admin, scratch_server
from bench.tables import md_table, print_table

CLIENTS = (8, 32)
ROUNDS = 3
SECONDS, QUICK_SECONDS = 6, 2
OUT_PATH = OUT_DIR / "pg-rate.json"
OWNER = "owner's invoke (Registry.invoke)"
FLOORS = {
    "empty transaction (floor)": "BEGIN; SELECT 1; COMMIT",
    "one-row INSERT, durable commit (floor)": (
        "BEGIN; INSERT INTO public.pg_rate_floor (n) VALUES (1); COMMIT"
    ),
}


def statements(admin_url: str, work: Path) -> tuple[str, dict[str, str]]:
    """The database the real code made and the strings its warm calls send, by row label."""
    out = work / "captured.json"
    capture(admin_url, "pgrate", out)
    got = json.loads(out.read_text())
    sent = got["statements"]
    owner = sent["invoke_owner"]
    assert owner.startswith("BEGIN; "), owner[:40]
    rows = {
        "agent's call (Registry.call)": sent["call"],
        OWNER: owner,
        "owner's invoke, synchronous_commit off (diagnostic)": owner.replace(
            "BEGIN; ", "BEGIN; SET LOCAL synchronous_commit = off; ", 1
        ),
        "token check (authenticate_token)": sent["token"],
    }
    return got["dbname"], FLOORS | rows


def pgbench(url: str, sql: str, clients: int, seconds: int, work: Path) -> dict[str, float]:
    """One pgbench run of ``sql`` as one round trip (its statements joined by ``\\;``)."""
    script = work / "script.sql"
    script.write_text(sql.replace("; ", " \\; ") + "\n")
    cmd = ["pgbench", "-n", "-M", "simple", "-f", str(script), "-c", str(clients), "-j", "2",
           "-T", str(seconds), url]  # fmt: skip
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = cpu_sample()
    done = subprocess.run(cmd, capture_output=True, text=True)
    after = cpu_sample()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode or "number of failed transactions: 0" not in done.stdout:
        raise RuntimeError(f"pgbench failed: {done.stdout[-800:]}{done.stderr[-800:]}")
    count = int(next(ln for ln in done.stdout.splitlines() if "processed:" in ln).split()[-1])
    client = used.ru_utime + used.ru_stime - own.ru_utime - own.ru_stime
    return {
        "tps": count / seconds,
        "machine_us": (after.busy - before.busy) / CLOCK_TICKS / count * 1e6,
        "pgbench_us": client / count * 1e6,
    }


def _reset(url: str, notify_all: bool) -> None:
    with admin(url) as conn:
        conn.execute("TRUNCATE agents.tool_invocations CASCADE")
        conn.execute("UPDATE agents.dispatch_wake SET sleepers_only = %s", (not notify_all,))
        conn.execute("DELETE FROM agents.dispatch_sleepers")
        conn.execute("TRUNCATE public.pg_rate_floor")


def main(quick: bool) -> list[dict[str, Any]]:
    if shutil.which("pgbench") is None:
        print("skipped: pgbench is not installed (Debian's postgresql-client)")
        return []
    seconds = QUICK_SECONDS if quick else SECONDS
    with scratch_server("toolrelay-pg-rate-") as server, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        name, sent = statements(server.admin_url, work)
        url = conninfo.make_conninfo(server.admin_url, dbname=name)
        server.databases.append(url)  # dropped at the end
        with admin(url) as conn:
            conn.execute("CREATE TABLE public.pg_rate_floor (n int)")
        cases = [(label, sql, False) for label, sql in sent.items()]
        cases.append((f"{OWNER}, every call notifying", sent[OWNER], True))
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(1 if quick else ROUNDS):
            for label, sql, notify_all in cases:
                for clients in CLIENTS:
                    _reset(url, notify_all)
                    one = pgbench(url, sql, clients, seconds, work)
                    runs.setdefault((label, clients), []).append(one)
    rows = [
        {"statement": label, "clients": clients,
         "tps": statistics.median(g["tps"] for g in each),
         "rounds": [round(g["tps"]) for g in each],
         "machine_us": statistics.median(g["machine_us"] for g in each),
         "pgbench_us": statistics.median(g["pgbench_us"] for g in each)}
        for (label, clients), each in runs.items()
    ]  # fmt: skip
    report(rows)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    OUT_PATH.write_text(json.dumps(rows, indent=2))
    return rows


def report(rows: list[dict[str, Any]]) -> None:
    head = ["statement", "connections", "transactions/s (median)", "rounds",
            "machine CPU µs/transaction", "pgbench µs"]  # fmt: skip
    cells = [[r["statement"], str(r["clients"]), f"{r['tps']:,.0f}",
              " / ".join(f"{t:,}" for t in r["rounds"]), f"{r['machine_us']:,.0f}",
              f"{r['pgbench_us']:,.0f}"] for r in rows]  # fmt: skip
    print_table(head, cells, "PostgreSQL's own rate (pgbench, one round trip a transaction)")
    print()
    print(md_table(head, cells))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.pg_rate")
    parser.add_argument("--quick", action="store_true", help="one round of 2 s per row")
    main(parser.parse_args().quick)
