"""SSRF egress guard for outbound HTTP made with aiohttp.

Every host is resolved once, every resolved address must be public unicast (or named in
``TOOLRELAY_EGRESS_ALLOW``), and the connector then connects to exactly the checked
addresses. The TLS server name and Host header still come from the URL.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.tracing import Trace
from yarl import URL

from toolrelay.errors import ConfigurationError, EgressBlocked

__all__ = [
    "ALLOW_ENV",
    "EgressPolicy",
    "GuardedResolver",
    "is_public_address",
    "make_connector",
    "unwrap_egress_error",
]

ALLOW_ENV = "TOOLRELAY_EGRESS_ALLOW"
_SCHEMES = frozenset({"http", "https"})
_HINT = f"add it to {ALLOW_ENV} to allow"

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
    return host.lower().removesuffix(".")


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


def _parse_entry(entry: str) -> IPNetwork | str:
    """One TOOLRELAY_EGRESS_ALLOW entry: an IP or CIDR network, else a host name."""
    try:
        return ipaddress.ip_network(entry, strict=True)
    except ValueError as exc:
        if "/" in entry or ":" in entry or entry.replace(".", "").isdigit():
            raise ConfigurationError(f"{ALLOW_ENV}: bad IP or CIDR {entry!r}: {exc}") from None
    name = _normalise_host(entry)
    labels = name.split(".")
    if len(name) > 253 or _inet_aton_accepts(name) or not all(map(_LABEL.fullmatch, labels)):
        raise ConfigurationError(
            f"{ALLOW_ENV}: {entry!r} is not a host name, IP address or CIDR network "
            "(no schemes, ports or wildcards; write IDNs in their xn-- form)"
        )
    return name


@dataclass(frozen=True)
class EgressPolicy:
    """What outbound HTTP may reach: public unicast, plus the allow-listed exceptions."""

    allow_hosts: frozenset[str]
    allow_networks: tuple[IPNetwork, ...]
    enabled: bool = True

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EgressPolicy:
        """Read TOOLRELAY_EGRESS_ALLOW (comma-separated host names, IPs and CIDRs)."""
        raw = (os.environ if environ is None else environ).get(ALLOW_ENV, "")
        entries = [_parse_entry(e.strip()) for e in raw.split(",") if e.strip()]
        hosts = frozenset(e for e in entries if isinstance(e, str))
        networks = tuple(e for e in entries if not isinstance(e, str))
        return cls(allow_hosts=hosts, allow_networks=networks)

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
        self.check_host(host)

    def check_host(self, host: str) -> None:
        """Refuse an IP-literal host that is not allowed; host names pass to resolution."""
        if not self.enabled:
            return
        address = _literal_address(host)
        if address is not None:
            self.check_address(host, str(address))

    def check_address(self, host: str, address: str) -> None:
        """Refuse ``address`` (what ``host`` resolved to) unless allowed or public."""
        if not self.enabled:
            return
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            raise EgressBlocked(
                f"egress blocked: {host} resolves to {address!r}, which is not an IP address"
            ) from None
        if self._allowed(host, ip):
            return
        reason = _blocked_reason(ip)
        if reason is None:
            return
        what = f"{host} is not public" if _same_literal(host, ip) else f"{host} resolves to {ip}"
        raise EgressBlocked(f"egress blocked: {what} ({_describe(ip, reason)}); {_HINT}")

    def _allowed(self, host: str, ip: IPAddress) -> bool:
        if _normalise_host(host) in self.allow_hosts:
            return True
        plain = _unscoped(ip)
        return any(plain in net for net in self.allow_networks)


def _same_literal(host: str, ip: IPAddress) -> bool:
    try:
        return ipaddress.ip_address(host) == ip
    except ValueError:
        return False


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
        self._policy.check_host(host)
        if self._inner is None:
            # Created lazily: ThreadedResolver needs the running loop.
            self._inner = aiohttp.ThreadedResolver()
        results = await self._inner.resolve(host, port, family)
        for result in results:
            self._policy.check_address(host, result["host"])
        return results

    async def close(self) -> None:
        if self._inner is not None:
            await self._inner.close()


class _GuardedConnector(aiohttp.TCPConnector):
    """TCPConnector that also checks IP-literal hosts and refuses proxies.

    aiohttp never calls the resolver for IP literals, and through a proxy the target is
    resolved by the proxy, so neither would be checked otherwise.
    """

    def __init__(self, policy: EgressPolicy, *, limit: int, limit_per_host: int) -> None:
        super().__init__(
            resolver=GuardedResolver(policy),
            use_dns_cache=False,  # resolve (and check) for every new connection
            limit=limit,
            limit_per_host=limit_per_host,
        )
        self._policy = policy

    async def _resolve_host(
        self, host: str, port: int, traces: Sequence[Trace] | None = None
    ) -> list[ResolveResult]:
        self._policy.check_host(host)
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
