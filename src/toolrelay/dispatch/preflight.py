"""What a worker says about itself at start: where its database is (never the password),
what its egress allow-list holds, and which active tools that allow-list will refuse.

Tools are judged with the worker's own ``EgressPolicy`` through its public methods only
(``dispatching``, ``check_url``, ``grant_for``, ``check_address``), exactly as a call of the
tool would be: an IP literal or ``localhost`` without any lookup, other names through the
system resolver (``getaddrinfo``, as aiohttp's resolver does) with a short deadline. Nothing
connects anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import conninfo
from yarl import URL

from toolrelay.dispatch.egress import METADATA_ADDRESSES, EgressPolicy
from toolrelay.errors import EgressBlocked

RESOLVE_TIMEOUT = 2.0  # seconds for all host names together
MAX_RESOLVED_HOSTS = 256  # distinct names looked up at start; the rest are not checked
# RFC 6761: localhost is loopback; judged without a lookup, both families.
LOCALHOST_ADDRESSES = ("127.0.0.1", "::1")


def describe_database(url: str) -> dict[str, str]:
    """``host:port/dbname`` and the user of a libpq URL or keyword string; no password."""
    try:
        params = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return {"database": "an unparsable address"}
    user = str(params.get("user") or "")
    host = str(params.get("host") or params.get("hostaddr") or "local socket")
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or user or "")
    described = {"database": f"{host}:{port}/{dbname}"}
    if user:
        described["database_user"] = user
    return described


def allow_list(policy: EgressPolicy) -> list[str]:
    """The allow-list entries as written: host names, addresses, CIDRs (port and scope)."""
    written = sorted(policy.allow_hosts)
    written += [str(net) for net in policy.allow_networks]
    written += [entry.text or str(entry.target) for entry in policy.entries]
    return written


# A network wider than this opens more than a site's own addresses: most of the guard is off.
WIDEST_V4, WIDEST_V6 = 8, 32


def broad_entries(policy: EgressPolicy) -> list[tuple[str, str]]:
    """Allow-list networks an operator should hear about at start: (entry, why). Each still
    applies as written (a warning, not a refusal: the operator may mean it)."""
    written = [(str(net), net) for net in policy.allow_networks]
    written += [(e.text or str(e.target), e.target) for e in policy.entries
                if not isinstance(e.target, str)]  # fmt: skip
    found = []
    for text, net in written:
        assert not isinstance(net, str)
        metadata = [str(a) for a in METADATA_ADDRESSES if a.version == net.version and a in net]
        if metadata:
            found.append((text, f"it lets tool calls reach the cloud metadata address"
                                f" {metadata[0]}, whose credentials are this machine's"))  # fmt: skip
        elif net.prefixlen < (WIDEST_V4 if net.version == 4 else WIDEST_V6):
            found.append((text, f"a /{net.prefixlen} opens {net.num_addresses:,} addresses to"
                                " tool calls: the egress guard is mostly off"))  # fmt: skip
    return found


@dataclass(frozen=True)
class Finding:
    """One active tool the worker cannot check, or whose calls the allow-list refuses."""

    owner: str
    tool: str
    reason: str
    refused: bool  # False: not checked (the name did not resolve in time, or at all)


def _authority(endpoint_url: str) -> str:
    """``scheme://authority`` of a registered endpoint: placeholders live only after it."""
    sep = endpoint_url.find("://")
    if sep == -1:
        return endpoint_url
    end = next(
        (i for i in range(sep + 3, len(endpoint_url)) if endpoint_url[i] in "/?#"),
        len(endpoint_url),
    )
    return endpoint_url[:end] + "/"


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Target:
    """An active tool whose endpoint is a host name: judged once the name resolves."""

    tool: Mapping[str, Any]
    base: str  # scheme://authority/
    host: str
    port: int | None


