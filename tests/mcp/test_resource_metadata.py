"""MCP authorization discovery (issue 15): a 401 from /mcp names the protected resource
metadata (RFC 9728), which is served without a token and lists the authorization servers
configured in TOOLRELAY_MCP_AUTHORIZATION_SERVERS."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx2
import pytest

from tests.api.conftest import settings
from tests.api.servers import serve_app
from toolrelay.api import create_app
from toolrelay.credentials import Keyring
from toolrelay.errors import ConfigurationError
from toolrelay.mcp.http import AUTHORIZATION_SERVERS_ENV, authorization_servers

ISSUER = "https://auth.example.com/realms/agents"


@pytest.fixture(scope="module")
def url(database_url: str, mcp_keyring: Keyring) -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(AUTHORIZATION_SERVERS_ENV, f"{ISSUER}, https://second.example.com")
        app = create_app(settings(database_url, mcp_keyring, run_worker=False))
    with serve_app(app) as base:
        yield base


def test_a_401_points_at_the_metadata_and_it_is_served(url: str) -> None:
    refused = httpx2.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert refused.status_code == 401
    challenge = refused.headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ")
    found = re.search(r'resource_metadata="([^"]+)"', challenge)
    assert found is not None, challenge
    metadata = httpx2.get(found.group(1))  # no token needed
    assert metadata.status_code == 200
    assert metadata.json() == {
        "resource": f"{url}/mcp",
        "authorization_servers": [ISSUER, "https://second.example.com"],
        "bearer_methods_supported": ["header"],
        "resource_name": "toolrelay MCP",
    }
    bare = httpx2.get(f"{url}/.well-known/oauth-protected-resource")  # the unsuffixed form
    assert bare.json() == metadata.json()


def test_without_authorization_servers_none_are_listed() -> None:
    assert authorization_servers({}) == []
    assert authorization_servers({AUTHORIZATION_SERVERS_ENV: " , "}) == []


def test_a_bad_issuer_is_refused_naming_it() -> None:
    for bad in ("auth.example.com", "ftp://x.test", "https://x.test/?a=1"):
        with pytest.raises(ConfigurationError, match=re.escape(repr(bad))):
            authorization_servers({AUTHORIZATION_SERVERS_ENV: bad})


def test_plain_http_is_refused_off_loopback() -> None:
    """Its metadata names the keys that sign agents' access tokens: read over plain http,
    anyone on the path could name their own (as TOOLRELAY_OIDC_ISSUER, https but on
    loopback)."""
    for bad in ("http://auth.example.com", "http://10.0.0.5/realms/x", "http://127.0.0.2"):
        with pytest.raises(ConfigurationError, match="https"):
            authorization_servers({AUTHORIZATION_SERVERS_ENV: f"https://ok.example.com,{bad}"})
    local = "http://127.0.0.1:9000/as,http://localhost:8080,http://[::1]:9/x"
    assert authorization_servers({AUTHORIZATION_SERVERS_ENV: local}) == local.split(",")
