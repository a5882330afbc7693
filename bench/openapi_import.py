"""``toolrelay import openapi`` on a GitHub-sized document (issue 15: ≤ 15 s, ≤ 300 MB).

``python -m bench.openapi_import [--quick] [--src DIR]``: bounded (a child per run, killed
after ``TIMEOUT_S``), no network, no database. ``--src``: import with another copy of src/
too (an older commit's, e.g. ``git archive <rev> src | tar -x -C /tmp/base``), for a
before/after in the same run.

The document is built here, deterministically, shaped like GitHub's ``api.github.com.json``
(no security, one absolute server): ``OPERATIONS`` operations on ``OPERATIONS / 2`` paths
(GET, and POST/PATCH/DELETE with a JSON body), ``SCHEMAS`` component schemas in families
that refer to each other (each tool's ``$defs`` holds a family and the shared ones, as
GitHub's ``repository`` holds ``simple-user`` and ``license-simple``), shared parameters and
responses by ``$ref``, OpenAPI 3.0 ``nullable``, descriptions of GitHub's length. Written as
JSON (and, for the YAML row, as YAML), then each child process times ``load_openapi`` and
``tools_from_openapi`` (every tool's schemas checked as registering checks them) and reports
its peak RSS (VmHWM, ``procs.peak_rss_mb``; ``ru_maxrss`` would keep the harness's peak
from before exec), then checks every tool's schemas again as
``Registry.register_tools`` does (the database round trips are not counted).

When the OpenAPI corpus is installed (``python -m tests.corpus.install``), the real GitHub
document (``@octokit/openapi``'s ``api.github.com.json``, 13 MB, 1,223 operations) is a row
too, imported with ``--auth bearer`` as its users would; without the corpus the row says so.

``--corpus [ci|all]``: every document of the corpus (tests/corpus/: the CI subset, or all
73), one child each: seconds, peak RSS, operations imported, skipped (by reason) or refused;
with ``--src``, the same figures for that code too. The request checks are the corpus
test's (tests/export/test_openapi_corpus.py; ``TOOLRELAY_CORPUS=all`` for all 73).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from bench.constants import REPO_DIR
from bench.procs import Child, peak_rss_mb, python_module
from bench.tables import print_table as print_rows

OPERATIONS: Final = 1200
SCHEMAS: Final = 2400
FAMILY: Final = 8  # schemas that refer to one another
SHARED: Final = 16  # schemas every family refers to (users, licenses, ...)
QUICK_FACTOR: Final = 8  # --quick: an eighth of the document
TIMEOUT_S: Final = 300
GOAL_S: Final = 15.0
GOAL_MB: Final = 300.0
OUT_PATH: Final = Path(__file__).parent / "out" / "openapi-import.json"
CORPUS_OUT_PATH: Final = Path(__file__).parent / "out" / "openapi-corpus.json"
SEED: Final = 15
WORDS: Final = [  # the descriptions' vocabulary
    "the", "repository", "owner", "pull", "request", "issue", "comment", "label", "milestone",
    "commit", "branch", "tag", "release", "workflow", "run", "job", "artifact", "check",
    "suite", "status", "deployment", "environment", "secret", "team", "member", "organization",
    "installation", "token", "scope", "event", "hook", "delivery", "page", "cursor"
]  # fmt: skip


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _schema(rng: random.Random, index: int, total: int) -> dict[str, Any]:
    family = SHARED + (index - SHARED) // FAMILY * FAMILY
    properties: dict[str, Any] = {
        "id": {"type": "integer", "format": "int64", "minimum": 1, "example": 42},
        "node_id": {"type": "string", "example": "MDQ6VXNlcjE="},
        "name": {"type": "string", "maxLength": 256, "description": _text(rng, 12)},
        "url": {"type": "string", "format": "uri", "pattern": "^https://"},
        "state": {"type": "string", "enum": ["open", "closed", "all"]},
        "created_at": {"type": "string", "format": "date-time"},
        "body": {"type": "string", "nullable": True, "description": _text(rng, 30)},
        "count": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
    }
    if index >= SHARED:
        properties["owner"] = {"$ref": f"#/components/schemas/s{rng.randrange(SHARED)}"}
        later = [j for j in range(index + 1, min(family + FAMILY, total))]
        if later:
            properties["items"] = {
                "type": "array",
                "items": {"$ref": f"#/components/schemas/s{rng.choice(later)}"},
            }
            properties["parent"] = {
                "allOf": [{"$ref": f"#/components/schemas/s{rng.choice(later)}"}],
                "nullable": True,
            }
    return {
        "title": f"S{index}",
        "description": _text(rng, 80),
        "type": "object",
        "properties": properties,
        "required": ["id", "node_id", "name", "url"],
    }


def _operation(rng: random.Random, method: str, index: int, target: int) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": f"things/{method}-{index}",
        "summary": _text(rng, 6),
        "description": _text(rng, 150),
        "tags": [rng.choice(WORDS)],
        "parameters": [{"$ref": "#/components/parameters/owner"}],
        "responses": {
            "200" if method == "get" else "201": {
                "description": "Response",
                "content": {
                    "application/json": {
                        "schema": {"$ref": f"#/components/schemas/s{target}"}
                        if method != "get" or index % 2
                        else {"type": "array", "items": {"$ref": f"#/components/schemas/s{target}"}}
                    }
                },
            },
            "404": {"$ref": "#/components/responses/not_found"},
        },
    }
    if method == "get":
        op["parameters"] += [
            {"$ref": "#/components/parameters/per-page"},
            {"$ref": "#/components/parameters/page"},
            {"name": "sort", "in": "query", "schema": {"type": "string", "enum": ["created", "updated"]}},
        ]  # fmt: skip
    else:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "description": _text(rng, 10)},
                    "labels": {"type": "array", "items": {"type": "string"}},
                    "assignee": {"$ref": f"#/components/schemas/s{rng.randrange(SHARED)}"},
                    "payload": {"$ref": f"#/components/schemas/s{target}"},
                },
                "required": ["title"],
            }}},
        }  # fmt: skip
    return op


def document(operations: int = OPERATIONS, schemas: int = SCHEMAS) -> dict[str, Any]:
    """The synthetic document (deterministic for given sizes)."""
    rng = random.Random(SEED)
    components = {f"s{i}": _schema(rng, i, schemas) for i in range(schemas)}
    paths: dict[str, Any] = {}
    writes = ("post", "patch", "delete")
    for index in range(operations // 2):
        target = SHARED + rng.randrange(schemas - SHARED)
        item = {
            "parameters": [{"$ref": "#/components/parameters/id"}],
            "get": _operation(rng, "get", index, target),
        }
        method = writes[index % 3]
        item[method] = _operation(rng, method, index, target)
        paths[f"/orgs/{{owner}}/things-{index}/{{id}}"] = item
    return {
        "openapi": "3.0.3",
        "info": {"title": "Synthetic GitHub-sized API", "version": "1.1.4"},
        "servers": [{"url": "https://api.example.com"}],
        "paths": paths,
        "components": {
            "schemas": components,
            "parameters": {
                "owner": {"name": "owner", "in": "path", "required": True,
                          "schema": {"type": "string"}, "description": "The account owner."},
                "id": {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}},
                "per-page": {"name": "per_page", "in": "query",
                             "schema": {"type": "integer", "default": 30, "maximum": 100}},
                "page": {"name": "page", "in": "query", "schema": {"type": "integer", "default": 1}},
            },
            "responses": {"not_found": {"description": "Resource not found", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/s0"}},
            }}},
        },
    }  # fmt: skip


def run(path: Path, server: str | None = None, auth: str | None = None) -> None:
    """In the child: import ``path`` as the CLI does (without the database); print JSON."""
    from toolrelay.errors import InvalidArgument
    from toolrelay.export import openapi
    from toolrelay.registry.validation import check_json_schema

    started = time.perf_counter()
    doc = openapi.load_openapi(path)
    loaded = time.perf_counter()
    options: dict[str, Any] = {"server": server, "auth": auth}
    plan_openapi = getattr(openapi, "plan_openapi", None)  # an older --src may not have it
    refused = None
    try:
        if plan_openapi is not None:
            plan = plan_openapi(doc, **options)
        else:
            plan = openapi.tools_from_openapi(doc, **options)
    except InvalidArgument as exc:
        plan, refused = openapi.ImportPlan(), exc.message
    if not plan.tools and refused is None:
        refused = "every operation skipped with its reason"
    mapped = time.perf_counter()
    for spec in plan.tools:  # registering checks every tool again (Registry.register_tools)
        check_json_schema("schema_input", spec.schema_input)
        check_json_schema("schema_output", spec.schema_output)
    checked = time.perf_counter()
    rss_mb = peak_rss_mb(os.getpid()) or 0.0  # VmHWM, exact: read before exiting
    print(json.dumps({
        "load_s": round(loaded - started, 2),
        "map_s": round(mapped - loaded, 2),
        "register_checks_s": round(checked - mapped, 2),
        "total_s": round(checked - started, 2),
        "peak_rss_mb": round(rss_mb, 1),
        "tools": len(plan.tools),
        "skipped": len(plan.skipped),
        "skipped_reasons": [line.partition(": ")[2] for line in plan.skipped],
        "refused": refused,
    }))  # fmt: skip


def _child(
    path: Path,
    source: Path,
    server: str | None = None,
    auth: str | None = None,
    log: Path | None = None,
) -> dict[str, Any]:
    env = os.environ | {"PYTHONPATH": f"{source}{os.pathsep}{REPO_DIR}"}
    extra = [*(["--server", server] if server else []), *(["--auth", auth] if auth else [])]
    argv = python_module("bench.openapi_import", "run", str(path), *extra)
    log = log or path.with_suffix(".log")
    child = Child("import", argv, env, log, capture_stdout=True)
    try:
        usage = child.wait(TIMEOUT_S)
    except TimeoutError:
        return {"error": f"over {TIMEOUT_S} s"}
    if usage.returncode != 0:
        return {"error": (child.tail().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(child.readline())
    return result


def main(quick: bool, baseline: Path | None) -> dict[str, Any]:
    import yaml

    factor = QUICK_FACTOR if quick else 1
    doc = document(OPERATIONS // factor, SCHEMAS // factor)
    here = REPO_DIR / "src"
    sources = {"current": here} | ({"baseline": baseline} if baseline else {})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {"json": Path(tmp) / "api.json", "yaml": Path(tmp) / "api.yaml"}
        files["json"].write_text(json.dumps(doc, indent=1))
        files["yaml"].write_text(yaml.safe_dump(doc, sort_keys=False))
        sizes = {kind: round(p.stat().st_size / 1e6, 1) for kind, p in files.items()}
        for name, source in sources.items():
            for kind, path in files.items():
                rows.append({"code": name, "format": kind} | _child(path, source))
        github = _github()
        if github is None:
            print(
                "real GitHub document: skipped, the corpus is not installed"
                " (python -m tests.corpus.install)"
            )
        else:
            for name, source in sources.items():
                log = Path(tmp) / f"github-{name}.log"
                row = _child(github.path(), source, github.server, github.auth, log)
                row.pop("skipped_reasons", None)
                rows.append({"code": name, "format": "github"} | row)
    ok = all(
        r.get("total_s", 1e9) <= GOAL_S and r.get("peak_rss_mb", 1e9) <= GOAL_MB
        for r in rows
        if r["code"] == "current"
    )
    return {
        "operations": OPERATIONS // factor,
        "schemas": SCHEMAS // factor,
        "document_mb": sizes,
        "goal": {"seconds": GOAL_S, "peak_rss_mb": GOAL_MB},
        "rows": rows,
        "within_goal": ok,
    }


def _github() -> Any:
    """The corpus's GitHub document, when installed."""
    from tests.corpus import ALL

    doc = next(d for d in ALL if d.member.endswith("api.github.com.json"))
    return doc if doc.path().is_file() else None


