"""SSRF egress guard for outbound HTTP made with aiohttp.

Every host is resolved once, every resolved address must be public unicast (or let through by
an entry of ``TOOLRELAY_EGRESS_ALLOW``), and the connector then connects to exactly the checked
addresses. The TLS server name and Host header still come from the URL.

Entries may name a port and be scoped to tools or to a credential. The executor announces the
tool call in flight with ``EgressPolicy.dispatching`` (a context variable); an entry applies
only to a hop on the origin of that tool's registered endpoint, so an open redirect cannot lead
a tool to an allow-listed host. A kept-alive connection is checked again whenever the pool
hands it out, because aiohttp resolves nothing for it.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Final
from uuid import UUID

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace
from yarl import URL

from toolrelay.errors import ConfigurationError, EgressBlocked

__all__ = [
    "ALLOW_ENV",
    "AllowEntry",
    "Dispatch",
    "EgressPolicy",
    "Grant",
    "GuardedResolver",
    "is_public_address",
    "make_connector",
    "origin",
    "unwrap_egress_error",
]

ALLOW_ENV = "TOOLRELAY_EGRESS_ALLOW"
# Where a cloud VM's metadata service answers (AWS, GCP, Azure, ...; AWS's IPv6 one): its
# credentials are the machine's. Only an entry naming the address opens it, never a host name
# (DNS is hostile: a name resolving there would hand any tool the machine's credentials).
METADATA_ADDRESSES: Final = (
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("fd00:ec2::254"),
)
_SCHEMES = frozenset({"http", "https"})
_HINT = f"add it to {ALLOW_ENV} to allow"
_MAX_PORT = 65535
_GRANT_CACHE = 4096  # (tool, credential) pairs whose applicable entries are remembered
_ADDRESS_CACHE = 4096  # addresses whose classification is remembered

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# First match wins, so specific entries come before the ranges that contain them.
_BLOCKED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), reason)
    for net, reason in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.169.254/32", "link-local, cloud metadata"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
    )
)

# Forms that embed an IPv4 address are refused outright: judging the embedded address
# would depend on how each gateway on the path translates it.
_BLOCKED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), reason)
    for net, reason in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("::ffff:0:0/96", "IPv4-mapped"),
        ("::ffff:0:0:0/96", "IPv4-translated"),
        ("::/96", "IPv4-compatible"),
        ("64:ff9b::/96", "NAT64"),
        ("64:ff9b:1::/48", "NAT64 local-use"),
        ("100::/64", "discard-only"),
        ("2001::/32", "Teredo"),
        ("2001:db8::/32", "documentation"),
        ("2001::/23", "IETF protocol assignments"),
        ("2002::/16", "6to4"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "SRv6 SID"),
        ("fc00::/7", "unique local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_PORT = re.compile(r"[0-9]{1,5}")
_BRACKETED = re.compile(r"\[([^\[\]]*)\]:(.*)")
_TOOL_GLOB = re.compile(r"[A-Za-z0-9_.*-]{1,128}")  # tool-key characters, and * for any run
_SCOPE_SYNTAX = "a scope is @tool=PATTERN or @credential=UUID, each at most once"

Origin = tuple[str, str, int | None]


def _unscoped(ip: IPAddress) -> IPAddress:
    # A %scope does not change what kind of address it is, but breaks network membership.
    return ip if isinstance(ip, ipaddress.IPv4Address) else ipaddress.IPv6Address(int(ip))


def _blocked_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` is not public unicast, or None if it is."""
    if isinstance(ip, ipaddress.IPv4Address):
        return next((why for net, why in _BLOCKED_V4 if ip in net), None)
    ip = _unscoped(ip)
    reason = next((why for net, why in _BLOCKED_V6 if ip in net), None)
    if reason is None and ip not in _GLOBAL_UNICAST_V6:
        reason = "reserved"
    return reason


@lru_cache(maxsize=_ADDRESS_CACHE)
def _classify(address: str) -> tuple[IPAddress, str | None]:
    """The address and why it is not public (None: it is); ValueError if it is no address.

    Cached: the same few upstream addresses come back on every call.
    """
    ip = ipaddress.ip_address(address)
    return ip, _blocked_reason(ip)


def is_public_address(ip: IPAddress) -> bool:
    """True if ``ip`` is public unicast: routable on the internet and nothing special."""
    return _blocked_reason(ip) is None


_EMBEDS_LOW32 = frozenset(
    {"IPv4-mapped", "IPv4-translated", "IPv4-compatible", "NAT64", "NAT64 local-use"}
)


