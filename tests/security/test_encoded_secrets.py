"""A credential never comes back to the agent in any spelling (issue 12, finding 5).

The secret holds ``+ / = & % " \\ é``, so nearly every encoding changes it. It is placed in
the query and in a header. One loopback upstream echoes what it received in each encoded
form, in a JSON answer (the output), in an error body (the error), and cut in half by the
error's trim; another answers so badly that aiohttp raises errors that carry the request URL,
query and all, or quote a header line cut half-way through the credential. The worker is the
real ``toolrelay worker`` process, so its log output is what an operator would see. Nowhere (invocation error and output, attempt errors, the log) may the
secret appear, in any form, nor any ten characters of one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, quote_plus, urlsplit

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from tests.dispatch.upstream import Upstream
from tests.registry.helpers import add_tool
from tests.security.private_net import run_worker, worker_database
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.dispatch.http import describe, without_queries
from toolrelay.dispatch.outcome import ERROR_BODY_CHARS, REDACTED, TRIMMED, scrub
from toolrelay.registry import Registry

__all__ = ["worker_database"]  # a fixture

SECRET = 'Tr+ai/l=er&k%e"y\\é' + uuid.uuid4().hex[:12]
PLACEMENTS = {  # placement -> (parameter, prefix)
    "query": ("api_key", "q-"),
    "header": ("Authorization", "Bearer "),
}
WINDOW = 10  # no run of this many characters of any spelling may show
URL_WITH_QUERY = re.compile(r"/[^\s?#]*[?#]")  # no error holds a URL's query, scrubbed or not


JINJA_ESCAPES = str.maketrans(  # markupsafe's table, also Go's html/template's for text
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"}
)


def spellings(value: str) -> dict[str, str]:
    """Every form the test looks for, written out apart from the scrubber's own list."""
    raw = value.encode()
    forms = {
        "raw": value,
        "quote": quote(value),
        "quote_nothing_safe": quote(value, safe=""),
        "quote_plus": quote_plus(value),
        "b64": base64.b64encode(raw).decode(),
        "b64_unpadded": base64.b64encode(raw).decode().rstrip("="),
        "b64url": base64.urlsafe_b64encode(raw).decode(),
        "b64url_unpadded": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "json": json.dumps(value)[1:-1],
        "json_utf8": json.dumps(value, ensure_ascii=False)[1:-1],
        "yarl_query": URL.build(query={"k": value}).raw_query_string[2:],
        # reflected in a page, or by an encoder that writes "HTML-safe" JSON
        "html": html.escape(value),
        "html_jinja": value.translate(JINJA_ESCAPES),
        "html_decimal": references(value, "&#{};", "d"),
        "html_hex": references(value, "&#x{};", "x"),
        "json_go": go_json(value),
        "json_dotnet": dotnet_json(value),
    }
    for name in ("quote", "quote_nothing_safe", "quote_plus", "yarl_query"):
        forms[f"{name}_lower"] = re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), forms[name])
    return forms


def references(value: str, form: str, base: str) -> str:
    """Every character but ASCII letters and digits as an HTML character reference."""
    out = []
    for c in value:
        out.append(c if c.isascii() and c.isalnum() else form.format(format(ord(c), base)))
    return "".join(out)


def go_json(value: str) -> str:
    """As Go's encoding/json writes a string: <, > and & as \\u003c, \\u003e, \\u0026,
    and the line and paragraph separators U+2028, U+2029 as \\u2028, \\u2029."""
    text = json.dumps(value, ensure_ascii=False)[1:-1]
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def dotnet_json(value: str) -> str:
    """As .NET's System.Text.Json writes a string by default: the HTML-sensitive characters
    and everything beyond ASCII as \\uXXXX in upper-case hex (a quote too)."""
    out = []
    for char in value:
        if char in "<>&'\"+`" or not char.isascii():
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(json.dumps(char)[1:-1])
    return "".join(out)


def every_spelling(as_sent: set[str]) -> set[str]:
    forms = set(as_sent)
    for _, prefix in PLACEMENTS.values():
        forms |= set(spellings(SECRET).values()) | set(spellings(prefix + SECRET).values())
    return forms


def leaks(text: str, forms: set[str]) -> list[str]:
    """The spellings, or runs of WINDOW characters of one, that ``text`` shows."""
    found = [f for f in forms if f in text]
    found += [
        f[i : i + WINDOW]
        for f in forms
        for i in range(len(f) - WINDOW + 1)
        if f[i : i + WINDOW] in text
    ]
    return found


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)


# --- the echoing upstream -------------------------------------------------------------------


