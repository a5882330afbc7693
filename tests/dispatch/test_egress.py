"""Tests of the SSRF egress guard.

Network tests only talk to servers they start on 127.0.0.1. The ``connect_log`` fixture
records every socket connect aiohttp attempts and refuses any that is not to 127.0.0.1, so
even a broken guard could not send traffic elsewhere; "refused before any connection" is
asserted as an empty log.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from toolrelay.dispatch.egress import (
    EgressPolicy,
    GuardedResolver,
    is_public_address,
    make_connector,
    unwrap_egress_error,
)
from toolrelay.dispatch.http import SendSpec, outbound_session, send
from toolrelay.errors import ConfigurationError, EgressBlocked


def policy(allow: str = "") -> EgressPolicy:
    return EgressPolicy.from_env({"TOOLRELAY_EGRESS_ALLOW": allow})


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
async def connect_log(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every address aiohttp tries to connect to; anything but 127.0.0.1 is refused."""
    loop = asyncio.get_running_loop()
    real_connect = loop.sock_connect
    attempts: list[Any] = []

    async def recording_connect(sock: socket.socket, address: Any) -> None:
        attempts.append(address)
        if address[0] != "127.0.0.1":
            raise ConnectionRefusedError(f"test harness refuses {address!r}")
        await real_connect(sock, address)

    monkeypatch.setattr(loop, "sock_connect", recording_connect)
    return attempts


@dataclass
class Server:
    port: int
    hits: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


