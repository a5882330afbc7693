"""PostgreSQL's instructions per call for each statement of the agent's round trip:
``python -m bench.instructions [--baseline-src DIR] [--calls K]`` (bench/RESULTS.md,
"PostgreSQL's instructions per call").

Seconds and cores on this shared 2-core machine move by 20% from one run to the next; a
count of instructions (valgrind's callgrind) is the same each time for the same binary and
input, whatever else the machine does. Each statement, captured from the real code as
psycopg sends it (one simple-query string: BEGIN, the identity, the call, COMMIT), runs
WARM and WARM + K times in a single-user backend of the embedded PostgreSQL (pgserver's
build); the difference over K is one call, without the backend's start, catalog loading
and function compilation. ``--baseline-src DIR``: the ``toolrelay`` package of another
commit (``git archive <commit> src | tar -x -C DIR``, then DIR/src), migrated, provisioned
and captured the same way in its own database, and measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.constants import AGENT_NAME, REPO_DIR, TOOL_KEY
from bench.setup import embedded_server
from bench.tables import md_table, print_table

WARM = 20  # calls before the counted ones: compiles the functions, fills the caches
CALLS = 100  # K: the counted calls
# What the round trip sends, in order of an agent's call through MCP or the API.
LABELS = {
    "token": "token check (authenticate_token)",
    "call": "agent's call (Registry.call: lookup and insert)",
    "invoke_agent": "agent's invoke by ids (invoke_seen)",
    "invoke_owner": "owner's invoke (Registry.invoke)",
}


def capture(admin_url: str, label: str, out: Path) -> None:
    """In a subprocess whose PYTHONPATH starts with the src/ under test: a database migrated
    and provisioned by that code, and the SQL its warm calls send (psycopg's ClientCursor
    carries every one-round-trip transaction, db/connect.py's Trips)."""
    import psycopg

    from bench.setup import create_database, provision
    from toolrelay.db import Database
    from toolrelay.registry import Registry
    from toolrelay.tokens import Authenticator, TokenStore

    url = create_database(admin_url, label)
    fx = provision(url, "http://127.0.0.1:9/")
    db = Database(url, pool_size=1)
    owner = Registry(db, fx.owner)
    agent = Registry(db, fx.owner, agent_id=str(fx.agent_id))
    _, token = TokenStore(db).create(fx.owner, agent_id=fx.agent_id)
    auth = Authenticator(db)
    calls: dict[str, Callable[[], object]] = {
        "token": lambda: auth.authenticate(token),
        "call": lambda: agent.call(TOOL_KEY, {"n": 1}),
        "invoke_agent": lambda: agent.invoke(str(fx.agent_id), str(fx.tool_id), {"n": 1}),
        "invoke_owner": lambda: owner.invoke(AGENT_NAME, TOOL_KEY, {"n": 1}),
    }
    sent: list[str] = []
    execute = psycopg.ClientCursor.execute

    def record(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    statements = {}
    psycopg.ClientCursor.execute = record  # type: ignore[method-assign]
    try:
        for name, call in calls.items():
            call()  # the cold path reads the tool first; the warm one sends one string
            sent.clear()
            call()
            [statements[name]] = sent
    finally:
        psycopg.ClientCursor.execute = execute  # type: ignore[method-assign]
        db.close()
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    out.write_text(json.dumps({"dbname": dbname, "statements": statements}))


def instructions(postgres: Path, pgdata: Path, dbname: str, sql: str, n: int, work: Path) -> int:
    """callgrind's instruction count for a single-user backend running ``sql`` n times."""
    script = work / f"{uuid.uuid4().hex}.sql"
    script.write_text((sql.replace("\n", " ") + "\n") * n)
    counts = work / f"{script.stem}.callgrind"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counts}",
           str(postgres), "--single", "-D", str(pgdata), dbname]  # fmt: skip
    user = "pgserver" if os.geteuid() == 0 else None  # pgserver's own user when run as root
    with script.open() as stdin:
        done = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True, user=user)
    if "ERROR" in done.stdout or done.returncode:
        raise RuntimeError(f"the single-user backend failed: {done.stdout[-2000:]}")
    for line in done.stderr.splitlines():  # "==pid== Collected : 123"
        if "Collected :" in line:
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"no count from callgrind: {done.stderr[-2000:]}")


def main(baseline: Path | None, calls: int) -> dict[str, Any]:
    if shutil.which("valgrind") is None:
        print("skipped: valgrind is not installed (Debian's package valgrind)")
        return {}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver._commands import POSTGRES_BIN_PATH

    sources = {"current": REPO_DIR / "src"} | ({"baseline": baseline} if baseline else {})
    with tempfile.TemporaryDirectory(prefix="toolrelay-instructions-") as tmp:
        scratch = Path(tmp)
        work = scratch / "work"
        work.mkdir(mode=0o777)
        work.chmod(0o777)  # the backend's user writes its counts here
        admin_url, _, stop = embedded_server(scratch)
        captured: dict[str, dict[str, Any]] = {}
        try:
            for name, src in sources.items():
                out = scratch / f"{name}.json"
                env = os.environ | {"PYTHONPATH": f"{src}{os.pathsep}{REPO_DIR}"}
                subprocess.run(
                    [sys.executable, "-m", "bench.instructions", "--capture",
                     admin_url, name, str(out)],
                    env=env, check=True, cwd=REPO_DIR,
                )  # fmt: skip
                captured[name] = json.loads(out.read_text())
        finally:
            stop()  # single-user mode needs the data directory to itself
        per_call: dict[str, dict[str, int]] = {}
        for name, got in captured.items():
            per_call[name] = {}
            for label, sql in got["statements"].items():
                args = (POSTGRES_BIN_PATH / "postgres", scratch / "pgdata", got["dbname"], sql)
                low = instructions(*args, WARM, work)
                high = instructions(*args, WARM + calls, work)
                per_call[name][label] = (high - low) // calls
    report(per_call)
    return per_call


def report(per_call: dict[str, dict[str, int]]) -> None:
    head = ["statement", *(f"{name} (instructions/call)" for name in per_call)]
    if "baseline" in per_call:
        head.append("current / baseline")
    rows = []
    for label, text in LABELS.items():
        cells = [f"{per_call[name][label]:,}" for name in per_call]
        if "baseline" in per_call:
            cells.append(f"{per_call['current'][label] / per_call['baseline'][label]:.2f}x")
        rows.append([text, *cells])
    print_table(head, rows, "PostgreSQL's instructions per call (callgrind, single-user backend)")
    print()
    print(md_table(head, rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.instructions")
    parser.add_argument("--baseline-src", type=Path, help="another commit's src/, measured too")
    parser.add_argument("--calls", type=int, default=CALLS, help="counted calls per statement")
    parser.add_argument("--capture", nargs=3, metavar=("ADMIN_URL", "LABEL", "OUT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.capture:
        capture(args.capture[0], args.capture[1], Path(args.capture[2]))
    else:
        main(args.baseline_src, args.calls)
