"""Allow entries with ports and scopes, no exception on another origin, pooled connections
checked again, and egress errors that tell the agent no address (issue 12, finding 6).

The rules are tested without a network, then on loopback through real connections. Tests
that need private addresses (10.0.0.5, 169.254.169.254) run the worker inside a private
network namespace (tests/security/private_net.py), so a broken guard is seen and nothing
leaves the machine; where no namespace can be made they are skipped, saying why.
"""

from __future__ import annotations

import ipaddress
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from tests.dispatch.test_egress import (
    FixedResolver,
    StartServer,
    connect_log,
    policy,
    start_server,
)
from tests.dispatch.upstream import Upstream, start_upstream
from tests.registry.helpers import add_tool
from tests.security.private_net import (
    ServiceSpec,
    run_private,
    unix_database_url,
    why_unavailable,
    worker_database,
)
from toolrelay.credentials import CredentialStore, Keyring, generate_master_key
from toolrelay.db import Database
from toolrelay.dispatch.egress import AllowEntry, EgressPolicy, GuardedResolver, make_connector
from toolrelay.dispatch.outcome import AGENT_MESSAGES, Outcome
from toolrelay.errors import ConfigurationError, EgressBlocked
from toolrelay.registry import Registry

__all__ = ["connect_log", "start_server", "worker_database"]  # fixtures from elsewhere

Drain = Callable[..., Awaitable[Any]]
BLOCKED = "egress_blocked"
AGENT_MESSAGE = AGENT_MESSAGES[BLOCKED]
CREDENTIAL = uuid.UUID("0b6f2a8e-61a1-4c1e-9d55-3f0d8e7f4a10")
net = ipaddress.ip_network


# --- the syntax -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "target", "port", "tool", "credential"),
    [
        ("10.0.0.5:5000", net("10.0.0.5/32"), 5000, None, None),
        ("api.internal:8443", "api.internal", 8443, None, None),
        ("API.Internal.:8443", "api.internal", 8443, None, None),
        ("10.1.0.0/16:5432", net("10.1.0.0/16"), 5432, None, None),
        ("[fd00::5]:8080", net("fd00::5/128"), 8080, None, None),
        ("[fd00::/8]:8080", net("fd00::/8"), 8080, None, None),
        ("10.0.0.5:5000@tool=postiz.*", net("10.0.0.5/32"), 5000, "postiz.*", None),
        (f"10.0.0.7@credential={CREDENTIAL}", net("10.0.0.7/32"), None, None, CREDENTIAL),
        (
            f"api.internal@tool=a.b@credential={str(CREDENTIAL).upper()}",
            "api.internal",
            None,
            "a.b",
            CREDENTIAL,
        ),
    ],
)
def test_entries_name_a_port_and_a_scope(
    entry: str, target: Any, port: int | None, tool: str | None, credential: uuid.UUID | None
) -> None:
    guard = policy(f"localhost, {entry}")
    assert guard.entries == (AllowEntry(target, port, tool, credential, entry),)
    assert guard.allow_hosts == frozenset({"localhost"})  # plain entries as before


def test_an_entry_without_port_or_scope_stays_plain() -> None:
    guard = policy("10.0.0.5, fd00::5, api.internal")
    assert guard.entries == ()
    assert guard.allow_networks == (net("10.0.0.5/32"), net("fd00::5/128"))
    for port in (1, 5000, 5432, 65535):  # any port, as before
        guard.check_url(f"http://10.0.0.5:{port}/")
        guard.check_address("api.internal", "10.9.9.9", port)


@pytest.mark.parametrize(
    "entry",
    [
        "10.0.0.5:0",
        "10.0.0.5:65536",
        "10.0.0.5:http",
        "10.0.0.5:",
        "10.0.0.5:+80",
        "[fd00::5]",
        "[fd00::5]:",
        "[10.0.0.5]:80",
        "[api.internal]:80",
        "host:80:90",
        "10.0.0.5@",
        "@tool=x",
        "10.0.0.5@tool=",
        "10.0.0.5@tool=a b",
        "10.0.0.5@tool=a@tool=b",
        "10.0.0.5@owner=x",
        "10.0.0.5@credential=not-a-uuid",
        "http://10.0.0.5:80",
        "*.internal:80",
    ],
)
def test_malformed_entries_are_refused(entry: str) -> None:
    with pytest.raises(ConfigurationError, match="TOOLRELAY_EGRESS_ALLOW"):
        policy(entry)


@given(st.text(alphabet="0123456789abcdef.:/[]@=*-_ toolcredntiaxyz,", max_size=60))
def test_any_entry_text_parses_or_is_a_configuration_error(raw: str) -> None:
    try:
        guard = policy(raw)
    except ConfigurationError:
        return
    assert all(entry.port is not None or entry.scoped for entry in guard.entries)