StartServer = Callable[..., Awaitable[Server]]


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start aiohttp servers on 127.0.0.1 that count requests, optionally redirecting."""
    servers: list[TestServer] = []

    async def start(redirect_to: str | None = None) -> Server:
        record = Server(port=0)

        async def handle(request: web.Request) -> web.StreamResponse:
            record.hits.append(str(request.url))
            record.headers.append(dict(request.headers))
            if redirect_to is not None:
                raise web.HTTPFound(redirect_to)
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/", handle)
        test_server = TestServer(app, host="127.0.0.1")
        await test_server.start_server()
        servers.append(test_server)
        assert test_server.port is not None
        record.port = test_server.port
        return record

    yield start
    for test_server in servers:
        await test_server.close()


async def fetch(session: aiohttp.ClientSession, guard: EgressPolicy, url: str) -> int:
    """Follow redirects the way the dispatcher does: check_url before every hop."""
    for _ in range(5):
        guard.check_url(url)
        async with session.get(url, allow_redirects=False) as response:
            if response.status not in (301, 302, 303, 307, 308):
                return response.status
            url = str(response.url.join(URL(response.headers["Location"])))
    raise AssertionError("too many redirects")


# --- is_public_address ---------------------------------------------------------------------

PUBLIC = ["8.8.8.8", "1.1.1.1", "9.9.9.9", "2606:4700::1111", "2a00:1450:4001:80b::200e"]
NOT_PUBLIC = [
    "127.0.0.1",
    "127.255.255.254",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",
    "169.254.0.1",
    "100.64.0.1",
    "100.127.255.255",
    "0.0.0.0",
    "0.1.2.3",
    "192.0.0.8",
    "192.0.2.1",
    "198.18.0.1",
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "::",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:8.8.8.8",
    "::ffff:0:8.8.8.8",
    "::8.8.8.8",
    "64:ff9b::7f00:1",
    "64:ff9b::808:808",
    "64:ff9b:1::1",
    "2002:7f00:1::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:db8::1",
    "3fff::1",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "fe80::1%eth0",
    "fec0::1",
    "ff02::1",
    "100::1",
    "4000::1",
]


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_public(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_special_addresses_are_not_public(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


# --- check_url -----------------------------------------------------------------------------

# Every form the spec requires refused, with text the message must name.
BLOCKED_LITERALS = [
    ("127.0.0.1", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"),
    ("0.0.0.0", "unspecified"),
    ("[::1]", "loopback"),
    ("[::ffff:127.0.0.1]", "IPv4-mapped, embeds 127.0.0.1"),
    ("[fc00::1]", "unique local"),
    ("[64:ff9b::7f00:1]", "NAT64, embeds 127.0.0.1"),
    ("2130706433", "non-canonical numeric IPv4"),
    ("0x7f.0.0.1", "non-canonical numeric IPv4"),
    ("017700000001", "non-canonical numeric IPv4"),
    ("127.1", "non-canonical numeric IPv4"),
]


@pytest.mark.parametrize(("host", "reason"), BLOCKED_LITERALS)
def test_check_url_refuses_blocked_literals(host: str, reason: str) -> None:
    with pytest.raises(EgressBlocked) as caught:
        policy().check_url(f"http://{host}:8080/path")
    assert reason in caught.value.message
    assert caught.value.message.startswith("egress blocked: ")


@pytest.mark.parametrize(
    "url", ["ftp://example.com/", "file:///etc/passwd", "gopher://example.com/", "ws://x/", "x"]
)
def test_check_url_refuses_other_schemes(url: str) -> None:
    with pytest.raises(EgressBlocked, match="scheme"):
        policy().check_url(url)


def test_check_url_refuses_url_without_host() -> None:
    with pytest.raises(EgressBlocked, match="no host"):
        policy().check_url("http:///path")


def test_check_url_passes_public_literals_and_names() -> None:
    guard = policy()
    for url in ["https://8.8.8.8/", "http://[2606:4700::1111]:8080/", "https://example.com/a?b=c"]:
        guard.check_url(url)
    # Names are judged on what they resolve to, in the resolver.
    guard.check_url("http://localhost/")


def test_messages_do_not_repeat_url_secrets() -> None:
    with pytest.raises(EgressBlocked) as caught:
        policy().check_url("http://user:hunter2@10.0.0.1/?token=s3cret")
    assert "hunter2" not in caught.value.message
    assert "s3cret" not in caught.value.message


def test_disabled_policy_checks_only_the_scheme() -> None:
    guard = EgressPolicy(allow_hosts=frozenset(), allow_networks=(), enabled=False)
    guard.check_url("http://127.0.0.1/")
    guard.check_address("localhost", "127.0.0.1")
    with pytest.raises(EgressBlocked):
        guard.check_url("file:///etc/passwd")


# --- check_address and the allow list ------------------------------------------------------


def test_localhost_message_names_host_address_and_reason() -> None:
    with pytest.raises(EgressBlocked) as caught:
        policy().check_address("localhost", "127.0.0.1")
    assert caught.value.message == (
        "egress blocked: localhost resolves to 127.0.0.1 (loopback); "
        "add it to TOOLRELAY_EGRESS_ALLOW to allow"
    )


def test_ip_entry_matches_resolved_address_of_any_name() -> None:
    guard = policy("127.0.0.1")
    guard.check_address("localhost", "127.0.0.1")
    guard.check_url("http://127.0.0.1:1234/")
    with pytest.raises(EgressBlocked):
        guard.check_address("localhost", "127.0.0.2")
    with pytest.raises(EgressBlocked):  # the mapped form is a different address
        guard.check_url("http://[::ffff:127.0.0.1]/")


def test_hostname_entry_matches_name_exactly_not_its_address() -> None:
    guard = policy("localhost")
    guard.check_address("localhost", "127.0.0.1")
    guard.check_address("LocalHost.", "::1")
    for host in ["localhost.evil.example", "mylocalhost", "127.0.0.1"]:
        with pytest.raises(EgressBlocked):
            guard.check_address(host, "127.0.0.1")
    with pytest.raises(EgressBlocked):
        guard.check_url("http://127.0.0.1/")


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254"])
def test_a_host_name_entry_never_opens_the_cloud_metadata_address(address: str) -> None:
    """DNS is hostile: `api.internal` allowed for an internal service must not become the
    machine's credentials when its name resolves to the metadata address (a poisoned or
    mistyped record). Only an entry naming that address itself opens it (and warns)."""
    guard = policy("api.internal")
    guard.check_address("api.internal", "10.0.0.7")  # what the entry is for
    with pytest.raises(EgressBlocked, match="metadata"):
        guard.check_address("api.internal", address)
    policy(address).check_address("api.internal", address)  # named by address: as written


def test_cidr_entries_open_exactly_their_network() -> None:
    guard = policy("10.0.0.0/8, fc00::/7")
    guard.check_url("http://10.1.2.3/")
    guard.check_url("http://[fd00::1]/")
    for url in ["http://172.16.0.1/", "http://[::1]/", "http://169.254.169.254/"]:
        with pytest.raises(EgressBlocked):
            guard.check_url(url)


def test_from_env_parses_entries() -> None:
    guard = policy(" localhost , Example.COM.,10.0.0.0/8,127.0.0.1,::1,,")
    assert guard.allow_hosts == frozenset({"localhost", "example.com"})
    assert guard.allow_networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("::1/128"),
    )
    assert guard.enabled


def test_from_env_defaults_to_empty_and_reads_os_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert policy() == EgressPolicy(allow_hosts=frozenset(), allow_networks=())
    monkeypatch.setenv("TOOLRELAY_EGRESS_ALLOW", "api.internal")
    assert EgressPolicy.from_env().allow_hosts == frozenset({"api.internal"})
    monkeypatch.delenv("TOOLRELAY_EGRESS_ALLOW")
    assert EgressPolicy.from_env().allow_hosts == frozenset()


@pytest.mark.parametrize(
    "entry",
    [
        "http://example.com",
        "*.example.com",
        "localhost:99999",  # entries may name a port, but not one out of range
        "bad host",
        "10.0.0.1/8",
        "10.0.0.0/33",
        "999.1.1.1",
        "0x7f.0.0.1",
        "2130706433",
        "[::1]",
        "-bad-.example",
        "bücher.example",
    ],
)
def test_from_env_rejects_malformed_entries(entry: str) -> None:
    with pytest.raises(ConfigurationError, match="TOOLRELAY_EGRESS_ALLOW"):
        policy(f"localhost,{entry}")


# --- GuardedResolver -----------------------------------------------------------------------


class FixedResolver(AbstractResolver):
    """Answers every lookup with fixed addresses; no DNS traffic."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses
        self.calls = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.calls += 1
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in self.addresses
        ]

    async def close(self) -> None:
        pass