def _describe(ip: IPAddress, reason: str) -> str:
    """The reason, naming the embedded IPv4 address of embedding forms to help the user."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return reason
    embedded = ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
    if reason in _EMBEDS_LOW32:
        embedded = ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    return f"{reason}, embeds {embedded}" if embedded is not None else reason


def _normalise_host(host: str) -> str:
    # "example.com." and "example.com" name the same host.
    return host.lower().rstrip(".")


def origin(url: URL) -> Origin:
    """Scheme, host and port (defaulted by the scheme): what makes two URLs one origin."""
    return (url.scheme, _normalise_host(url.raw_host or ""), url.port)


@lru_cache(maxsize=_GRANT_CACHE)  # one per tool: parsed once, not for every call
def _endpoint_origin(endpoint_url: str | None) -> Origin | None:
    if not endpoint_url:
        return None
    try:
        return origin(URL(endpoint_url))
    except (ValueError, TypeError):
        return None


@lru_cache(maxsize=_ADDRESS_CACHE)  # pure (an error is raised again, never cached)
def _literal_address(host: str) -> IPAddress | None:
    """The address an IP-literal host names, None for a host name.

    Raises EgressBlocked for legacy numeric IPv4 forms (``2130706433``, ``0x7f.0.0.1``,
    ``017700000001``, ``127.1``): getaddrinfo maps them to an address, so they are refused
    rather than given a second spelling that allow entries and users would not expect.
    """
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if ":" in host:  # aiohttp treats any host with a colon as an IPv6 literal
        raise EgressBlocked(f"egress blocked: {host} is not a valid IPv6 address")
    if host.replace(".", "").isdigit() or _inet_aton_accepts(host):
        raise EgressBlocked(
            f"egress blocked: {host} is a non-canonical numeric IPv4 form; "
            "write the address as four decimal octets"
        )
    return None


def _inet_aton_accepts(host: str) -> bool:
    try:
        socket.inet_aton(host)
    except (OSError, ValueError):
        return False
    return True


# --- the request in flight ------------------------------------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """The tool call in flight, as the executor announces it: what scopes are matched with."""

    tool: str
    credential: UUID | None
    origin: Origin | None  # of the tool's registered endpoint_url; None if unparsable


_DISPATCH: ContextVar[Dispatch | None] = ContextVar("toolrelay_egress_dispatch", default=None)


@dataclass(frozen=True)
class Grant:
    """The allow entries that apply to one hop."""

    entries: tuple[AllowEntry, ...] = ()
    other_origin: bool = False  # a hop away from the tool's endpoint origin: none apply


_OTHER_ORIGIN = Grant(other_origin=True)
# The grant of the connection being made or handed out, for the resolver deep inside aiohttp.
_HOP: ContextVar[Grant | None] = ContextVar("toolrelay_egress_hop", default=None)


def _who(dispatch: Dispatch | None) -> str:
    if dispatch is None:
        return "requests outside a tool call"
    credential = f"credential {dispatch.credential}" if dispatch.credential else "no credential"
    return f"tool {dispatch.tool} with {credential}"


# --- TOOLRELAY_EGRESS_ALLOW -----------------------------------------------------------------


@cache  # the patterns come from the configuration: a handful
def _tool_pattern(glob: str) -> re.Pattern[str]:
    return re.compile(".*".join(map(re.escape, glob.split("*"))))


@dataclass(frozen=True)
class AllowEntry:
    """One TOOLRELAY_EGRESS_ALLOW entry: what it opens, on which port, for whom."""

    target: str | IPNetwork  # a host name (the URL's host) or a network (the address reached)
    port: int | None = None  # None: any port
    tool: str | None = None  # a tool-key pattern, ``*`` standing for any run of characters
    credential: UUID | None = None
    text: str = ""  # as written, for messages

    @property
    def scoped(self) -> bool:
        return self.tool is not None or self.credential is not None

    def opens(self, host: str, ip: IPAddress, port: int | None) -> bool:
        """Admits ``ip`` on ``port``, reached through ``host`` (normalised, the URL's)?"""
        if self.port is not None and self.port != port:
            return False
        if isinstance(self.target, str):  # trusting DNS for the name, but not for metadata
            return self.target == host and ip not in METADATA_ADDRESSES
        return ip in self.target

    def applies_to(self, dispatch: Dispatch | None) -> bool:
        """Whether its scope holds for ``dispatch`` (None: a request outside a tool call)."""
        if not self.scoped:
            return True
        if dispatch is None:
            return False
        if self.credential is not None and dispatch.credential != self.credential:
            return False
        return self.tool is None or _tool_pattern(self.tool).fullmatch(dispatch.tool) is not None


def _parse_entry(entry: str) -> AllowEntry:
    """``target[:port][@tool=PATTERN][@credential=UUID]``; an IPv6 target with a port is
    bracketed. The target is a host name, an IP address or a CIDR network."""
    target, *scopes = entry.split("@")
    tool, credential = _parse_scopes(entry, scopes)
    address, port = _split_port(entry, target)
    return AllowEntry(_parse_target(entry, address), port, tool, credential, entry)


def _parse_scopes(entry: str, scopes: list[str]) -> tuple[str | None, UUID | None]:
    found: dict[str, str] = {}
    for scope in scopes:
        kind, sep, value = scope.partition("=")
        if not sep or kind not in ("tool", "credential") or kind in found:
            raise ConfigurationError(f"{ALLOW_ENV}: {entry!r}: {_SCOPE_SYNTAX}")
        found[kind] = value
    tool = found.get("tool")
    if tool is not None and not _TOOL_GLOB.fullmatch(tool):
        raise ConfigurationError(
            f"{ALLOW_ENV}: {entry!r}: bad tool pattern {tool!r} (letters, digits, '_', '.',"
            " '-' and * for any run of characters)"
        )
    if "credential" not in found:
        return tool, None
    try:
        return tool, UUID(found["credential"])
    except ValueError:
        raise ConfigurationError(
            f"{ALLOW_ENV}: {entry!r}: {found['credential']!r} is not a credential uuid"
        ) from None


def _split_port(entry: str, target: str) -> tuple[str, int | None]:
    """``[v6]:port``, ``name:port``, ``v4:port``, ``v4cidr:port``, or no port at all (a bare
    IPv6 address or network has more than one colon and never a port)."""
    if target.startswith("["):
        bracketed = _BRACKETED.fullmatch(target)
        if bracketed is None or ":" not in bracketed[1]:
            raise ConfigurationError(
                f"{ALLOW_ENV}: {entry!r}: brackets are for an IPv6 address or network with a"
                " port, as in [fd00::5]:8080; without a port write fd00::5"
            )
        return bracketed[1], _parse_port(entry, bracketed[2])
    if target.count(":") == 1:
        address, _, port = target.partition(":")
        return address, _parse_port(entry, port)
    return target, None


def _parse_port(entry: str, text: str) -> int:
    if not _PORT.fullmatch(text) or not 0 < int(text) <= _MAX_PORT:
        raise ConfigurationError(f"{ALLOW_ENV}: {entry!r}: bad port {text!r} (1 to {_MAX_PORT})")
    return int(text)


def _parse_target(entry: str, target: str) -> IPNetwork | str:
    """An IP or CIDR network, else a host name."""
    try:
        return ipaddress.ip_network(target, strict=True)
    except ValueError as exc:
        if "/" in target or ":" in target or target.replace(".", "").isdigit():
            raise ConfigurationError(f"{ALLOW_ENV}: bad IP or CIDR {entry!r}: {exc}") from None
    name = _normalise_host(target)
    labels = name.split(".")
    if len(name) > 253 or _inet_aton_accepts(name) or not all(map(_LABEL.fullmatch, labels)):
        raise ConfigurationError(
            f"{ALLOW_ENV}: {entry!r} is not a host name, IP address or CIDR network "
            "(no schemes or wildcards; write IDNs in their xn-- form)"
        )
    return name


# --- the policy -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EgressPolicy:
    """What outbound HTTP may reach: public unicast, plus the allow-listed exceptions.

    ``allow_hosts`` and ``allow_networks`` are the plain entries (any port, any request);
    ``entries`` are those that name a port or a scope.
    """

    allow_hosts: frozenset[str]
    allow_networks: tuple[IPNetwork, ...]
    enabled: bool = True
    entries: tuple[AllowEntry, ...] = ()
    _all: tuple[AllowEntry, ...] = field(init=False, repr=False, compare=False)
    _unscoped: Grant = field(init=False, repr=False, compare=False)
    _grants: dict[tuple[str, UUID | None], Grant] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        plain = [AllowEntry(host, text=host) for host in sorted(self.allow_hosts)]
        plain += [AllowEntry(net, text=str(net)) for net in self.allow_networks]
        every = (*plain, *self.entries)
        object.__setattr__(self, "_all", every)
        object.__setattr__(self, "_unscoped", Grant(tuple(e for e in every if not e.scoped)))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EgressPolicy:
        """Read TOOLRELAY_EGRESS_ALLOW: comma-separated entries (docs/security-egress.md)."""
        raw = (os.environ if environ is None else environ).get(ALLOW_ENV, "")
        parsed = [_parse_entry(e.strip()) for e in raw.split(",") if e.strip()]
        plain = [e.target for e in parsed if e.port is None and not e.scoped]
        return cls(
            allow_hosts=frozenset(t for t in plain if isinstance(t, str)),
            allow_networks=tuple(t for t in plain if not isinstance(t, str)),
            entries=tuple(e for e in parsed if e.port is not None or e.scoped),
        )

    @contextmanager
    def dispatching(
        self, tool: str, credential: UUID | str | None, endpoint_url: str | None
    ) -> Iterator[Dispatch]:
        """Within the block, requests are the call of ``tool`` with ``credential``: entries
        scoped to them apply, and only on the origin of the tool's ``endpoint_url``."""
        if credential is not None and not isinstance(credential, UUID):
            credential = UUID(str(credential))
        dispatch = Dispatch(tool, credential, _endpoint_origin(endpoint_url))
        token = _DISPATCH.set(dispatch)
        try:
            yield dispatch
        finally:
            _DISPATCH.reset(token)

    def grant_for(self, url: URL | None) -> Grant:
        """The entries that apply to a request for ``url`` (None: a hop of unknown origin).

        Outside a tool call (a token endpoint, a test) the unscoped entries apply. In one,
        the entries whose scope holds apply on the tool's endpoint origin, none elsewhere.
        """
        dispatch = _DISPATCH.get()
        if dispatch is None:
            return self._unscoped
        if url is None or dispatch.origin is None or origin(url) != dispatch.origin:
            return _OTHER_ORIGIN
        key = (dispatch.tool, dispatch.credential)
        grant = self._grants.get(key)
        if grant is None:
            if len(self._grants) >= _GRANT_CACHE:
                self._grants.clear()
            grant = Grant(tuple(e for e in self._all if e.applies_to(dispatch)))
            self._grants[key] = grant
        return grant

    def check_url(self, url: str) -> None:
        """Refuse a URL before connecting: bad scheme, no host, or a blocked IP literal.

        Host names are checked when they are resolved (GuardedResolver); call this for the
        first request and for every redirect hop. Messages never repeat the URL, which may
        carry credentials.
        """
        try:
            parsed = URL(url)
        except (ValueError, TypeError):
            raise EgressBlocked("egress blocked: the URL could not be parsed") from None
        if parsed.scheme not in _SCHEMES:
            raise EgressBlocked(
                f"egress blocked: scheme {parsed.scheme!r} is not allowed (only http and https)"
            )
        host = parsed.raw_host
        if not host:
            raise EgressBlocked("egress blocked: the URL has no host")
        self.check_host(host, parsed.port, self.grant_for(parsed))

    def check_host(self, host: str, port: int | None = None, grant: Grant | None = None) -> None:
        """Refuse an IP-literal host that is not allowed; host names pass to resolution."""
        if not self.enabled:
            return
        address = _literal_address(host)
        if address is not None:
            self.check_address(host, str(address), port, grant)

    def check_address(
        self, host: str, address: str, port: int | None = None, grant: Grant | None = None
    ) -> None:
        """Refuse ``address`` (what ``host`` resolved to) on ``port`` unless public or let
        through by an entry of ``grant`` (default: the current hop's)."""
        if not self.enabled:
            return
        try:
            ip, reason = _classify(address)
        except ValueError:
            raise EgressBlocked(
                f"egress blocked: {host} resolves to {address!r}, which is not an IP address"
            ) from None
        if reason is None:
            return
        if grant is None:
            grant = self._hop_grant()
        name, plain = _normalise_host(host), _unscoped(ip)
        if _grant_opens(grant, name, plain, port):
            return
        what = f"{host} is not public" if _same_literal(host, ip) else f"{host} resolves to {ip}"
        on_port = "" if port is None else f" on port {port}"
        hint = self._hint(name, plain, port, grant)
        raise EgressBlocked(f"egress blocked: {what} ({_describe(ip, reason)}){on_port}; {hint}")

    def _hop_grant(self) -> Grant:
        hop = _HOP.get()
        return hop if hop is not None else self.grant_for(None)

    def _hint(self, host: str, ip: IPAddress, port: int | None, grant: Grant) -> str:
        """For the owner: why no entry let it through, naming one that nearly did."""
        if ip in METADATA_ADDRESSES and any(e.target == host for e in self._all):
            return (
                f"a host name in {ALLOW_ENV} never opens the cloud metadata address {ip}"
                " (its credentials are this machine's): name the address itself if meant"
            )
        near = [e for e in self._all if e.opens(host, ip, port)]
        if near and grant.other_origin:
            return f"{ALLOW_ENV} never applies to a redirect away from the tool's endpoint origin"
        if near:
            return f"{ALLOW_ENV} entry {near[0].text!r} is not for {_who(_DISPATCH.get())}"
        ports = sorted({e.port for e in self._all if e.port and e.opens(host, ip, e.port)})
        if ports:
            return f"{ALLOW_ENV} allows it on port {', '.join(map(str, ports))} only"
        return _HINT


@lru_cache(maxsize=_ADDRESS_CACHE)  # pure: grants are frozen, one per tool and credential
def _grant_opens(grant: Grant, name: str, ip: IPAddress, port: int | None) -> bool:
    return any(entry.opens(name, ip, port) for entry in grant.entries)


def _same_literal(host: str, ip: IPAddress) -> bool:
    try:
        return ipaddress.ip_address(host) == ip
    except ValueError:
        return False


# --- aiohttp --------------------------------------------------------------------------------


class GuardedResolver(AbstractResolver):
    """Resolves through an inner resolver and refuses unless every address is acceptable.

    The connector connects only to what this returns, so a host cannot be checked against
    one answer and then connected to another (DNS rebinding).
    """

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self._policy.check_host(host, port or None)
        if self._inner is None:
            # Created lazily: ThreadedResolver needs the running loop.
            self._inner = aiohttp.ThreadedResolver()
        results = await self._inner.resolve(host, port, family)
        for result in results:
            self._policy.check_address(host, result["host"], port or None)
        return results

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


class _GuardedConnector(aiohttp.TCPConnector):
    """TCPConnector that also checks IP-literal hosts and pooled connections, and refuses
    proxies.

    aiohttp never calls the resolver for IP literals nor for a kept-alive connection it
    hands out again, and through a proxy the target is resolved by the proxy, so none of
    them would be checked otherwise.
    """

    def __init__(self, policy: EgressPolicy, *, limit: int, limit_per_host: int) -> None:
        super().__init__(
            resolver=GuardedResolver(policy),
            use_dns_cache=False,  # resolve (and check) for every new connection
            limit=limit,
            limit_per_host=limit_per_host,
        )
        self._policy = policy

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        grant = self._policy.grant_for(req.url)
        hop = _HOP.set(grant)
        try:
            conn = await super().connect(req, traces, timeout)
        finally:
            _HOP.reset(hop)
        try:
            self._check_peer(req, conn, grant)
        except EgressBlocked:
            conn.release()  # fine for whoever may use it: back to the pool, unused
            raise
        return conn

    def _check_peer(self, req: ClientRequest, conn: Connection, grant: Grant) -> None:
        """The address a (new or pooled) connection leads to must be allowed for this hop."""
        if not self._policy.enabled:
            return
        transport = conn.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        if not peer:
            raise EgressBlocked("egress blocked: the connection's peer address is unknown")
        self._policy.check_address(req.url.raw_host or "", peer[0], peer[1], grant)

    async def _resolve_host(
        self, host: str, port: int, traces: Sequence[Trace] | None = None
    ) -> list[ResolveResult]:
        self._policy.check_host(host, port)
        return await super()._resolve_host(host, port, traces=traces)

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        if req.proxy is not None and self._policy.enabled:
            raise EgressBlocked("egress blocked: requests through a proxy bypass the egress guard")
        return await super()._create_connection(req, traces, timeout)


def make_connector(
    policy: EgressPolicy, *, limit: int = 100, limit_per_host: int = 0
) -> aiohttp.TCPConnector:
    """A TCPConnector that only connects to addresses ``policy`` accepts."""
    return _GuardedConnector(policy, limit=limit, limit_per_host=limit_per_host)


def unwrap_egress_error(exc: BaseException) -> EgressBlocked | None:
    """The EgressBlocked behind ``exc``, following the chain a traceback would show."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, EgressBlocked):
            return current
        seen.add(id(current))
        suppressed = current.__suppress_context__
        current = current.__cause__ or (None if suppressed else current.__context__)
    return None