# --- the rules, without a network -----------------------------------------------------------


def test_a_port_entry_opens_only_its_port() -> None:
    guard = policy("10.0.0.5:5000, [fd00::5]:8080, 10.1.0.0/16:443, api.internal:8443")
    guard.check_url("http://10.0.0.5:5000/")
    guard.check_url("http://[fd00::5]:8080/")
    guard.check_url("https://10.1.2.3/")  # the scheme's port
    guard.check_address("api.internal", "10.9.9.9", 8443)
    for url in ["http://10.0.0.5:5432/", "http://10.0.0.5/", "http://[fd00::5]:8081/"]:
        with pytest.raises(EgressBlocked, match=r"allows it on port \d+ only"):
            guard.check_url(url)
    with pytest.raises(EgressBlocked, match="on port 8443 only"):
        guard.check_address("api.internal", "10.9.9.9", 443)
    with pytest.raises(EgressBlocked, match="add it to TOOLRELAY_EGRESS_ALLOW"):
        guard.check_url("http://10.2.0.1:443/")


def test_scoped_entries_apply_only_to_their_tool_or_credential() -> None:
    guard = policy(
        f"10.0.0.5:5000@tool=postiz.*, 10.0.0.7@credential={CREDENTIAL},"
        f" 10.0.0.8@tool=a.b@credential={CREDENTIAL}"
    )
    five, seven, eight = "http://10.0.0.5:5000/x", "http://10.0.0.7:9000/", "http://10.0.0.8/"
    allowed = [
        ("postiz.create_post", None, five),
        ("postiz.", None, five),
        ("any.tool", CREDENTIAL, seven),
        ("any.tool", str(CREDENTIAL), seven),
        ("a.b", CREDENTIAL, eight),
    ]
    refused = [
        ("weather.get", None, five),
        ("postiz", None, five),
        ("Postiz.create_post", None, five),  # tool keys are case-sensitive
        ("xpostiz.create_post", None, five),
        ("any.tool", None, seven),
        ("any.tool", uuid.uuid4(), seven),
        ("a.b", None, eight),
        ("a.bc", CREDENTIAL, eight),
    ]
    for tool, credential, url in allowed:
        with guard.dispatching(tool, credential, url):
            guard.check_url(url)
    for tool, credential, url in refused:
        with guard.dispatching(tool, credential, url), pytest.raises(EgressBlocked) as caught:
            guard.check_url(url)
        assert f"is not for tool {tool}" in caught.value.message
    with pytest.raises(EgressBlocked, match="is not for requests outside a tool call"):
        guard.check_url(five)  # a token endpoint, say: scoped entries are for tool calls


def test_no_entry_applies_on_another_origin_than_the_tool_endpoint() -> None:
    guard = policy("127.0.0.1, 10.0.0.5:5000@tool=t, 169.254.169.254")
    endpoint = "http://127.0.0.1:8080/items/{{input.id}}"  # as registered, placeholders and all
    with guard.dispatching("t", None, endpoint):
        guard.check_url("http://127.0.0.1:8080/items/7?page=2")  # its own origin
        guard.check_url("http://8.8.8.8/")  # public addresses need no exception
        for hop in [
            "http://10.0.0.5:5000/",
            "http://169.254.169.254/latest/meta-data",
            "http://127.0.0.1:8081/",
            "https://127.0.0.1:8080/",
        ]:
            with pytest.raises(EgressBlocked, match="redirect away from the tool's endpoint"):
                guard.check_url(hop)
    # Outside a tool call the unscoped entries still apply to any URL.
    guard.check_url("http://169.254.169.254/latest/meta-data")
    guard.check_url("http://127.0.0.1:8081/")


async def test_a_host_name_entry_with_a_port_matches_the_url_host_on_that_port() -> None:
    resolver = GuardedResolver(policy("api.internal:8443"), FixedResolver("10.0.0.9"))
    assert len(await resolver.resolve("api.internal", 8443)) == 1
    with pytest.raises(EgressBlocked, match="on port 8443 only"):
        await resolver.resolve("api.internal", 443)
    with pytest.raises(EgressBlocked, match=r"other\.internal resolves to 10\.0\.0\.9"):
        await resolver.resolve("other.internal", 8443)


