"""What the owner changes while calls are in flight, and the log of every configuration.

Through the owner's own doors (``Registry.update_tool``, ``CredentialStore.rotate`` and
``set_hosts``, what ``toolrelay tool update`` and ``toolrelay credential rotate`` run), one
change every ``mutate_every`` seconds while invocations are created, at most
``max_mutations``, in a fixed rotation of kinds:

* ``gate``: a gated tool ungated, or the reverse (requires_approval, egress_class);
* ``template``: the next request template (nested body, input text in the query, or no
  placeholders at all, so the input is merged);
* ``defaults``: ``default``s added to every schema_input property (one property added
  with only a default), or removed;
* ``endpoint``: another path on the chaos upstream, with or without a query;
* ``rotate``: a new secret for the API key or the OAuth credential;
* ``hosts``: the credential's allowed hosts: the upstream's host:port, another port (the
  credential must then not be sent), or the host on any port.

Every configuration a tool write leaves gets a new ``X-Chaos-Config`` header value, so no two
configurations render alike and a request names the one it was rendered under.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg

from toolrelay.chaos.fidelity import ConfigVersion, HostsVersion
from toolrelay.chaos.scenario import INPUT_SCHEMA, TOOLS, Setup, template
from toolrelay.credentials import CredentialStore
from toolrelay.errors import ToolrelayError
from toolrelay.registry import Registry

log = logging.getLogger("toolrelay.chaos")

KINDS = ("gate", "template", "defaults", "endpoint", "rotate", "hosts")
GATE_TOOLS = ("chaos.read", "chaos.read_key", "chaos.post", "chaos.post_gated")
REVISION_HEADER = "X-Chaos-Config"
DEFAULT_MARK = "DEFAULT-NEVER-SENT"
# Finding 12 of issue 12: a default that would have turned a call into another one.
INPUT_SCHEMA_WITH_DEFAULTS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "default": 999999},
        "text": {"type": "string", "default": DEFAULT_MARK},
        "chaos": {"type": "string", "default": "reset_after"},
        "to": {"type": "string", "default": "attacker@example.invalid"},
    },
    "additionalProperties": False,
}
OWNER_ERRORS = (ToolrelayError, psycopg.Error)
READ_BACK_SECONDS = 60.0  # how long to wait for the database to answer a read-back


@dataclass
class ConfigLog:
    """Every configuration of every tool, in order; the check replays it."""

    tools: dict[str, list[ConfigVersion]] = field(default_factory=dict)
    hosts: dict[str, list[HostsVersion]] = field(default_factory=dict)  # by credential id

    def tool(self, key: str, row: Mapping[str, Any], kind: str, start: float, done: float) -> None:
        versions = self.tools.setdefault(key, [])
        if versions:
            versions[-1].end = done
        versions.append(ConfigVersion(key, len(versions), kind, dict(row), start))

    def credential(self, ident: UUID, hosts: list[str], start: float, done: float) -> None:
        versions = self.hosts.setdefault(str(ident), [])
        if versions:
            versions[-1].end = done
        versions.append(HostsVersion(list(hosts), start))

    def current(self, key: str) -> Mapping[str, Any]:
        return self.tools[key][-1].row

    def next_rev(self, key: str) -> int:
        return len(self.tools.get(key, ()))

    @classmethod
    def initial(cls, setup: Setup) -> ConfigLog:
        made = cls()
        for key, row in setup.rows.items():
            made.tool(key, row, "initial", -math.inf, -math.inf)
        for ident in setup.credentials.values():
            made.credential(ident, ["127.0.0.1"], -math.inf, -math.inf)
        return made


# --- the configurations ---------------------------------------------------------------------


def with_revision(request_template: Mapping[str, Any], rev: int) -> dict[str, Any]:
    changed = copy.deepcopy(dict(request_template))
    changed["headers"] = dict(changed.get("headers", {})) | {REVISION_HEADER: f"r{rev}"}
    return changed


def template_variant(method: str, rev: int) -> dict[str, Any]:
    """The template a ``template`` mutation writes: the original, a reshaped one, or one
    without placeholders (the whole input merged into the query or the body)."""
    header = {REVISION_HEADER: f"r{rev}"}
    reads = method in ("GET", "DELETE")
    shape = rev % 3
    if shape == 0:
        return template(method) | {"headers": header}
    if shape == 1 and reads:
        query = {"chaos": "{{input.chaos}}", "n": "{{input.n}}", "q": "{{input.text}}"}
        return {"headers": header, "query": query | {"rev": f"r{rev}"}}
    if shape == 1:
        body = {
            "data": {"n": "{{input.n}}", "text": "{{input.text}}"},
            "invocation": "{{invocation.id}}",
            "rev": rev,
        }
        return {"headers": header, "query": {"chaos": "{{input.chaos}}"}, "body": body}
    return {"headers": header} if reads else {"headers": header, "body": {"rev": rev}}


def endpoint_variant(base_url: str, key: str, rev: int) -> str:
    shape = rev % 3
    if shape == 0:
        return f"{base_url}/api/{key}"
    if shape == 1:
        return f"{base_url}/api/{key}/v{rev}"
    return f"{base_url}/api/{key}/v{rev}?src=r{rev}"


def is_gated(row: Mapping[str, Any]) -> bool:
    """Only to choose a direction; the check asks the database (agents.tool_is_gated)."""
    return bool(row["requires_approval"] or row["is_dangerous"] or row["egress_class"] == "write")


def tool_change(kind: str, row: Mapping[str, Any], rev: int, base_url: str) -> dict[str, Any]:
    """The columns a mutation of ``kind`` writes, given the tool's current row."""
    method, key = row["http_method"], row["key"]
    if kind == "gate":
        if is_gated(row):
            changes: dict[str, Any] = {"requires_approval": False, "egress_class": "read_only"}
        elif method == "GET":
            changes = {"requires_approval": True}
        else:
            changes = {"egress_class": "write"}
        return changes | {"request_template": with_revision(row["request_template"], rev)}
    if kind == "template":
        return {"request_template": template_variant(method, rev)}
    if kind == "defaults":
        has = any("default" in p for p in row["schema_input"].get("properties", {}).values())
        schema = INPUT_SCHEMA if has else INPUT_SCHEMA_WITH_DEFAULTS
        return {
            "schema_input": schema,
            "request_template": with_revision(row["request_template"], rev),
        }
    if kind == "endpoint":
        return {
            "endpoint_url": endpoint_variant(base_url, key, rev),
            "request_template": with_revision(row["request_template"], rev),
        }
    raise ValueError(f"not a tool mutation: {kind}")