async def test_resolver_refuses_unless_every_address_is_acceptable() -> None:
    dual = FixedResolver("127.0.0.1", "::1")
    with pytest.raises(EgressBlocked, match=r"dual\.test resolves to ::1 \(loopback\)"):
        await GuardedResolver(policy("127.0.0.1"), dual).resolve("dual.test", 80)
    results = await GuardedResolver(policy("127.0.0.1,::1"), dual).resolve("dual.test", 80)
    assert [r["host"] for r in results] == ["127.0.0.1", "::1"]

    mixed = FixedResolver("8.8.8.8", "10.0.0.1")
    with pytest.raises(EgressBlocked, match=r"10\.0\.0\.1"):
        await GuardedResolver(policy(), mixed).resolve("mixed.test", 443)


async def test_resolver_checks_every_lookup_so_rebinding_is_caught() -> None:
    inner = FixedResolver("8.8.8.8")
    resolver = GuardedResolver(policy(), inner)
    assert len(await resolver.resolve("rebind.test", 80)) == 1
    inner.addresses = ("169.254.169.254",)
    with pytest.raises(EgressBlocked, match="cloud metadata"):
        await resolver.resolve("rebind.test", 80)
    assert inner.calls == 2


async def test_resolver_refuses_numeric_forms_before_resolving() -> None:
    inner = FixedResolver("8.8.8.8")
    with pytest.raises(EgressBlocked, match="non-canonical"):
        await GuardedResolver(policy("127.0.0.1"), inner).resolve("0x7f.0.0.1", 80)
    assert inner.calls == 0


async def test_connector_never_caches_dns() -> None:
    connector = make_connector(policy(), limit=7, limit_per_host=3)
    try:
        assert connector.use_dns_cache is False
        assert (connector.limit, connector.limit_per_host) == (7, 3)
    finally:
        await connector.close()