def test_an_egress_outcome_gives_the_agent_a_plain_message_and_the_owner_the_detail() -> None:
    detail = "egress blocked: api.internal resolves to 10.0.0.5 (private) on port 80; …"
    outcome = Outcome.failed("egress_blocked", detail)
    assert (outcome.error, outcome.detail) == (AGENT_MESSAGE, detail)
    assert "destination not allowed" in AGENT_MESSAGE and "egress_blocked" in AGENT_MESSAGE
    other = Outcome.failed("http_error", "HTTP 500 from upstream: x")
    assert (other.error, other.detail) == ("HTTP 500 from upstream: x", None)


# --- loopback, through real connections -----------------------------------------------------


async def test_a_kept_alive_connection_is_checked_again_when_handed_out(
    connect_log: list[Any], start_server: StartServer
) -> None:
    server = await start_server()
    url = f"http://127.0.0.1:{server.port}/"
    guard = policy(f"127.0.0.1:{server.port}@tool=allowed.tool")
    async with aiohttp.ClientSession(connector=make_connector(guard)) as session:
        # Straight through the session: the connector alone must hold.
        with guard.dispatching("allowed.tool", None, url):
            async with session.get(url) as response:
                assert response.status == 200
        # aiohttp now hands the pooled connection out again without resolving anything.
        with (
            guard.dispatching("other.tool", None, url),
            pytest.raises(EgressBlocked, match="is not for tool other.tool"),
        ):
            await session.get(url)
        with pytest.raises(EgressBlocked, match="outside a tool call"):
            await session.get(url)
        with guard.dispatching("allowed.tool", None, url):
            async with session.get(url) as response:
                assert response.status == 200
    assert len(server.hits) == 2
    assert len(connect_log) == 1  # one connection, reused: refused when handed out


@pytest.fixture
async def internal() -> AsyncIterator[Upstream]:
    """A second loopback upstream: an internal service, allow-listed."""
    server, runner = await start_upstream()
    yield server
    await runner.cleanup()


def port_of(server: Upstream) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


@pytest.mark.parametrize("scope", ["", "@tool=*.read"])  # unscoped, or in both tools' scope
async def test_an_open_redirect_does_not_reach_an_allow_listed_host(
    registry: Registry,
    upstream: Upstream,
    internal: Upstream,
    drain: Drain,
    connect_log: list[Any],
    scope: str,
) -> None:
    async def open_redirect(request: web.Request, _hit: int) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    upstream.routes["/go"] = open_redirect
    inside = f"{internal.base_url}/data"
    public = add_tool(
        registry, key="public.read", endpoint_url=f"{upstream.base_url}/go?to={inside}"
    )
    own = add_tool(registry, key="internal.read", endpoint_url=inside)
    registry.create_agent("bot")
    for tool in (public, own):
        registry.assign("bot", tool["key"])
    via_redirect = registry.invoke("bot", "public.read", {})
    direct = registry.invoke("bot", "internal.read", {})
    allow = f"127.0.0.1:{port_of(upstream)}, 127.0.0.1:{port_of(internal)}{scope}"
    await drain(egress=policy(allow))

    assert registry.get_invocation(direct)["status"] == "completed"
    got = registry.get_invocation(via_redirect)
    assert (got["status"], got["error_code"], got["error"]) == ("failed", BLOCKED, AGENT_MESSAGE)
    detail = got["attempts"][0]["error"]
    assert f"127.0.0.1 is not public (loopback) on port {port_of(internal)}" in detail
    assert "never applies to a redirect away from the tool's endpoint origin" in detail
    assert upstream.hits["/go"] == 1
    assert internal.by_invocation == {str(direct): 1}
    assert {address[1] for address in connect_log} == {port_of(upstream), port_of(internal)}


async def test_the_agent_learns_no_dns_answer_the_owner_does(
    registry: Registry, upstream: Upstream, drain: Drain
) -> None:
    add_tool(registry, key="named.read", endpoint_url=f"http://localhost:{port_of(upstream)}/x")
    registry.create_agent("bot")
    registry.assign("bot", "named.read")
    inv = registry.invoke("bot", "named.read", {})
    await drain(egress=EgressPolicy.from_env({}))  # the default: nothing private allowed
    got = registry.get_invocation(inv)
    assert (got["error_code"], got["error"]) == (BLOCKED, AGENT_MESSAGE)
    [attempt] = got["attempts"]
    assert attempt["error_code"] == "egress_blocked"
    assert "localhost resolves to" in attempt["error"] and "loopback" in attempt["error"]
    assert upstream.seen == []


# --- private addresses, the worker in a network namespace -----------------------------------