def corpus(which: str, baseline: Path | None) -> dict[str, Any]:
    """Every corpus document imported by the current code (and ``baseline``'s)."""
    from tests.corpus import documents
    from tests.corpus.check import categorize, operations

    from toolrelay.export.openapi_load import load_openapi

    sources = {"current": REPO_DIR / "src"} | ({"baseline": baseline} if baseline else {})
    rows: list[dict[str, Any]] = []
    totals: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for doc in documents(which):
            if not doc.path().is_file():
                raise SystemExit(f"{doc.name}: not installed (python -m tests.corpus.install)")
            count = sum(1 for _ in operations(load_openapi(doc.path()), doc.server, doc.auth))
            for name, source in sources.items():
                log = Path(tmp) / f"{len(rows)}.log"
                row = _child(doc.path(), source, doc.server, doc.auth, log)
                reasons: dict[str, int] = {}
                for reason in row.pop("skipped_reasons", []):
                    reasons[categorize(reason)] = reasons.get(categorize(reason), 0) + 1
                row = {"code": name, "document": doc.name, "operations": count} | row
                rows.append(row | {"skipped_by_reason": reasons})
                total = totals.setdefault(name, {"operations": 0, "tools": 0, "skipped": 0,
                                                 "refused": [], "skipped_by_reason": {}})  # fmt: skip
                total["operations"] += count
                total["tools"] += row.get("tools", 0)
                total["skipped"] += row.get("skipped", 0)
                if row.get("refused") or "error" in row:
                    total["refused"].append(doc.name)
                for why, n in reasons.items():
                    total["skipped_by_reason"][why] = total["skipped_by_reason"].get(why, 0) + n
    return {"corpus": which, "rows": rows, "totals": totals}