def binding_change(kind: str, row: Mapping[str, Any], rev: int, base_url: str) -> dict[str, Any]:
    """The binding probe's change after approval: body, endpoint and defaults at once."""
    body = dict(row["request_template"].get("body", {})) | {"text": "{{input.text}}"}
    return {
        "request_template": with_revision(row["request_template"] | {"body": body}, rev),
        "endpoint_url": endpoint_variant(base_url, row["key"], 1),
        "schema_input": INPUT_SCHEMA_WITH_DEFAULTS,
    }


def regating_change(kind: str, row: Mapping[str, Any], rev: int, base_url: str) -> dict[str, Any]:
    """The re-gating probe's change after its calls were made: gated, and rendered anew."""
    return {
        "requires_approval": True,
        "request_template": with_revision(row["request_template"], rev),
    }


def hosts_variants(n: int, port: int) -> list[list[str]]:
    """What the n-th ``hosts`` mutation of a credential writes, in order: the upstream's
    host:port; or another port (nothing may then carry the credential) and, ``every``
    seconds later, the host on any port again."""
    other = port + 1 if port < 65535 else port - 1
    if n % 2 == 0:
        return [[f"127.0.0.1:{port}"]]
    return [[f"127.0.0.1:{other}"], ["127.0.0.1"]]