# --- real requests through make_connector --------------------------------------------------

REQUIRED_FORMS = [host for host, _ in BLOCKED_LITERALS] + ["localhost"]


@pytest.mark.parametrize("host", REQUIRED_FORMS)
async def test_blocked_forms_refused_before_any_connection(
    host: str, connect_log: list[Any], start_server: StartServer
) -> None:
    # Straight through the session, without check_url: the connector alone must refuse.
    server = await start_server()
    async with aiohttp.ClientSession(connector=make_connector(policy())) as session:
        with pytest.raises(EgressBlocked):
            await session.get(f"http://{host}:{server.port}/")
    assert connect_log == []
    assert server.hits == []


async def test_allowing_127_0_0_1_admits_the_ip_and_localhost(
    connect_log: list[Any], start_server: StartServer
) -> None:
    server = await start_server()
    guard = policy("127.0.0.1")
    localhost = {
        info[4][0]
        for info in socket.getaddrinfo(
            "localhost", server.port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
        )
    }
    async with aiohttp.ClientSession(connector=make_connector(guard)) as session:
        assert await fetch(session, guard, f"http://127.0.0.1:{server.port}/") == 200
        if localhost == {"127.0.0.1"}:
            assert await fetch(session, guard, f"http://localhost:{server.port}/") == 200
        else:  # strict: ::1 is not allowed, so localhost is refused as a whole
            with pytest.raises(EgressBlocked):
                await fetch(session, guard, f"http://localhost:{server.port}/")
    assert {address[0] for address in connect_log} == {"127.0.0.1"}


async def test_allowing_localhost_by_name_keeps_the_literal_blocked(
    connect_log: list[Any], start_server: StartServer
) -> None:
    server = await start_server()
    guard = policy("localhost")
    async with aiohttp.ClientSession(connector=make_connector(guard)) as session:
        assert await fetch(session, guard, f"http://localhost:{server.port}/") == 200
        connects = len(connect_log)
        with pytest.raises(EgressBlocked):
            await session.get(f"http://127.0.0.1:{server.port}/")
    assert len(connect_log) == connects
    assert len(server.hits) == 1


async def test_redirect_to_private_ip_is_refused(
    connect_log: list[Any], start_server: StartServer
) -> None:
    origin = await start_server(redirect_to="http://10.0.0.1/latest/meta-data")
    guard = policy("127.0.0.1")
    async with aiohttp.ClientSession(connector=make_connector(guard)) as session:
        with pytest.raises(EgressBlocked, match=r"10\.0\.0\.1 is not public \(private\)"):
            await fetch(session, guard, f"http://127.0.0.1:{origin.port}/")
        # aiohttp's own redirect following is stopped by the connector as well.
        with pytest.raises(EgressBlocked):
            await session.get(f"http://127.0.0.1:{origin.port}/")
    assert len(origin.hits) == 2
    assert {address[0] for address in connect_log} == {"127.0.0.1"}


async def test_a_cross_origin_redirect_carries_no_credential(start_server: StartServer) -> None:
    """A read follows redirects; the hop to another origin (here another port) goes without
    the credential's header and query parameter, even where the Location repeats it."""
    secret = "sk-0123456789abcdef"
    target = await start_server()
    origin = await start_server(redirect_to=f"http://127.0.0.1:{target.port}/?api_key={secret}")
    guard = policy("127.0.0.1")
    spec = SendSpec("GET", f"http://127.0.0.1:{origin.port}/?api_key={secret}",
                    {"Authorization": f"Bearer {secret}"}, None, 5, 5, 1000, True,
                    secret_headers=frozenset({"authorization"}), secret_query="api_key")  # fmt: skip
    async with outbound_session(make_connector(guard)) as session:
        assert (await send(session, guard, spec)).status == 200
    assert origin.headers[0]["Authorization"] == f"Bearer {secret}"
    assert secret in origin.hits[0]
    assert [secret in str(target.headers[0]), secret in target.hits[0]] == [False, False]