def print_corpus(out: dict[str, Any]) -> None:
    rows = [
        [r["code"], r["document"][:44], str(r["operations"]), str(r.get("tools", 0)),
         str(r.get("skipped", 0)), f"{r.get('total_s', 0):.1f}", f"{r.get('peak_rss_mb', 0):.0f}",
         (f"REFUSED: {r['refused'][:60]}" if r.get("refused") else r.get("error", ""))]
        for r in out["rows"]
    ]  # fmt: skip
    print_rows(["code", "document", "ops", "tools", "skip", "s", "MB", "note"], rows)
    for code, t in out["totals"].items():
        share = t["tools"] / t["operations"] if t["operations"] else 0
        print(
            f"{code}: {t['operations']} operations, {t['tools']} imported ({share:.1%}),"
            f" {t['skipped']} skipped with a reason, {len(t['refused'])} documents refused"
            f" ({', '.join(t['refused'])})"
        )
        for why, n in sorted(t["skipped_by_reason"].items(), key=lambda kv: -kv[1]):
            print(f"    {n:5} {why}")


def print_table(out: dict[str, Any]) -> None:
    print(
        f"{out['operations']} operations, {out['schemas']} schemas;"
        f" JSON {out['document_mb']['json']} MB, YAML {out['document_mb']['yaml']} MB"
    )
    rows = [
        [r["code"], r["format"], *(f"{r[k]:.2f}" for k in ("load_s", "map_s", "register_checks_s",
         "total_s")), f"{r['peak_rss_mb']:.1f}", str(r["tools"])]
        if "error" not in r else [r["code"], r["format"], f"error: {r['error']}", "", "", "", "", ""]
        for r in out["rows"]
    ]  # fmt: skip
    print_rows(
        ["code", "format", "load s", "map s", "checks s", "total s", "peak MB", "tools"], rows
    )
    goal = out["goal"]
    verdict = "within" if out["within_goal"] else "NOT within"
    print(f"current code {verdict} the goal ({goal['seconds']} s, {goal['peak_rss_mb']} MB)")


if __name__ == "__main__":
    args = sys.argv[1:]

    def option(name: str) -> str | None:
        return args[args.index(name) + 1] if name in args else None

    if args[:1] == ["run"]:
        run(Path(args[1]), option("--server"), option("--auth"))
    elif "--corpus" in args:
        at = args.index("--corpus") + 1
        which = args[at] if at < len(args) and not args[at].startswith("--") else "ci"
        source = Path(args[args.index("--src") + 1]) if "--src" in args else None
        figures = corpus(which, source)
        print_corpus(figures)
        CORPUS_OUT_PATH.parent.mkdir(exist_ok=True)
        CORPUS_OUT_PATH.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {CORPUS_OUT_PATH}")
    else:
        source = Path(args[args.index("--src") + 1]) if "--src" in args else None
        result = main("--quick" in args, source)
        print_table(result)
        OUT_PATH.parent.mkdir(exist_ok=True)
        OUT_PATH.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {OUT_PATH}")