INTERNAL = "10.0.0.5"  # an internal API on :5000, a database on :5432
METADATA = "169.254.169.254"
PARTNER = "10.0.0.7"  # reached with one credential only
FRONT = "127.0.0.1:8080"  # stands in for a public host: an open redirect at /go
SERVICES = [
    ServiceSpec("api", INTERNAL, 5000),
    ServiceSpec("database", INTERNAL, 5432),
    ServiceSpec("metadata", METADATA, 80),
    ServiceSpec("partner", PARTNER, 8000),
    ServiceSpec("front", "127.0.0.1", 8080),
]


def go(to: str) -> str:
    return f"http://{FRONT}/go?to={to}"


class Case(NamedTuple):
    endpoint_url: str
    outcome: str  # completed, or egress_blocked
    told_owner: str = ""  # in the attempt row's error
    credential: bool = False


REDIRECT = "never applies to a redirect away from the tool's endpoint origin"
SCENARIO = {
    "internal.read": Case(f"http://{INTERNAL}:5000/data", "completed"),
    "internal.hop": Case(f"http://{INTERNAL}:5000/hop", "completed"),  # to /data, same origin
    "weather.read": Case(
        f"http://{INTERNAL}:5000/data",
        BLOCKED,
        "entry '10.0.0.5:5000@tool=internal.*' is not for tool weather.read",
    ),
    "internal.db": Case(f"http://{INTERNAL}:5432/", BLOCKED, "allows it on port 5000 only"),
    "metadata.read": Case(f"http://{METADATA}/latest/meta-data", "completed"),
    "partner.read": Case(f"http://{PARTNER}:8000/x", "completed", credential=True),
    "partner.anonymous": Case(
        f"http://{PARTNER}:8000/x", BLOCKED, "is not for tool partner.anonymous with no credential"
    ),
    # Open redirects on the front, to entries that are in scope, unscoped, or the credential's.
    "internal.redirected": Case(go(f"http://{INTERNAL}:5000/data"), BLOCKED, REDIRECT),
    "front.metadata": Case(go(f"http://{METADATA}/latest/meta-data"), BLOCKED, REDIRECT),
    "front.partner": Case(go(f"http://{PARTNER}:8000/x"), BLOCKED, REDIRECT, credential=True),
}


async def test_private_addresses_are_reached_only_as_the_entries_scope_them(
    worker_database: str,
) -> None:
    reason = await why_unavailable()
    if reason:
        pytest.skip(f"cannot make a private network namespace here: {reason}")
    master_key = generate_master_key()
    db = Database(worker_database)
    registry = Registry(db, uuid.uuid4())
    store = CredentialStore(db, Keyring.parse(master_key))
    hosts = [f"{PARTNER}:8000", FRONT]
    credential = store.add(registry.owner, "api_key", "partner", "partner-key-0123", hosts)
    registry.create_agent("bot")
    invocations: dict[str, uuid.UUID] = {}
    for key, case in SCENARIO.items():
        auth = (
            {"auth_method": "api_key", "credential_ref": credential, "auth_param_name": "X-Key"}
            if case.credential
            else {}
        )
        add_tool(registry, key=key, endpoint_url=case.endpoint_url, max_attempts=1, **auth)
        registry.assign("bot", key)
        invocations[key] = registry.invoke("bot", key, {})
    allow = (
        f"{FRONT}, {INTERNAL}:5000@tool=internal.*, {METADATA}:80,"
        f" {PARTNER}:8000@credential={credential}"
    )

    async with unix_database_url(worker_database) as database_url:
        report = await run_private(
            [INTERNAL, METADATA, PARTNER],
            SERVICES,
            {
                "DATABASE_URL": database_url,
                "TOOLRELAY_EGRESS_ALLOW": allow,
                "TOOLRELAY_MASTER_KEY": master_key,
            },
        )
    assert report.returncode == 0, report.log

    ids = {str(inv): key for key, inv in invocations.items()}
    for key, case in SCENARIO.items():
        got = registry.get_invocation(invocations[key])
        if case.outcome == "completed":
            assert got["status"] == "completed", (key, got["error"], got["attempts"])
            continue
        assert (got["status"], got["error_code"], got["error"]) == (
            "failed",
            BLOCKED,
            AGENT_MESSAGE,
        ), key
        [attempt] = got["attempts"]
        assert case.told_owner in attempt["error"], (key, attempt["error"])

    def callers(service: str) -> list[str]:
        return sorted(ids.get(inv, inv) for inv in report.services[service].invocations)

    assert callers("api") == ["internal.hop", "internal.hop", "internal.read"]
    assert report.services["database"].connections == 0
    assert callers("metadata") == ["metadata.read"]
    assert callers("partner") == ["partner.read"]
    assert callers("front") == ["front.metadata", "front.partner", "internal.redirected"]
    assert report.log.count('"action": "dispatch"') == len(SCENARIO)  # one attempt each