class EndpointCheck:
    """Judge active tools' endpoints with ``policy`` as their calls would be judged."""

    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy

    def literal(self, tools: Iterable[Mapping[str, Any]]) -> tuple[list[Finding], list[Target]]:
        """Check URLs, IP literals and localhost now; return the names still to resolve."""
        findings: list[Finding] = []
        names: list[Target] = []
        if not self.policy.enabled:
            return findings, names
        for tool in tools:
            base = _authority(str(tool["endpoint_url"]))
            try:
                with self._dispatching(tool):
                    self.policy.check_url(base)
                    parsed = URL(base)
                    host, port = parsed.raw_host or "", parsed.port
                    if _is_literal(host):
                        continue  # check_url has judged it
                    if host.lower().rstrip(".") == "localhost":
                        self._check(tool, base, host, port, LOCALHOST_ADDRESSES)
                        continue
            except EgressBlocked as exc:
                findings.append(_refused(tool, exc))
                continue
            except ValueError:
                findings.append(_finding(tool, "the endpoint URL could not be parsed", True))
                continue
            names.append(Target(tool, base, host, port))
        return findings, names

    async def resolved(
        self, names: Sequence[Target], timeout: float = RESOLVE_TIMEOUT
    ) -> list[Finding]:
        """Resolve the names (never connecting) and judge every address they lead to."""
        hosts = sorted({t.host.lower().rstrip(".") for t in names})
        looked_up = set(hosts[:MAX_RESOLVED_HOSTS])
        futures = {host: _getaddrinfo(host) for host in looked_up}
        try:
            if futures:
                await asyncio.wait(list(futures.values()), timeout=timeout)
        finally:  # late answers (or a worker stopping meanwhile) are not waited for
            for pending in futures.values():
                if not pending.cancel() and not pending.cancelled():
                    pending.exception()  # retrieved: never reported as unhandled
        findings: list[Finding] = []
        for target in names:
            future = futures.get(target.host.lower().rstrip("."))
            if future is None:
                findings.append(
                    _finding(target.tool, f"{target.host} was not looked up (too many names)")
                )
            elif future.cancelled():
                findings.append(
                    _finding(target.tool, f"{target.host} did not resolve within {timeout:g} s")
                )
            elif isinstance(future.exception(), OSError):
                findings.append(
                    _finding(target.tool, f"{target.host} does not resolve: {future.exception()}")
                )
            else:
                try:
                    with self._dispatching(target.tool):
                        self._check(target.tool, target.base, target.host, target.port,
                                    future.result())  # fmt: skip
                except EgressBlocked as exc:
                    findings.append(_refused(target.tool, exc))
        return findings

    def _dispatching(self, tool: Mapping[str, Any]) -> Any:
        # The scope a call of this tool runs in: its key, credential and endpoint origin.
        return self.policy.dispatching(
            str(tool["key"]), tool.get("credential_ref"), str(tool["endpoint_url"])
        )

    def _check(
        self,
        tool: Mapping[str, Any],
        base: str,
        host: str,
        port: int | None,
        addresses: Iterable[str],
    ) -> None:
        """Refuse (EgressBlocked) unless every address is allowed, as the connector would."""
        grant = self.policy.grant_for(URL(base))
        for address in addresses:
            self.policy.check_address(host, address, port, grant)


def _finding(tool: Mapping[str, Any], reason: str, refused: bool = False) -> Finding:
    return Finding(str(tool["owner"]), str(tool["key"]), reason, refused)


def _refused(tool: Mapping[str, Any], exc: EgressBlocked) -> Finding:
    return _finding(tool, exc.message.removeprefix("egress blocked: "), True)


def _getaddrinfo(host: str) -> asyncio.Future[list[str]]:
    """The addresses ``host`` resolves to, looked up in a daemon thread: a resolver that
    hangs past the deadline never holds up the worker's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[list[str]] = loop.create_future()

    def settle(result: list[str] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result or [])

    def lookup() -> None:
        try:
            infos = socket.getaddrinfo(
                host, None, type=socket.SOCK_STREAM, flags=getattr(socket, "AI_ADDRCONFIG", 0)
            )
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            outcome: tuple[list[str] | None, BaseException | None] = (addresses, None)
        except (OSError, UnicodeError) as exc:
            outcome = (None, exc if isinstance(exc, OSError) else OSError(str(exc)))
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=lookup, name=f"resolve {host}", daemon=True).start()
    return future