@dataclass
class Echo:
    """What the upstream received, and every spelling of it that it sends back."""

    as_sent: set[str] = field(default_factory=set)  # the query value exactly as on the wire

    def forms(self, request: web.Request) -> dict[str, str]:
        query_name, query_prefix = PLACEMENTS["query"]
        header_name, header_prefix = PLACEMENTS["header"]
        placed = request.query.get(query_name) or request.headers[header_name]
        prefix = query_prefix if query_name in request.query else header_prefix
        sent = {
            part.partition("=")[2]
            for part in request.rel_url.raw_query_string.split("&")
            if part.startswith(f"{query_name}=")
        }
        self.as_sent |= sent
        forms = {f"placed_{k}": v for k, v in spellings(placed).items()}
        forms |= {f"secret_{k}": v for k, v in spellings(placed.removeprefix(prefix)).items()}
        return forms | {f"as_sent_{i}": v for i, v in enumerate(sorted(sent))}

    async def ok(self, request: web.Request, _hit: int) -> web.Response:
        return web.json_response(self.forms(request))

    async def fail(self, request: web.Request, _hit: int) -> web.Response:
        return web.Response(
            status=500, text=f"refused: {self.forms(request)[request.query['form']]}"
        )

    async def cut(self, request: web.Request, _hit: int) -> web.Response:
        """The form straddles the end of what the error message keeps."""
        form = self.forms(request)[request.query["form"]]
        padding = "x" * (ERROR_BODY_CHARS - len(form) // 2)
        return web.Response(status=500, text=padding + form)


# --- the badly behaved upstream -------------------------------------------------------------

HEAD_END = b"\r\n\r\n"
RAW_CASES: dict[str, bytes] = {  # complete answers; the connection is closed after each
    "many_headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"X-%d: y\r\n" % i for i in range(200))
    + b"\r\n",
    "bad_status": b"HTTP/1.1 2x0 OK" + HEAD_END,
    "bad_chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked" + HEAD_END + b"zz",
    "cut_body": b"HTTP/1.1 200 OK\r\nContent-Length: 100" + HEAD_END + b"abc",
    "bad_redirect": b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:99999/x" + HEAD_END,
    "disconnect": b"",
}
ECHO_CASES = {  # answers that repeat the request target, query and all
    "status_echo": b"HTTP/1.1 2x0 %s" + HEAD_END,
    "redirect_echo": b"HTTP/1.1 302 Found\r\nLocation: http://[::1%s" + HEAD_END,
    "long_line_echo": b"",  # below: the credential as sent, cut by aiohttp's quote of a line
}
LINE_QUOTED = 100  # bytes of a too-long header value aiohttp's error quotes (then "...")


def long_line_echo(head: bytes) -> bytes:
    """A header value too long to parse, holding the credential as it was sent (the header's
    value, or the query parameter's) so that the first LINE_QUOTED bytes, which the error
    message quotes, end half-way through it."""
    lines = head.split(b"\r\n")
    query = urlsplit(lines[0].split(b" ")[1].decode()).query
    placed = next(
        (
            line.partition(b":")[2].strip()
            for line in lines
            if line.lower().startswith(b"authorization:")
        ),
        next(
            (p.partition("=")[2].encode() for p in query.split("&") if p.startswith("api_key=")),
            b"",
        ),
    )
    pad = b"p" * (LINE_QUOTED - len(placed) // 2)
    return b"HTTP/1.1 200 OK\r\nX-Echo: " + pad + placed + b"x" * 9000 + HEAD_END


@dataclass
class Raw:
    port: int = 0
    seen: list[str] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            head = await reader.readuntil(HEAD_END)
            target = head.split(b" ", 2)[1]
            case = parse_qs(urlsplit(target.decode()).query)["case"][0]
            self.seen.append(case)
            if case == "long_line_echo":
                writer.write(long_line_echo(head))
            else:
                writer.write(ECHO_CASES[case] % target if case in ECHO_CASES else RAW_CASES[case])
            await writer.drain()
        writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[Raw]:
    server = Raw()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    yield server
    listener.close()


# --- the run --------------------------------------------------------------------------------


def tool(registry: Registry, key: str, url: str, placement: str, credential: uuid.UUID) -> str:
    name, prefix = PLACEMENTS[placement]
    add_tool(
        registry, key=key, endpoint_url=url, auth_method="api_key", credential_ref=credential,
        auth_placement=placement, auth_param_name=name, auth_param_prefix=prefix,
        max_attempts=1,
    )  # fmt: skip
    registry.assign("bot", key)
    return key


async def test_a_secret_comes_back_in_no_spelling(
    worker_database: str, upstream: Upstream, raw: Raw
) -> None:
    master_key = generate_master_key()
    db = Database(worker_database)
    registry = Registry(db, uuid.uuid4())
    store = CredentialStore(db, Keyring.parse(master_key))
    credential = store.add(registry.owner, "api_key", "leaky", SECRET, ["127.0.0.1"])
    registry.create_agent("bot")
    echo = Echo()
    upstream.routes |= {"/ok": echo.ok, "/fail": echo.fail, "/cut": echo.cut}
    names = [f"placed_{k}" for k in spellings("")] + [f"secret_{k}" for k in spellings("")]

    invocations: dict[str, tuple[str, uuid.UUID]] = {}  # label -> (kind, id)
    for placement in PLACEMENTS:
        ok = tool(registry, f"echo.{placement}", f"{upstream.base_url}/ok", placement, credential)
        invocations[ok] = ("ok", registry.invoke("bot", ok, {}))
        for route in ("fail", "cut"):
            key = tool(
                registry, f"{route}.{placement}", f"{upstream.base_url}/{route}", placement,
                credential,
            )  # fmt: skip
            for name in names:
                invocations[f"{key}/{name}"] = (route, registry.invoke("bot", key, {"form": name}))
        key = tool(registry, f"raw.{placement}", f"http://127.0.0.1:{raw.port}/", placement,
                   credential)  # fmt: skip
        for case in [*RAW_CASES, *ECHO_CASES]:
            invocations[f"{key}/{case}"] = ("raw", registry.invoke("bot", key, {"case": case}))

    returncode, log = await run_worker(
        {
            "DATABASE_URL": worker_database,
            "TOOLRELAY_EGRESS_ALLOW": "127.0.0.1",
            "TOOLRELAY_MASTER_KEY": master_key,
        }
    )
    assert returncode == 0, log
    forms = every_spelling(echo.as_sent)
    assert any("%2B" in f for f in echo.as_sent)  # the query really was percent-encoded

    for label, (kind, inv_id) in invocations.items():
        got = registry.get_invocation(inv_id)
        texts = [got["error"] or "", *strings(got["output"])]
        texts += [a["error"] or "" for a in got["attempts"]]
        assert not any(leaks(text, forms) for text in texts), (label, texts)
        assert not any(URL_WITH_QUERY.search(text) for text in texts), (label, texts)
        if kind == "ok":  # every value the upstream echoed was one whole spelling
            assert got["status"] == "completed", (label, got["error"])
            assert set(got["output"].values()) == {REDACTED}, label
        elif kind == "fail":
            assert got["error"] == f"HTTP 500 from upstream: refused: {REDACTED}", label
        elif kind == "cut":
            assert got["error"].endswith(REDACTED + TRIMMED), (label, got["error"][-60:])
        else:
            assert got["status"] == "failed", label
    assert not leaks(log, forms), [line for line in log.splitlines() if leaks(line, forms)]
    assert log.count('"action": "dispatch"') == len(invocations)

    # The badly behaved answers were really given, and came back as errors.
    assert sorted(raw.seen) == sorted([*RAW_CASES, *ECHO_CASES] * len(PLACEMENTS))
    errors = {label: registry.get_invocation(i)["error"] for label, (_, i) in invocations.items()}
    assert "Too many headers received" in errors["raw.query/many_headers"]
    assert "cannot be parsed" in errors["raw.query/redirect_echo"]
    for placement in PLACEMENTS:  # said without the bytes aiohttp quotes (cut mid-secret)
        assert errors[f"raw.{placement}/long_line_echo"] == (
            "connection failed: 400, Got more than 8190 bytes when reading"
        ), placement


# --- the pieces -----------------------------------------------------------------------------


def test_exceptions_are_described_without_the_url_query() -> None:
    url = URL.build(scheme="http", host="127.0.0.1", port=8080, path="/p", query={"k": SECRET})
    info = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict()), url)
    response_error = aiohttp.ClientResponseError(info, (), status=400, message="Too many headers")
    assert str(url.raw_query_string) in str(response_error)  # what str() would have leaked
    assert describe(response_error) == "400, Too many headers"
    assert describe(aiohttp.InvalidURL(url, "bad port")) == "invalid URL: bad port"
    assert describe(aiohttp.InvalidURL(url)) == "invalid URL"
    timeout = aiohttp.ConnectionTimeoutError(f"Connection timeout to host {url}")
    assert describe(timeout) == "timed out"
    assert describe(aiohttp.ClientOSError(104, "Connection reset by peer")) == (
        "[Errno 104] Connection reset by peer"
    )
    message = f"see {url}, URL('{url}'), https://h?x, https://h/x#frag?x and 'GET /p?k=v HTTP/1.1'"
    assert without_queries(message) == (
        "see http://127.0.0.1:8080/p URL('http://127.0.0.1:8080/p https://h https://h/x"
        " and 'GET /p HTTP/1.1'"
    )


