"""Host binding: where a credential may be sent.

An entry is a host name or IP literal (any port) or ``host:port`` (that port only);
IPv6 literals are written in brackets. Comparison is case-insensitive and ignores a
trailing dot, and IP literals compare by address.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from functools import lru_cache

from toolrelay.errors import InvalidArgument

__all__ = ["host_allowed", "normalize_host_entry", "split_host_entry"]

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*$")
_WITH_PORT = re.compile(r"^(\[[^\]]+\]|[^:\[\]]+)(?::(\d{1,5}))?$")


def normalize_host_entry(entry: str) -> str:
    """The canonical spelling of an allowed-hosts entry; InvalidArgument when malformed."""
    host, port = split_host_entry(entry)
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def split_host_entry(entry: str) -> tuple[str, int | None]:
    text = entry.strip()
    if ":" in text and not text.startswith("["):
        literal = _ip(text)  # a bare IPv6 literal, no port
        if literal is not None:
            return literal, None
    match = _WITH_PORT.match(text)
    if not match:
        raise InvalidArgument(f"allowed host {entry!r} is not a host or host:port")
    port = int(match.group(2)) if match.group(2) else None
    if port is not None and not 0 < port < 65536:
        raise InvalidArgument(f"allowed host {entry!r}: port must be 1-65535")
    return _canonical_host(match.group(1), entry), port


MATCHES_KEPT = 1024  # (allowed hosts, host, port) answers kept: the dispatcher asks per call


def host_allowed(allowed: Iterable[str], host: str, port: int | None) -> bool:
    """Whether ``host`` (as in the request URL) and ``port`` match one entry."""
    return _host_allowed(tuple(allowed), host, port)


@lru_cache(maxsize=MATCHES_KEPT)  # pure: parsing the entries and the host is the cost
def _host_allowed(allowed: tuple[str, ...], host: str, port: int | None) -> bool:
    try:
        target = _canonical_host(host, host)
    except InvalidArgument:
        return False
    for entry in allowed:
        try:
            entry_host, entry_port = split_host_entry(entry)
        except InvalidArgument:
            continue  # a malformed stored entry matches nothing
        if entry_host == target and (entry_port is None or entry_port == port):
            return True
    return False


def _canonical_host(host: str, entry: str) -> str:
    text = host.strip().lower()
    if text.startswith("["):
        literal = _ip(text[1:-1]) if text.endswith("]") else None
        if literal is None:
            raise InvalidArgument(f"allowed host {entry!r} is not a valid IPv6 literal")
        return literal
    literal = _ip(text)
    if literal is not None:
        return literal
    text = text.removesuffix(".")
    if not text.isascii():
        try:
            text = text.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidArgument(f"allowed host {entry!r} is not a valid host name") from None
    if not _HOSTNAME.match(text):
        raise InvalidArgument(f"allowed host {entry!r} is not a valid host name")
    return text


def _ip(text: str) -> str | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0]).compressed
    except ValueError:
        return None