async def test_redirect_to_unallowed_loopback_is_refused(
    connect_log: list[Any], start_server: StartServer
) -> None:
    target = await start_server()
    origin = await start_server(redirect_to=f"http://127.0.0.1:{target.port}/")
    guard = policy("localhost")
    async with aiohttp.ClientSession(connector=make_connector(guard)) as session:
        with pytest.raises(EgressBlocked, match=r"127\.0\.0\.1 is not public \(loopback\)"):
            await fetch(session, guard, f"http://localhost:{origin.port}/")
        with pytest.raises(EgressBlocked):
            await session.get(f"http://localhost:{origin.port}/")
    assert len(origin.hits) == 2
    assert target.hits == []
    assert {address[1] for address in connect_log} == {origin.port}


async def test_proxies_are_refused(connect_log: list[Any], start_server: StartServer) -> None:
    proxy = await start_server()
    guard = policy("127.0.0.1")
    async with aiohttp.ClientSession(connector=make_connector(guard)) as session:
        with pytest.raises(EgressBlocked, match="proxy"):
            await session.get("http://example.com/", proxy=f"http://127.0.0.1:{proxy.port}")
    assert connect_log == []
    assert proxy.hits == []


# --- unwrap_egress_error -------------------------------------------------------------------


def test_unwrap_egress_error_finds_it_in_the_chain() -> None:
    blocked = EgressBlocked("egress blocked: x")
    assert unwrap_egress_error(blocked) is blocked

    try:
        try:
            raise blocked
        except EgressBlocked as exc:
            raise aiohttp.ClientConnectionError("wrapped") from exc
    except aiohttp.ClientConnectionError as wrapped:
        assert unwrap_egress_error(wrapped) is blocked

    try:
        try:
            raise blocked
        except EgressBlocked:
            raise OSError("during handling") from None
    except OSError as hidden:
        assert unwrap_egress_error(hidden) is None  # suppressed context is not followed
        assert hidden.__context__ is blocked

    looped = ValueError("a")
    looped.__context__ = ValueError("b")
    looped.__context__.__context__ = looped
    assert unwrap_egress_error(looped) is None


# --- properties ----------------------------------------------------------------------------

ipv4s = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
ipv6s = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)

# Written out independently of the module's tables.
BLOCKED_NETWORKS = [
    ipaddress.ip_network(net)
    for net in [
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.2.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
        "::/96",
        "::ffff:0:0/96",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2001::/32",
        "2001:db8::/32",
        "2002::/16",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    ]
]


@st.composite
def blocked_addresses(draw: st.DrawFn) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    network = draw(st.sampled_from(BLOCKED_NETWORKS))
    return network[draw(st.integers(0, network.num_addresses - 1))]


@given(st.one_of(ipv4s, ipv6s))
def test_is_public_address_never_raises_and_agrees_with_check_address(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    public = is_public_address(ip)
    assert isinstance(public, bool)
    try:
        policy().check_address("host.test", str(ip))
    except EgressBlocked:
        assert not public
    else:
        assert public


@given(blocked_addresses())
def test_addresses_in_blocked_networks_are_refused(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    assert not is_public_address(ip)
    with pytest.raises(EgressBlocked):
        policy().check_url(f"http://[{ip}]/" if ip.version == 6 else f"http://{ip}/")


@given(st.one_of(ipv4s, ipv6s))
def test_an_allowed_address_is_always_let_through(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    policy(str(ip)).check_address("host.test", str(ip))


@given(
    st.one_of(
        st.text(),
        st.text(alphabet="0123456789abcdefx.:/,[]*% -_"),
        st.lists(st.sampled_from(["localhost", "10.0.0.0/8", "::1", "a.b", "1.2.3.4", " "])).map(
            ",".join
        ),
    )
)
def test_from_env_parses_or_raises_configuration_error(raw: str) -> None:
    try:
        guard = policy(raw)
    except ConfigurationError:
        return
    assert all(isinstance(host, str) and host for host in guard.allow_hosts)