def test_scrub_knows_every_spelling_in_either_hex_case() -> None:
    forms = spellings(SECRET)
    mixed = forms["quote"].replace("%2B", "%2b")  # one escape lower-case, the rest upper
    for text in [*forms.values(), mixed]:
        assert scrub(f"<{text}>", [SECRET]) == f"<{REDACTED}>", text
    placed = "Bearer " + SECRET
    assert scrub({"h": placed, placed: 1}, [SECRET, placed]) == {"h": REDACTED, REDACTED: 1}
    assert scrub("ab", ["ab"]) == "ab"  # too short to scrub without redacting ordinary text


def test_scrub_knows_a_secret_escaped_character_by_character_in_any_mixture() -> None:
    """Each character but ASCII letters and digits may come back as itself, a JSON escape
    (either hex case) or an HTML character reference (named, decimal, hex), mixed as one
    page's template and another's JSON encoder left them."""
    tail = SECRET[len('Tr+ai/l=er&k%e"y\\é') :]
    mixed = [
        "Tr&#43;ai&sol;l&equals;er&AMP;k&#x0025;e\\u0022y&bsol;&eacute;" + tail,
        "Tr\\u002bai\\/l&#061;er\\u0026k%e&quot;y\\\\\\u00E9" + tail,
        'Tr+ai/l=er&amp;k%e\\"y\\&#XE9;' + tail,
    ]
    for text in mixed:
        assert scrub(f"<{text}>", [SECRET]) == f"<{REDACTED}>", text
    emoji = "key-\U0001f511-" + tail  # beyond the BMP: a JSON surrogate pair
    for text in (emoji, "key-\\ud83d\\uDD11-" + tail, "key-&#128273;-" + tail):
        assert scrub(f"<{text}>", [emoji]) == f"<{REDACTED}>", text
    # what is not the secret stays: another character, or a reference to another one
    for text in (mixed[0].replace("&AMP;", "&lt;"), mixed[1].replace("Tr", "Tx")):
        assert scrub(text, [SECRET]) == text, text


