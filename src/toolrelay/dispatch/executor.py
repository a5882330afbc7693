"""Turn one claimed invocation into one HTTP attempt and an Outcome.

Order matters: every check that can refuse runs before anything leaves, and a write is
marked as possibly-sent (``before_send``) before its request is written to the socket.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote
from uuid import UUID

import aiohttp
from jsonschema.exceptions import best_match
from yarl import URL

from toolrelay.dispatch import policy as retry
from toolrelay.dispatch.budget import AnswerBudget, parsed_weight
from toolrelay.dispatch.egress import EgressPolicy
from toolrelay.dispatch.http import Response, SendFailure, SendSpec, send
from toolrelay.dispatch.outcome import HANDED_BACK, Outcome, scrub, storable, trim
from toolrelay.dispatch.template import RenderedRequest, render_request
from toolrelay.errors import (
    CredentialMissing,
    EgressBlocked,
    InvocationError,
    ToolrelayError,
    UnknownMasterKey,
    WrongMasterKey,
)
from toolrelay.registry.schemas import SchemaValidator
from toolrelay.registry.validation import MAX_JSON_DEPTH, check_input, nested_too_deep, validator

INVOCATION_HEADER = "X-Toolrelay-Invocation"
Resolve = Callable[[UUID, str, int | None, "Mapping[str, Any] | None"], Awaitable[str]]
CRED_PREFIX = "cred_"  # claim columns carrying the credential row
CRED_COLUMNS = tuple(
    f"{CRED_PREFIX}{name}"
    for name in ("id", "owner", "name", "kind", "status", "allowed_hosts", "key_id",
                 "wrapped_key", "nonce", "ciphertext", "expires_at")
)  # fmt: skip
MASK = "••••"  # the credential's value where it was sent; the approvals page's mask too


@dataclass(frozen=True)
class SentRequest:
    """The request handed to the HTTP client, as an attempt row records it: the credential's
    value masked, every other header and query value as sent (they are the approved
    rendering), the body as its size and the sha256 of the bytes sent. Redirects a read
    followed are not recorded apart; the HTTP client adds Host, Content-Length, User-Agent,
    Accept and Accept-Encoding."""

    method: str
    url: str
    headers: dict[str, str]
    body_bytes: int
    body_sha256: str

    @classmethod
    def of(cls, spec: SendSpec, url: str, headers: dict[str, str]) -> SentRequest:
        body = spec.payload or b""  # hashed once, from the bytes the client sends
        return cls(spec.method, url, headers, len(body), hashlib.sha256(body).hexdigest())

    def scrubbed(self, secrets: list[str]) -> SentRequest:
        """Defence in depth: a secret value the input carried elsewhere is not recorded."""
        if not secrets:
            return self
        return dataclasses.replace(
            self, url=scrub(self.url, secrets), headers=scrub(self.headers, secrets)
        )


@dataclass
class Attempt:
    """What happened on the wire, for the history table. ``request`` stays None when the
    attempt was refused before anything was sent."""

    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.monotonic)
    status_code: int | None = None
    request: SentRequest | None = None
    held: int = 0  # bytes of the answer budget this call holds until its result is recorded

    def record(self, row: Mapping[str, Any], outcome: Outcome) -> dict[str, Any]:
        sent = self.request
        return {
            "invocation_id": str(row["id"]),
            "owner": str(row["owner"]),
            "attempt": row["attempt"],
            "started_at": self.started_at.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "status_code": self.status_code,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 3),
            "error_code": outcome.error_code,
            "error": outcome.detail or outcome.error,  # the owner's account, when fuller
            "request_method": sent.method if sent else None,
            "request_url": sent.url if sent else None,
            "request_headers": sent.headers if sent else None,
            "request_body_bytes": sent.body_bytes if sent else None,
            "request_body_sha256": sent.body_sha256 if sent else None,
        }


@dataclass
class Executor:
    session: aiohttp.ClientSession
    egress: EgressPolicy
    resolve_credential: Resolve
    before_send: Callable[[Mapping[str, Any]], Awaitable[bool]]
    budget: AnswerBudget | None = None  # the worker's (budget.py); the caller gives back
    # The upstream refused the call's credential (401): True when sending again may work
    # (an oauth access token marked expired, to be refreshed: CredentialResolver.refused).
    refused_credential: Callable[[Mapping[str, Any]], Awaitable[bool]] | None = None

    async def run(self, row: Mapping[str, Any], attempt: Attempt) -> tuple[Outcome, list[str]]:
        """Returns the outcome and the secret values to scrub from what is recorded."""
        secrets: list[str] = []
        try:
            outcome = await self._run(row, attempt, secrets)
        except UnknownMasterKey as exc:  # this worker's configuration, not the call's fault
            wrong = "master_key_wrong" if isinstance(exc, WrongMasterKey) else None
            return Outcome(
                HANDED_BACK, error=exc.message, detail=exc.key_id, error_code=wrong
            ), secrets
        except InvocationError as exc:
            outcome = Outcome.failed(exc.code, exc.message)
        except ToolrelayError as exc:
            outcome = Outcome.failed("credential_error", exc.message)
        # Every text recorded: no known secret, nothing PostgreSQL cannot store (a NUL would
        # fail the whole batch's write)
        outcome.error = storable(scrub(outcome.error, secrets))
        outcome.detail = storable(scrub(outcome.detail, secrets))
        outcome.output = scrub(outcome.output, secrets)
        # jsonschema quotes the offending value: a secret echoed into a bad field shows there
        outcome.output_mismatch = storable(shortened(scrub(outcome.output_mismatch, secrets)))
        if attempt.request is not None:
            attempt.request = attempt.request.scrubbed(secrets)
        return outcome, secrets

    async def _run(self, row: Mapping[str, Any], attempt: Attempt, secrets: list[str]) -> Outcome:
        refusal = precheck(row)
        if refusal is not None:
            return refusal
        rendered = build_request(row)
        refusal = check_digest(row, rendered)
        if refusal is not None:
            return refusal
        spec = self._build(row, rendered)
        shown = spec.url, dict(spec.headers)
        if row["credential_ref"] is not None or row["auth_method"] != "none":
            shown = await self._place_credential(row, spec, secrets)
        write = not retry.is_idempotent(row["http_method"], row["idempotency_header"])
        if write and not await self.before_send(row):
            return Outcome("lost")  # lease taken over: another worker owns it now
        attempt.started = time.monotonic()
        attempt.request = SentRequest.of(spec, *shown)
        return await self._send(row, spec, attempt, write)

    async def _send(
        self, row: Mapping[str, Any], spec: SendSpec, attempt: Attempt, write: bool
    ) -> Outcome:
        try:
            # Tells the guard whose call this is: scoped allow entries, the endpoint's origin.
            dispatch = self.egress.dispatching(
                row["tool_key"], row["credential_ref"], row["endpoint_url"]
            )
            with dispatch:
                response = await send(self.session, self.egress, spec)
        except SendFailure as failure:
            if not failure.left and spec.exchanges == 0:
                attempt.request = None  # it never left: nothing was sent
            return on_failure(row, failure, write)
        except EgressBlocked:
            if spec.exchanges == 0:  # refused before the first request, not at a redirect
                attempt.request = None
            raise
        attempt.status_code = response.status
        if (
            response.status == 401
            and row["auth_method"] == "oauth"
            and tries(row) < row["max_attempts"]
            and self.refused_credential is not None
            and await self.refused_credential(row)
        ):  # refused before it was processed, as a 429: sent again with a fresh token
            return Outcome.retry(
                0.0,
                "http_error",
                "HTTP 401: the access token was refused; refreshing it and retrying",
                never_left=True,
                http_status=401,
            )
        if self.budget is not None:  # before parsing: the parsed answer is what weighs
            if 200 <= response.status < 300:  # the only answers parsed
                weight = parsed_weight(response.body)
                if weight > self.budget.max_answer:
                    return too_heavy(response, weight, self.budget.max_answer)
            attempt.held = await self.budget.take(len(response.body))
        return on_response(row, response, write)

    def _build(self, row: Mapping[str, Any], rendered: RenderedRequest) -> SendSpec:
        return SendSpec(
            method=rendered.method,
            url=rendered.url,
            headers=dict(rendered.headers),
            body=rendered.body,
            connect_timeout=row["connect_timeout_seconds"],
            total_timeout=row["timeout_seconds"],
            max_bytes=row["max_response_bytes"],
            follow_redirects=rendered.method == "GET",
        )

    async def _place_credential(
        self, row: Mapping[str, Any], spec: SendSpec, secrets: list[str]
    ) -> tuple[str, dict[str, str]]:
        """Place the credential where the tool says; returns the URL and headers as the
        attempt row records them, its value (not its prefix) masked."""
        if row["credential_ref"] is None:
            raise CredentialMissing(
                f"tool {row['tool_key']} uses auth_method {row['auth_method']} but has no"
                " credential_ref; add one with `toolrelay credential add` and set it"
            )
        url = URL(spec.url, encoded=True)
        value = await self.resolve_credential(
            row["credential_ref"], url.host or "", url.port, credential_row(row)
        )
        prefix = auth_prefix(row)
        placed = f"{prefix}{value}"
        secrets.extend([value, placed, *basic_parts(row, value)])
        name = row["auth_param_name"]
        if row["auth_placement"] == "query":
            shown_url = with_query_param(spec.url, name, prefix) + MASK
            spec.url = with_query_param(spec.url, name, placed)
            spec.secret_query = name
            return shown_url, dict(spec.headers)
        shown = dict(spec.headers) | {name: f"{prefix}{MASK}"}
        spec.headers[name] = placed
        spec.secret_headers = frozenset({name.lower()})
        return spec.url, shown


def with_query_param(url: str, name: str, value: str) -> str:
    """``url`` with ``name=value`` appended, both percent-encoded. Appended, not yarl's
    update_query(): that re-encodes the other parameters, and the request sent must be the
    rendered (approved) one byte for byte. The approvals page shows the same."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}{quote(name, safe='')}={quote(value, safe='')}"


