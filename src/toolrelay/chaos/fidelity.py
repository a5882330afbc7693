"""Was a request the upstream received one the owner's configuration allowed to leave?

The dispatcher renders a request (``build_request``) before it places the credential, and an
approval binds the digest of that rendering (``request_digest``). Here a received request is
turned back into a rendering: the credential and the headers the HTTP client adds are taken
out, the JSON body parsed. Its digest must then equal the approved one, or the digest of
``build_request`` under a configuration that was ungated and current while the call could
have been sent. docs/reliability.md states the invariant (``requests_as_approved``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus

from toolrelay.chaos.upstream import Arrival
from toolrelay.credentials.hosts import host_allowed
from toolrelay.dispatch.executor import build_request, request_digest
from toolrelay.dispatch.template import RenderedRequest
from toolrelay.errors import TemplateError

# Added by aiohttp's client, not by the renderer (templates may not set the first four,
# and the chaos configurations set none of them).
TRANSPORT_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "content-type",
        "accept",
        "accept-encoding",
        "user-agent",
    }
)
SHOWN = 70  # characters of a differing value shown in a violation


@dataclass
class ConfigVersion:
    """One configuration of a tool as the owner wrote it, and when it was current.

    Current from ``start`` (taken before the write, so at the latest its commit) until
    ``end`` (taken after the next write returned): a window never too short.
    """

    tool: str
    rev: int
    kind: str  # "initial" or the mutation that wrote it
    row: Mapping[str, Any]  # the tool row as stored
    start: float = -math.inf
    end: float = math.inf
    gated: bool | None = None  # agents.tool_is_gated(row), filled in after the run

    def current_during(self, begin: float, until: float) -> bool:
        return self.start <= until and self.end >= begin

    @property
    def credential(self) -> tuple[str, str] | None:
        """Where this configuration places a credential: (placement, name), if it has one."""
        row = self.row
        if row.get("credential_ref") is None and row.get("auth_method", "none") == "none":
            return None
        return str(row["auth_placement"]), str(row["auth_param_name"])

    def render(self, invocation_id: str, input: Mapping[str, Any]) -> RenderedRequest | None:
        try:
            return build_request(dict(self.row) | {"id": invocation_id, "input": input})
        except TemplateError:
            return None  # the dispatcher fails it too: nothing to send


@dataclass
class HostsVersion:
    """The allowed hosts of a credential, current from ``start`` until ``end``."""

    hosts: Sequence[str]
    start: float = -math.inf
    end: float = math.inf


@dataclass
class Call:
    """What the check needs of one invocation."""

    id: str
    tool: str
    input: Mapping[str, Any]
    created_at: float  # the creating transaction's start (now())
    created_by: float  # when the creating transaction had committed, at the latest
    decided_at: float | None
    request_digest: str | None


@dataclass
class Verdict:
    how: str | None  # "approved", "ungated" or None: a violation
    problem: str = ""


# --- a received request, back into a rendering ------------------------------------------------


@dataclass(frozen=True)
class Received:
    rendered: RenderedRequest | None
    problem: str = ""

    @property
    def digest(self) -> str | None:
        return request_digest(self.rendered) if self.rendered is not None else None


def received(arrival: Arrival, credential: tuple[str, str] | None) -> Received:
    """The rendering this request was made from, if the credential was placed as given."""
    placement, name = credential if credential is not None else ("", "")
    headers: dict[str, str] = {}
    host = ""
    for key, value in arrival.headers:
        lower = key.lower()
        if lower == "host":
            host = value
        if lower in TRANSPORT_HEADERS or (placement == "header" and lower == name.lower()):
            continue
        if any(k.lower() == lower for k in headers):
            return Received(None, f"header {key} sent twice")
        headers[key] = value
    target = arrival.target
    if placement == "query":
        target = _without_param(target, name)
    body: Any = None
    if arrival.body:
        try:
            body = json.loads(arrival.body)
        except ValueError:
            return Received(None, f"body is not JSON: {arrival.body[:SHOWN]!r}")
    return Received(RenderedRequest(arrival.method, f"http://{host}{target}", headers, body))


def _without_param(target: str, name: str) -> str:
    """The target without the credential's query parameter (the only one of that name)."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    kept = [p for p in query.split("&") if unquote_plus(p.partition("=")[0]) != name]
    return f"{path}?{'&'.join(kept)}" if kept else path


# --- the verdict ---------------------------------------------------------------------------------