def test_a_go_spelling_cut_off_by_trim_is_redacted_to_its_start() -> None:
    """Go escapes U+2028 as well as <: a trimmed error ending half-way through that
    spelling of a secret is redacted from where the spelling starts."""
    secret = "line\u2028sep<" + SECRET[-12:]
    spelled = go_json(secret)
    cut = spelled[: spelled.index("\\u003c") + 8]  # past the escaped <, into the rest
    assert scrub(f"said: {cut}{TRIMMED}", [secret]) == f"said: {REDACTED}{TRIMMED}"


def test_a_secret_of_digits_echoed_as_a_json_number_is_scrubbed() -> None:
    """A PIN or account number used as the credential comes back as a number as readily as
    a string: {"pin": 8675309123}. Numbers are scrubbed when a secret could be one."""
    pin = "8675309123"
    assert scrub({"pin": 8675309123, "in": [48675309123.5], "n": 42}, [pin]) == {
        "pin": REDACTED, "in": [f"4{REDACTED}.5"], "n": 42,
    }  # fmt: skip
    assert scrub({"n": 8675309123}, [SECRET]) == {"n": 8675309123}  # no secret of digits
    assert scrub({"b": True}, ["True"]) == {"b": True}  # JSON's true is not a number


def test_hex_and_base64_inside_a_longer_text_are_scrubbed() -> None:
    """An upstream that hex-dumps what it received, or base64-encodes a string holding the
    secret (an opaque cursor made of the query it was sent): an audit found both reached
    the agent and the history."""
    raw = SECRET.encode()
    for hexed in (raw.hex(), raw.hex().upper()):
        assert REDACTED in scrub(f"got={hexed}", [SECRET]), hexed
    for before in ("", "a", "ab", "q=1&api_key="):
        for coder in (base64.b64encode, base64.urlsafe_b64encode):
            cursor = coder(before.encode() + raw + b"&page=2").decode()
            assert REDACTED in scrub({"next": cursor}, [SECRET])["next"], (before, cursor)
    assert scrub("nothing here but 4142434445", [SECRET]) == "nothing here but 4142434445"


def test_a_secret_cut_by_a_snippet_in_the_middle_of_a_message_is_redacted() -> None:
    """The 'expected a JSON response' error quotes 120 characters of the answer and goes on
    after them: a secret cut at the snippet's end was kept, its first part readable."""
    text = "raw_query=enc=raw&mode=text&api_key=" + SECRET
    snippet = text[: len("raw_query=enc=raw&mode=text&api_key=") + 12] + TRIMMED
    said = scrub(f"expected a JSON response (HTTP 200): {snippet} — is the endpoint URL right?",
                 [SECRET])  # fmt: skip
    assert SECRET[:12] not in said and f"{REDACTED}{TRIMMED} — is the endpoint" in said