def build_request(row: Mapping[str, Any]) -> RenderedRequest:
    """The request one invocation sends, before the credential is placed (the approvals
    page previews exactly this). Schema ``default``s are annotations: never sent."""
    rendered = render_request(
        row["endpoint_url"],
        row["http_method"],
        row["request_template"],
        row["input"],
        str(row["id"]),
        row["auth_placement"],
        row["auth_param_name"],
    )
    headers = dict(rendered.headers) | {INVOCATION_HEADER: str(row["id"])}
    if row["idempotency_header"]:
        headers[row["idempotency_header"]] = f"toolrelay-{row['id']}"
    return dataclasses.replace(rendered, headers=headers)


def auth_prefix(row: Mapping[str, Any]) -> str:
    """What precedes the credential's value: the tool's auth_param_prefix, else ``Basic ``
    for HTTP basic (RFC 7617)."""
    if not row["auth_param_prefix"] and row["auth_method"] == "basic":
        return "Basic "
    return str(row["auth_param_prefix"] or "")


def basic_parts(row: Mapping[str, Any], value: str) -> list[str]:
    """For HTTP basic, ``username:password`` and the password decoded from ``value``: an
    upstream echoing either is scrubbed like the header itself."""
    if row["auth_method"] != "basic":
        return []
    decoded = base64.b64decode(value).decode()
    return [decoded, decoded.partition(":")[2]]


