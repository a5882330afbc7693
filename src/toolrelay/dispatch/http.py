"""One outbound HTTP exchange under the egress guard: timeouts, size cap, redirects."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import aiohttp
from yarl import URL

from toolrelay.dispatch.bodies import encode_body
from toolrelay.dispatch.egress import EgressPolicy, origin, unwrap_egress_error
from toolrelay.errors import EgressBlocked

MAX_READ_REDIRECTS = 3
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
READ_CHUNK = 65536  # bytes
DESCRIBE_CHARS = 200  # of an exception's text in a message
# The query (and fragment) of a URL or request target in a message, where credentials may
# be placed: everything from the ? after a /path to the next space. The last line of
# defence; messages are built from exception parts that hold no URL in the first place.
_URL_QUERY = re.compile(r"(/[^\s?#]*)[?#]\S*")
# What aiohttp's parser errors quote of the answer, as a bytes literal (``Got more than 8190
# bytes when reading: b'…'``): the upstream's bytes, which may echo the credential, cut by
# aiohttp at 100 bytes where no scrubbing can see a whole spelling of it. Dropped.
_WIRE_BYTES = re.compile(r"""[:\s]*\bb(['"]).*""")


@dataclass
class SendSpec:
    method: str
    url: str
    headers: dict[str, str]
    body: Any | None
    connect_timeout: float
    total_timeout: float
    max_bytes: int
    follow_redirects: bool
    # Headers (and query parameter) carrying the credential, dropped on a cross-origin hop.
    secret_headers: frozenset[str] = frozenset()
    secret_query: str | None = None
    # The body as sent, encoded once here (bodies.py: JSON as aiohttp's json= would, or the
    # form the template's Content-Type declares), so the attempt row can record its size
    # and digest without encoding it again.
    payload: bytes | None = field(init=False, default=None)
    exchanges: int = 0  # hops answered so far: above 0, a request was sent

    def __post_init__(self) -> None:
        if self.body is not None:
            self.payload = encode_body(self.body, self.headers)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    content_type: str
    elapsed: float
    url: str


@dataclass
class SendFailure(Exception):
    """The exchange failed. ``left`` says whether the request may have reached the server."""

    code: str
    message: str
    left: bool
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


def outbound_session(connector: aiohttp.BaseConnector, **kwargs: Any) -> aiohttp.ClientSession:
    """A session for requests through the egress guard: a worker's calls and its webhook
    deliveries share one for every owner; a connect flow has its own.

    No cookie jar: a cookie one upstream set would go out with the next request to that
    host, whoever makes it (another owner's call acting in the first one's session there),
    and as a header the request rendered, approved and recorded did not have. No silent
    second send: aiohttp re-sends a GET, PUT or DELETE once when a kept-alive connection
    resets, and every send must be an attempt that is counted and recorded.
    """
    session = aiohttp.ClientSession(
        connector=connector, cookie_jar=aiohttp.DummyCookieJar(), **kwargs
    )
    session._retry_connection = False
    return session


async def send(session: aiohttp.ClientSession, policy: EgressPolicy, spec: SendSpec) -> Response:
    """Send, following redirects only for reads, each hop re-checked by the guard."""
    started = time.monotonic()
    url, headers = spec.url, dict(spec.headers)
    for _hop in range(MAX_READ_REDIRECTS + 1):
        response = await _exchange(session, policy, spec, url, headers)
        spec.exchanges += 1
        location = response.headers.get("Location")
        if not (spec.follow_redirects and response.status in REDIRECT_STATUSES and location):
            response.elapsed = time.monotonic() - started
            return response
        next_url = _redirect_target(url, location)
        if origin(next_url) != origin(URL(url)):
            headers = {k: v for k, v in headers.items() if k.lower() not in spec.secret_headers}
            if spec.secret_query:
                next_url = next_url.without_query_params(spec.secret_query)
        url = str(next_url)
    raise SendFailure("http_error", f"more than {MAX_READ_REDIRECTS} redirects", left=True)


def _redirect_target(url: str, location: str) -> URL:
    try:
        return URL(url).join(URL(location))
    except (ValueError, TypeError):
        raise SendFailure(
            "http_error", "the upstream redirected to a URL that cannot be parsed", left=True
        ) from None


async def _exchange(
    session: aiohttp.ClientSession,
    policy: EgressPolicy,
    spec: SendSpec,
    url: str,
    headers: dict[str, str],
) -> Response:
    policy.check_url(url)
    timeout = _timeout(spec.total_timeout, spec.connect_timeout)
    kwargs: dict[str, Any] = {"headers": headers, "timeout": timeout, "allow_redirects": False}
    if spec.payload is not None:
        kwargs["data"] = spec.payload
    try:
        async with session.request(spec.method, URL(url, encoded=True), **kwargs) as resp:
            body = await _read_capped(resp, spec.max_bytes)
            return Response(
                status=resp.status,
                headers=dict(resp.headers),
                body=body,
                content_type=resp.content_type,
                elapsed=0.0,
                url=url,
            )
    except EgressBlocked:
        raise
    except SendFailure:
        raise
    except Exception as exc:
        raise _classify(exc, spec) from None


@lru_cache(maxsize=256)  # a tool's two timeouts: one frozen object, not one per request
def _timeout(total: float, connect: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total, sock_connect=connect)


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise SendFailure(
            "response_too_large",
            f"response of {declared} bytes exceeds the tool's cap of {max_bytes} bytes",
            left=True,
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(READ_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise SendFailure(
                "response_too_large",
                f"response exceeds the tool's cap of {max_bytes} bytes",
                left=True,
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _classify(exc: BaseException, spec: SendSpec) -> BaseException:
    """Map a client exception to a SendFailure; knowing whether the request left matters."""
    blocked = unwrap_egress_error(exc)
    if blocked is not None:
        return blocked
    # Connect-phase failures: DNS, refused, TLS, connect timeout. The request never left.
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        return SendFailure("network_error", f"could not connect: {describe(exc)}", left=False)
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return SendFailure(
            "timeout", f"no complete response within {spec.total_timeout:g} s", left=True
        )
    if isinstance(exc, aiohttp.InvalidURL):
        return SendFailure("template_error", describe(exc), left=False)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return SendFailure("network_error", f"connection failed: {describe(exc)}", left=True)
    return SendFailure("network_error", f"unexpected client error: {type(exc).__name__}", left=True)


def describe(exc: BaseException) -> str:
    """One line about a client exception, built from its parts.

    ``str()`` of aiohttp's exceptions may hold the request URL with its query (a
    ClientResponseError ends in ``url='…?api_key=…'``, InvalidURL is the URL), so no part
    that holds a URL is used, and any URL left in the text loses its query.
    """
    if isinstance(exc, aiohttp.ClientResponseError):  # the response could not be read
        said = _WIRE_BYTES.sub("", exc.message)
        text = f"{exc.status}, {said}" if said else str(exc.status)
    elif isinstance(exc, aiohttp.ClientConnectorError):
        text = f"{exc.host}:{exc.port}: {_os_reason(exc.os_error)}"
    elif isinstance(exc, aiohttp.InvalidURL):
        text = f"invalid URL: {exc.description}" if exc.description else "invalid URL"
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        text = "server disconnected"  # its message may be the response head, as a repr
    elif isinstance(exc, TimeoutError):  # aiohttp's connect timeout names the URL
        text = "timed out"
    elif isinstance(exc, OSError) and not isinstance(exc, aiohttp.ClientError):
        text = _os_reason(exc)
    else:
        text = str(exc)
    line = next(iter(text.splitlines()), "") or type(exc).__name__
    return without_queries(line)[:DESCRIBE_CHARS]


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def without_queries(text: str) -> str:
    """``text`` with the query and fragment of every URL and request target removed."""
    return _URL_QUERY.sub(r"\1", text)