# --- the mutator ------------------------------------------------------------------------------


@dataclass
class Mutator:
    """Applies the mutations; the owner API is synchronous, so each runs in a thread."""

    registry: Registry
    store: CredentialStore
    setup: Setup
    log: ConfigLog
    base_url: str
    port: int
    rng: random.Random
    every: float = 1.0
    counts: Counter[str] = field(default_factory=Counter)
    _n: int = 0

    async def run(self, seconds: float, limit: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self._n < limit and loop.time() < deadline:
            await asyncio.sleep(min(self.every, max(0.0, deadline - loop.time())))
            if loop.time() >= deadline:
                break
            await self.step(KINDS[self._n % len(KINDS)])
            self._n += 1

    async def step(self, kind: str) -> None:
        if kind in ("rotate", "hosts"):
            round_ = self._n // len(KINDS)
            which = ("api_key", "oauth")[round_ % 2]
            if kind == "rotate":
                secret = self._new_secret(which)
                await asyncio.to_thread(self._rotate, which, secret)
            else:
                for i, hosts in enumerate(hosts_variants(round_ // 2, self.port)):
                    if i:
                        await asyncio.sleep(self.every)
                    await asyncio.to_thread(self._hosts, which, hosts)
            return
        keys = GATE_TOOLS if kind == "gate" else tuple(t.key for t in TOOLS)
        key = self.rng.choice(keys)
        await asyncio.to_thread(self.write_tool, key, kind)

    def write_tool(
        self, key: str, kind: str, change: Callable[..., dict[str, Any]] = tool_change
    ) -> None:
        """One tool write, logged; after an error, what the database holds is logged."""
        rev = self.log.next_rev(key)
        changes = change(kind, self.log.current(key), rev, self.base_url)
        start = time.time()
        try:
            row = self.registry.update_tool(key, changes)
            self.counts[kind] += 1
        except OWNER_ERRORS as exc:
            self.counts[f"{kind}_failed_{type(exc).__name__}"] += 1
            row = self._read_back(lambda: self.registry.get_tool(key))
        self.log.tool(key, row, kind, start, time.time())

    def _new_secret(self, which: str) -> str:
        """Known to the upstream and to the leak check before the owner stores it."""
        if which == "api_key":
            value = f"ck-rot-{secrets.token_hex(20)}"
            self.setup.api_keys.add(value)
            self.setup.secrets["api_key"].append(value)
            return value
        access = f"at-rot-{secrets.token_hex(16)}"
        self.setup.rotated_tokens.add(access)
        self.setup.secrets["oauth_access_token"].append(access)
        return json.dumps(self.setup.oauth | {"access_token": access, "expires_in": 3600})

    def _rotate(self, which: str, secret: str) -> None:
        try:
            self.store.rotate(self.setup.owner, self.setup.credentials[which], secret)
            self.counts["rotate"] += 1
        except OWNER_ERRORS as exc:
            self.counts[f"rotate_failed_{type(exc).__name__}"] += 1

    def _hosts(self, which: str, hosts: list[str]) -> None:
        ident = self.setup.credentials[which]
        start = time.time()
        try:
            self.store.set_hosts(self.setup.owner, ident, hosts)
            self.counts["hosts"] += 1
        except OWNER_ERRORS as exc:
            self.counts[f"hosts_failed_{type(exc).__name__}"] += 1
            info = self._read_back(lambda: self.store.get(self.setup.owner, ident))
            hosts = list(info.allowed_hosts)
        self.log.credential(ident, hosts, start, time.time())

    def _read_back(self, read: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + READ_BACK_SECONDS
        while True:
            try:
                return read()
            except OWNER_ERRORS:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def applied(self) -> dict[str, int]:
        return {kind: self.counts[kind] for kind in KINDS}