def credential_row(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The credential columns the claim returned, under their own names."""
    if row.get(f"{CRED_PREFIX}id") is None:
        return None
    return {k.removeprefix(CRED_PREFIX): row[k] for k in CRED_COLUMNS if k in row}


def request_digest(rendered: RenderedRequest) -> str:
    """What an approval binds to: method, URL, headers and body of the rendered request
    (the credential is placed after rendering, so its value is never part of it)."""
    canonical = json.dumps(
        {
            "method": rendered.method,
            "url": rendered.url,
            "headers": sorted([k.lower(), v] for k, v in rendered.headers.items()),
            "body": rendered.body,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_digest(row: Mapping[str, Any], rendered: RenderedRequest) -> Outcome | None:
    """An approved call is sent only as the request that was approved."""
    approved = row.get("request_digest")
    if row["approval_status"] != "approved" or approved is None:
        return None
    if request_digest(rendered) == approved:
        return None
    return Outcome.failed(
        "tool_changed",
        f"the request for tool {row['tool_key']} is no longer the one that was approved;"
        " it was not sent — invoke it again to approve the new request",
    )


COMPILED_KEPT = 256  # schema objects whose validator is kept


class _Compiled:
    """Validators by schema object: the rows of one claim share their tool's schema dicts
    (store.share_tools), so the validator's cache key (the schema serialized) is computed
    once per tool and claim, not once per call. Each entry holds its schema, so its id()
    cannot be reused by another object while the entry exists; rows are never mutated."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Mapping[str, Any], SchemaValidator]] = {}

    def __call__(self, schema: Mapping[str, Any]) -> SchemaValidator:
        hit = self._by_id.get(id(schema))
        if hit is not None and hit[0] is schema:
            return hit[1]
        compiled = validator(schema)
        if len(self._by_id) >= COMPILED_KEPT:
            self._by_id.clear()
        self._by_id[id(schema)] = (schema, compiled)
        return compiled


compiled_for = _Compiled()


def precheck(row: Mapping[str, Any]) -> Outcome | None:
    """Refuse before sending: tool, agent, assignment, approval, fingerprint, gating, input."""
    if row["tool_status"] is None:
        return Outcome.failed("tool_inactive", "the tool was deleted; the call was not sent")
    if row["agent_status"] is None:
        return Outcome.failed("not_assigned", "the agent was deleted; the call was not sent")
    if row["tool_status"] != "active":
        return Outcome.failed("tool_inactive", f"tool {row['tool_key']} is {row['tool_status']}")
    if row["agent_status"] != "active":
        return Outcome.failed("not_assigned", f"agent is {row['agent_status']}")
    if row["assignment_allowed"] is not True:
        what = "revoked" if row["assignment_allowed"] is None else "denied"
        return Outcome.failed("not_assigned", f"assignment of {row['tool_key']} was {what}")
    if row["approval_status"] == "approved":
        expires = row["approval_expires_at"]
        if expires is not None and expires <= datetime.now(UTC):
            return Outcome(
                "expired", error="approval expired before dispatch", error_code="approval_expired"
            )
        if row["config_fingerprint"] != row["current_fingerprint"]:
            return Outcome.failed(
                "tool_changed",
                f"tool {row['tool_key']} changed after the call was made (its request"
                " configuration); it was not sent — invoke it again to approve the new request",
            )
    elif row["approval_status"] == "not_required" and row.get("gated_now"):
        # Made while the tool was ungated; the owner has gated it since: a human decides.
        return Outcome(
            "pending",
            error=f"tool {row['tool_key']} now requires approval; waiting for a decision",
            error_code="approval_required",
        )
    if row["endpoint_url"] is None:
        return Outcome.failed("no_endpoint", f"tool {row['tool_key']} has no endpoint_url")
    check_input(compiled_for(row["schema_input"]), row["input"])
    refusal = compiled_for(row["schema_output"]).refusal if row["schema_output"] else None
    if refusal is not None:  # stored past registration: refuse before anything leaves
        return Outcome.failed(
            "schema_error", f"the tool's schema_output {refusal}; the call was not sent"
        )
    return None


def tries(row: Mapping[str, Any]) -> int:
    """The attempts that count against the tool's max_attempts: a claim that put the call
    back to pending approval sent nothing and counts none (migration 0053)."""
    return int(row["attempt"]) - int(row["approval_returns"])


def on_failure(row: Mapping[str, Any], failure: SendFailure, write: bool) -> Outcome:
    tried = tries(row)
    attempts_left = tried < row["max_attempts"]
    if not failure.left:
        if attempts_left and failure.code == "network_error":
            return Outcome.retry(
                retry.backoff(tried), failure.code, failure.message, never_left=True
            )
        return Outcome.failed(failure.code, failure.message)
    if write:
        # It may have been processed: never resend, a human reconciles.
        return Outcome.failed(
            "outcome_unknown",
            f"{failure.message} after the request was sent ({failure.code});"
            " the upstream may have processed it, so it is not sent again",
        )
    if attempts_left and failure.code in ("network_error", "timeout"):
        return Outcome.retry(retry.backoff(tried), failure.code, failure.message, never_left=False)
    return Outcome.failed(failure.code, failure.message)


def on_response(row: Mapping[str, Any], response: Response, write: bool) -> Outcome:
    status = response.status
    tried = tries(row)
    attempts_left = tried < row["max_attempts"]
    if 200 <= status < 300:
        return completed(row, response)
    too_long = retry.waits_too_long(response) if status in (429, 503) else None
    if too_long is not None:
        body = trim(response.body.decode("utf-8", "replace"))
        return Outcome.failed(
            "http_error",
            f"HTTP {status} from upstream with Retry-After {too_long:g} s, longer than the"
            f" {retry.RETRY_AFTER_CAP:g} s a call waits; not retried: {body}",
            http_status=status,
        )
    if attempts_left and retry.refused_unprocessed(response):
        delay = retry.retry_after(response)
        return Outcome.retry(
            delay if delay is not None else retry.backoff(tried),
            "http_error",
            f"HTTP {status}: refused, retrying",
            never_left=True,
            http_status=status,
        )
    if attempts_left and not write and status in retry.RETRYABLE_READ_STATUSES:
        delay = retry.retry_after(response)
        return Outcome.retry(
            delay if delay is not None else retry.backoff(tried),
            "http_error",
            f"HTTP {status}",
            never_left=False,
            http_status=status,
        )
    body = trim(response.body.decode("utf-8", "replace"))
    return Outcome.failed("http_error", f"HTTP {status} from upstream: {body}", http_status=status)


def completed(row: Mapping[str, Any], response: Response) -> Outcome:
    status = response.status
    if not response.body.strip():
        return Outcome("completed", output=None, http_status=status)
    try:
        body = parse_json(response.body)
    except RecursionError:  # deeper than the parser goes: far over the limit below
        return too_deep(status)
    except NotStorable as exc:
        return Outcome.failed(
            "invalid_output", f"the response holds {exc} (HTTP {status})", http_status=status
        )
    except (json.JSONDecodeError, UnicodeDecodeError):
        snippet = trim(response.body.decode("utf-8", "replace"), 120)
        return Outcome.failed(
            "invalid_output",
            f"expected a JSON response but got {response.content_type or 'no content type'}"
            f" (HTTP {status}): {snippet} — is the endpoint URL right?",
            http_status=status,
        )
    if nested_too_deep(body):
        return too_deep(status)
    if _ESCAPED_UNSTORABLE.search(response.body):  # JSON spells them only so
        body = storable(body)
    output, problem = select(body, row["response_pointer"])
    if problem:
        return Outcome.failed("invalid_output", problem, http_status=status)
    return Outcome(
        "completed",
        output=output,
        http_status=status,
        output_mismatch=schema_mismatch(row["schema_output"], output),
    )


MISMATCH_CHARS = 500  # of an output_mismatch message, besides the note of what was cut


class NotStorable(ValueError):
    """A JSON number no JSON document (nor jsonb) can hold once Python has read it."""


def _no_constant(name: str) -> Any:
    raise NotStorable(f"{name}, which is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise NotStorable(f"the number {text[:24]}, beyond a double's range")
    return value


_ESCAPED_UNSTORABLE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")  # U+0000, a surrogate


def parse_json(body: bytes) -> Any:
    """An answer's JSON, refusing what json.loads accepts but JSON has not and jsonb would
    refuse, failing the whole batch's write: NaN and Infinity, and numbers a double turns
    into infinity; and an integer longer than Python converts."""
    try:  # a float is checked as it is read (measured: no slower than json.loads alone)
        return json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except (json.JSONDecodeError, UnicodeDecodeError, NotStorable):
        raise
    except ValueError:  # int(): more digits than sys.get_int_max_str_digits()
        raise NotStorable(
            f"an integer of more than {sys.get_int_max_str_digits():,} digits"
        ) from None


def too_heavy(response: Response, weight: int, limit: int) -> Outcome:
    mib = 2**20
    return Outcome.failed(
        "response_too_large",
        f"the response's {len(response.body):,} bytes would take about {weight / mib:,.0f}"
        f" MiB once parsed (its arrays, objects and values), more than the {limit / mib:,.0f}"
        f" MiB this worker allows one answer (HTTP {response.status}); it was not parsed nor"
        " kept",
        http_status=response.status,
    )


def too_deep(status: int) -> Outcome:
    return Outcome.failed(
        "invalid_output",
        f"the response nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"
        f" (HTTP {status}); it was not kept",
        http_status=status,
    )


def select(body: Any, pointer: str | None) -> tuple[Any, str | None]:
    """Resolve an RFC 6901 JSON Pointer; the error says where it stopped."""
    if not pointer:
        return body, None
    current = body
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict) and token in current:
            current = current[token]
        elif isinstance(current, list) and token.isdigit() and int(token) < len(current):
            current = current[int(token)]
        else:
            return None, f"response_pointer {pointer} does not match the response (at {token!r})"
    return current, None


def schema_mismatch(schema: Mapping[str, Any], output: Any) -> str | None:
    if not schema:
        return None
    error = best_match(compiled_for(schema).iter_errors(output))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"output at {where}: {error.message}"


def shortened(message: str | None) -> str | None:
    """A mismatch message of at most MISMATCH_CHARS (and a note of what was cut): jsonschema
    quotes the whole value that failed (a 1 MB answer); where and why are kept. Cut after
    scrubbing, so that no cut leaves part of a secret no scrub can recognise."""
    if message is None or len(message) <= MISMATCH_CHARS:
        return message
    head, tail = MISMATCH_CHARS * 3 // 5, MISMATCH_CHARS * 2 // 5
    return f"{message[:head]} … ({len(message) - head - tail:,} characters) … {message[-tail:]}"
