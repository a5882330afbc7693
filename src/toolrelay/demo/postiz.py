"""Run Postiz through toolrelay end to end, then the failure cases, each with its outcome.

Everything runs on loopback: a Postiz-compatible server (front mode, like the self-hosted
nginx), the database (embedded unless DATABASE_URL is set) and one worker that drains.
"""

from __future__ import annotations

import ipaddress
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import yaml
from rich.console import Console
from rich.table import Table

from toolrelay.credentials import CredentialStore, Keyring
from toolrelay.db import Database
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.worker import Worker, WorkerSettings
from toolrelay.registry import Registry, ToolSpec
from toolrelay.testing.postiz import RunningPostiz, start_postiz

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "postiz"
TOOL_KEY = "postiz.create_post"
LOOPBACK = EgressPolicy(frozenset(), (ipaddress.ip_network("127.0.0.1/32"),))


@dataclass
class Scenario:
    name: str
    expect: str
    status: str = ""
    detail: str = ""


class Demo:
    def __init__(self, db: Database, keyring: Keyring, console: Console) -> None:
        self.db = db
        self.keyring = keyring
        self.out = console
        self.registry = Registry(db, uuid.uuid4())
        self.creds = CredentialStore(db, keyring)
        self.template = _tool_definition()

    def step(self, text: str) -> None:
        self.out.print(f"[bold cyan]▶[/] {text}")

    async def drain(self) -> None:
        settings = WorkerSettings(concurrency=8, lease_seconds=10, drain=True)
        await Worker(self.db.url, settings, self.keyring, LOOPBACK).run()

    def register_rfc_tool(self, postiz: RunningPostiz, credential: uuid.UUID) -> None:
        """RFC-0006's worked example, verbatim, as this owner; then the body template."""
        sql = (EXAMPLES / "rfc_worked_example.sql").read_text()
        host = postiz.base_url.removeprefix("http://")
        sql = sql.replace(":'postiz_host'", f"'{host}'")
        sql = sql.replace(":'postiz_api_key_secret_id'", f"'{credential}'")
        with psycopg.connect(self.db.url, autocommit=True) as conn:
            conn.execute("SET ROLE authenticated")
            conn.execute(
                "SELECT set_config('request.jwt.claim.sub', %s, false)", (str(self.registry.owner),)
            )
            conn.execute(sql.encode())
        self.registry.update_tool(
            TOOL_KEY,
            {
                "request_template": self.template["request_template"],
                "schema_input": self.template["schema_input"],
                "response_pointer": self.template["response_pointer"],
            },
        )

    def variant(self, key: str, **changes: Any) -> str:
        """A copy of the Postiz tool with some fields changed, assigned to the demo agent."""
        base = self.registry.get_tool(TOOL_KEY)
        fields = {k: base[k] for k in _SPEC_FIELDS} | {"key": key, "name": key} | changes
        self.registry.register_tool(ToolSpec.from_mapping(fields))
        self.registry.assign("demo-agent", key)
        return key

    async def run_once(self, tool: str, payload: dict[str, Any]) -> dict[str, Any]:
        inv = self.registry.invoke("demo-agent", tool, payload)
        self.registry.approve(inv)
        await self.drain()
        return self.registry.get_invocation(inv)


_SPEC_FIELDS = (
    "description", "category", "schema_input", "schema_output", "auth_method",
    "requires_approval", "is_dangerous", "endpoint_url", "http_method", "request_template",
    "auth_placement", "auth_param_name", "auth_param_prefix", "credential_ref",
    "egress_class", "response_pointer",
)  # fmt: skip


def _tool_definition() -> dict[str, Any]:
    data = yaml.safe_load((EXAMPLES / "tool.yaml").read_text())
    return dict(data["tools"][0])


async def run_demo(db: Database, keyring: Keyring, console: Console) -> bool:
    started = time.monotonic()
    demo = Demo(db, keyring, console)
    postiz = await start_postiz(front=True)
    limited = await start_postiz(front=True, rate_limit=1, rate_window_seconds=2)
    try:
        ok = await _happy_path(demo, postiz)
        scenarios = await _failure_cases(demo, postiz, limited)
    finally:
        await postiz.close()
        await limited.close()
    duplicates = {
        k: v
        for srv in (postiz, limited)
        for k, v in srv.state.creations_by_invocation.items()
        if v > 1
    }
    _report(console, scenarios, duplicates, time.monotonic() - started)
    return ok and not duplicates and all(s.status == s.expect for s in scenarios)