@dataclass
class Judge:
    """Verdicts for the requests of one run; renderings are cached per call and version."""

    versions: Mapping[str, Sequence[ConfigVersion]]
    _renders: dict[tuple[str, str, int], RenderedRequest | None] = field(default_factory=dict)

    def rendering(self, call: Call, version: ConfigVersion) -> RenderedRequest | None:
        key = (call.id, version.tool, version.rev)
        if key not in self._renders:
            self._renders[key] = version.render(call.id, call.input)
        return self._renders[key]

    def verdict(self, call: Call, arrival: Arrival) -> Verdict:
        versions = self.versions.get(call.tool, ())
        if not versions:
            return Verdict(None, "no configuration of its tool was logged")
        shapes = {v.credential for v in versions}
        got = {shape: received(arrival, shape) for shape in shapes}
        digests = {shape: r.digest for shape, r in got.items()}
        if _sent_as_approved(call, arrival, digests.values()):
            return Verdict("approved")
        made_ungated = any(
            v.gated is False and v.current_during(call.created_at, call.created_by)
            for v in versions
        )
        window = [v for v in versions if v.current_during(call.created_at, arrival.wall)]
        if made_ungated:
            for v in window:
                expected = self.rendering(call, v) if v.gated is False else None
                if expected is not None and digests[v.credential] == request_digest(expected):
                    return Verdict("ungated")
        return Verdict(None, self._explain(call, arrival, got, window, made_ungated))

    def _explain(
        self,
        call: Call,
        arrival: Arrival,
        got: Mapping[tuple[str, str] | None, Received],
        window: Sequence[ConfigVersion],
        made_ungated: bool,
    ) -> str:
        if call.request_digest is None and made_ungated:
            state = (
                "not approved, and no ungated configuration current since it was made renders it"
            )
        elif call.request_digest is None:
            state = "never approved"
        elif call.decided_at is not None and arrival.wall < call.decided_at:
            state = "sent before its approval"
        else:
            state = f"approved as {call.request_digest[:12]}…, received a different request"
        if not made_ungated:
            state += "; made while its tool was gated"
        problems = [r.problem for r in got.values() if r.problem]
        if problems:
            return f"{state}; {problems[0]}"
        parts = [state]
        if call.request_digest is not None:
            parts.append(self._against_approved(call, got))
        parts.append(self._closest(call, got, window))
        return "; ".join(parts)

    def _against_approved(self, call: Call, got: Mapping[tuple[str, str] | None, Received]) -> str:
        """How the request differs from the approved one (found by its digest)."""
        for v in self.versions.get(call.tool, ()):
            expected = self.rendering(call, v)
            rendered = got[v.credential].rendered
            if expected is None or rendered is None:
                continue
            if request_digest(expected) == call.request_digest:
                return f"the approved request (r{v.rev}) differs: " + "; ".join(
                    differences(expected, rendered)
                )
        return "no logged configuration renders the approved request"

    def _closest(
        self,
        call: Call,
        got: Mapping[tuple[str, str] | None, Received],
        window: Sequence[ConfigVersion],
    ) -> str:
        closest: tuple[int, str] | None = None
        for v in window:
            expected = self.rendering(call, v)
            rendered = got[v.credential].rendered
            if expected is None or rendered is None:
                continue
            diffs = differences(expected, rendered)
            gating = "gated" if v.gated else "ungated"
            text = f"configuration r{v.rev} ({v.kind}, {gating}): {'; '.join(diffs) or 'equal'}"
            if closest is None or len(diffs) < closest[0]:
                closest = (len(diffs), text)
        if closest is None:
            return "no configuration current in its window renders"
        return f"closest {closest[1]}"


def _sent_as_approved(call: Call, arrival: Arrival, digests: Iterable[str | None]) -> bool:
    """Arrived after the approval, and is the very request approved."""
    if call.request_digest is None or call.decided_at is None:
        return False
    return arrival.wall >= call.decided_at and call.request_digest in digests


def differences(expected: RenderedRequest, got: RenderedRequest) -> list[str]:
    """What differs between two renderings, shortly (no credential is in either)."""
    out = []
    if expected.method != got.method:
        out.append(f"method {got.method}, expected {expected.method}")
    if expected.url != got.url:
        out.append("URL " + _pair(got.url, expected.url))
    want = {k.lower(): v for k, v in expected.headers.items()}
    have = {k.lower(): v for k, v in got.headers.items()}
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            out.append(
                f"header {name}: {_short(have.get(name))}, expected {_short(want.get(name))}"
            )
    if expected.body != got.body:
        out.append("body " + _pair(_json(got.body), _json(expected.body)))
    return out


def _pair(got: str, expected: str) -> str:
    """Both values from a little before where they first differ."""
    same = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
    start = max(0, (min(len(got), len(expected)) if same is None else same) - 20)
    cut = "…" if start else ""
    return f"{_short(cut + got[start:])}, expected {_short(cut + expected[start:])}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _short(value: str | None) -> str:
    if value is None:
        return "(none)"
    return repr(value if len(value) <= SHOWN else value[: SHOWN - 1] + "…")


# --- redirects and host bindings -------------------------------------------------------------


def follows_redirect(previous: Arrival | None, arrival: Arrival) -> bool:
    """A followed self-redirect: the upstream named the URL; all else is the request it
    follows (same method, headers but Host, and body)."""
    if previous is None or previous.action != "redirect_self" or previous.status != 307:
        return False

    def rest(a: Arrival) -> list[tuple[str, str]]:
        return sorted((k.lower(), v) for k, v in a.headers if k.lower() != "host")

    return (previous.method, rest(previous), previous.body) == (
        arrival.method,
        rest(arrival),
        arrival.body,
    )


def host_of(arrival: Arrival) -> tuple[str, int | None]:
    host = next((v for k, v in arrival.headers if k.lower() == "host"), "")
    name, _, port = host.rpartition(":")
    return (name, int(port)) if port.isdigit() else (host, None)


def credential_admitted(hosts: Iterable[HostsVersion], arrival: Arrival, created_at: float) -> bool:
    """Whether the credential's allowed hosts admitted this request's host at some moment
    between the call's creation and the request (the claim reads them in between)."""
    host, port = host_of(arrival)
    return any(
        h.start <= arrival.wall and h.end >= created_at and host_allowed(h.hosts, host, port)
        for h in hosts
    )