async def _happy_path(demo: Demo, postiz: RunningPostiz) -> bool:
    acme = postiz.org("Acme")
    channel = acme.by_identifier("x")
    demo.step(f"Postiz-compatible server (front mode) at {postiz.base_url}")
    cred = demo.creds.add(demo.registry.owner, "api_key", "postiz-acme", acme.api_key)
    demo.step(f"stored Acme's API key as credential {cred} (encrypted; never shown again)")
    demo.register_rfc_tool(postiz, cred)
    tool = demo.registry.get_tool(TOOL_KEY)
    demo.step(
        f"registered {TOOL_KEY} with RFC-0006's worked example: {tool['http_method']} "
        f"{tool['endpoint_url']}, egress {tool['egress_class']}, approval required"
    )
    demo.registry.create_agent("demo-agent")
    demo.registry.assign("demo-agent", TOOL_KEY)
    payload = {"integrationId": channel.id, "content": "Hello from toolrelay"}
    inv_id = demo.registry.invoke("demo-agent", TOOL_KEY, payload)
    inv = demo.registry.get_invocation(inv_id)
    demo.step(
        f"agent invoked it: {inv_id} is [bold]{inv['status']}[/] (approval {inv['approval_status']})"
    )
    await demo.drain()
    demo.step(
        f"worker ran: Postiz received {len(postiz.state.requests)} request(s) — nothing is sent before approval"
    )
    demo.registry.approve(inv_id)
    demo.step("owner approved it")
    await demo.drain()
    inv = demo.registry.get_invocation(inv_id)
    demo.step(f"dispatched: [bold green]{inv['status']}[/], output {inv['output']}")
    listed = await _list_posts(postiz, acme.api_key)
    demo.step(f"Postiz lists the post: {listed}")
    sent = postiz.state.requests_to("POST", "/posts")[-1]
    raw_key = sent.headers.get("Authorization") == acme.api_key
    demo.step(f"the request carried the raw key in Authorization: {raw_key}")
    return bool(inv["status"] == "completed" and inv["output"].get("postId") and raw_key)


async def _list_posts(postiz: RunningPostiz, api_key: str) -> list[str]:
    url = f"{postiz.public_url}/posts"
    params = {"startDate": "2000-01-01T00:00:00Z", "endDate": "2100-01-01T00:00:00Z"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, params=params, headers={"Authorization": api_key}) as resp,
    ):
        data = await resp.json()
    return [f"{p['id']}: {p['content']!r} ({p['state']})" for p in data["posts"]]


async def _failure_cases(
    demo: Demo, postiz: RunningPostiz, limited: RunningPostiz
) -> list[Scenario]:
    acme, globex = postiz.org("Acme"), postiz.org("Globex")
    channel = acme.by_identifier("x").id
    payload = {"integrationId": channel, "content": "Failure case"}
    results = []

    wrong = demo.creds.add(demo.registry.owner, "api_key", "postiz-globex", globex.api_key)
    demo.variant("postiz.wrong_org", credential_ref=wrong)
    results.append(
        await _case(
            demo, "key from another organization", "postiz.wrong_org", payload, "http_error"
        )
    )

    bare = demo.registry.get_tool(TOOL_KEY)["endpoint_url"].replace("/api/public", "/public")
    demo.variant("postiz.bare_url", endpoint_url=bare)
    results.append(
        await _case(
            demo,
            "bare /public/v1 URL behind the front",
            "postiz.bare_url",
            payload,
            "invalid_output",
        )
    )

    template = demo.template["request_template"]
    no_reply = yaml.safe_load(yaml.safe_dump(template))
    del no_reply["body"]["posts"][0]["settings"]["who_can_reply_post"]
    demo.variant("postiz.no_who_can_reply", request_template=no_reply)
    results.append(
        await _case(
            demo,
            "template without who_can_reply_post",
            "postiz.no_who_can_reply",
            payload,
            "http_error",
        )
    )

    limited_key = demo.creds.add(
        demo.registry.owner, "api_key", "postiz-limited", limited.org("Acme").api_key
    )
    url = demo.registry.get_tool(TOOL_KEY)["endpoint_url"].replace(
        postiz.base_url, limited.base_url
    )
    demo.variant("postiz.rate_limited", endpoint_url=url, credential_ref=limited_key)
    limited_payload = {"integrationId": limited.org("Acme").by_identifier("x").id, "content": "1"}
    await demo.run_once("postiz.rate_limited", limited_payload)  # uses the hour's only slot
    case = await _case(
        demo,
        "rate limit: 429 then retried after Retry-After",
        "postiz.rate_limited",
        limited_payload | {"content": "2"},
        "completed",
    )
    results.append(case)
    return results


async def _case(demo: Demo, name: str, tool: str, payload: dict[str, Any], expect: str) -> Scenario:
    inv = await demo.run_once(tool, payload)
    status = inv["error_code"] or inv["status"]
    codes = [a["status_code"] for a in inv["attempts"]]
    detail = (inv["error"] or f"output {inv['output']}")[:110] + f"  attempts {codes}"
    demo.step(f"{name}: [bold]{status}[/] — {detail}")
    return Scenario(name, expect, status, detail)


def _report(
    console: Console, scenarios: list[Scenario], duplicates: dict[str, int], seconds: float
) -> None:
    table = Table(title="Failure cases")
    for column in ("case", "expected", "got"):
        table.add_column(column)
    for s in scenarios:
        colour = "green" if s.status == s.expect else "red"
        table.add_row(s.name, s.expect, f"[{colour}]{s.status}[/]")
    console.print(table)
    console.print(f"posts created twice: {len(duplicates)}; demo took {seconds:.1f} s")
