"""Provider presets are data (issue 17, item 2): each bundled file loads with https
endpoints; adding or overriding a provider is a file in TOOLRELAY_OAUTH_PROVIDERS_DIR; a
malformed file or parameter is refused naming it; Slack's HTTP-200 errors are refusals."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.credentials.token_server import SplitAnswer
from toolrelay.credentials import connect as flow
from toolrelay.credentials.token_endpoint import TokenRejected, request_token
from toolrelay.errors import InvalidArgument

BUNDLED = ("github", "google", "microsoft", "oidc", "slack")


def test_the_bundled_presets() -> None:
    assert set(BUNDLED) <= set(flow.presets())
    for name in BUNDLED:
        preset = flow.preset(name)
        assert preset.title and preset.notes
        if preset.discovery:
            assert preset.authorization_endpoint is None
            continue
        for url in (preset.authorization_endpoint, preset.token_endpoint):
            assert url is not None and url.startswith("https://")
    assert flow.preset("slack").pkce is False and flow.preset("slack").scope_separator == ","
    assert flow.preset("google").authorization_params["access_type"] == "offline"


async def test_parameters_fill_the_endpoints_and_are_checked() -> None:
    microsoft = flow.preset("microsoft")
    async with aiohttp.ClientSession() as http:  # no request: the endpoints are the file's
        default = await flow.endpoints(http, flow.Connection(microsoft, "app"))
        assert default.token == "https://login.microsoftonline.com/common/oauth2/v2.0/token"
        named = flow.Connection(microsoft, "app", parameters={"tenant": "contoso.onmicrosoft.com"})
        assert "/contoso.onmicrosoft.com/" in (await flow.endpoints(http, named)).authorization
        with pytest.raises(InvalidArgument, match="tenant"):
            await flow.endpoints(http, flow.Connection(microsoft, "app",
                                                       parameters={"tenant": "evil/../x?y"}))  # fmt: skip
        with pytest.raises(InvalidArgument, match="--issuer"):
            await flow.endpoints(http, flow.Connection(flow.preset("oidc"), "app"))


def test_a_provider_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "acme.json").write_text(json.dumps({
        "title": "Acme", "authorization_endpoint": "https://id.acme.test/authorize",
        "token_endpoint": "https://id.acme.test/token", "default_scopes": ["read"]}))  # fmt: skip
    (tmp_path / "github.json").write_text(json.dumps({
        "title": "GitHub Enterprise", "authorization_endpoint": "https://ghe.acme.test/login/oauth/authorize",
        "token_endpoint": "https://ghe.acme.test/login/oauth/access_token"}))  # fmt: skip
    (tmp_path / "broken.json").write_text(json.dumps({"title": "x", "token_url": "https://x"}))
    monkeypatch.setenv(flow.PROVIDERS_ENV, str(tmp_path))
    assert flow.preset("acme").default_scopes == ("read",)
    assert flow.preset("github").title == "GitHub Enterprise"  # the operator's file first
    with pytest.raises(InvalidArgument, match="unknown field.*token_url"):
        flow.preset("broken")
    with pytest.raises(InvalidArgument, match="unknown provider 'nope'; known: acme"):
        flow.preset("nope")
    with pytest.raises(InvalidArgument, match="not a provider name"):
        flow.preset("../etc/passwd")


def test_start_asks_for_pkce_scope_and_nonce_as_the_preset_says() -> None:
    google = flow.Connection(flow.preset("google"), "app-id", scopes=("openid", "email"))
    assert google.scope == "openid email" and google.wants_id_token
    slack = flow.Connection(flow.preset("slack"), "app-id", scopes=("chat:write", "channels:read"))
    assert slack.scope == "chat:write,channels:read" and not slack.wants_id_token
    assert flow.scopes_of(["a b,c", "d"]) == ("a", "b", "c", "d")


@pytest.fixture
async def slack_like() -> AsyncIterator[str]:
    async def token(_: web.Request) -> web.Response:
        return web.json_response({"ok": False, "error": "invalid_code"})

    app = web.Application()
    app.router.add_post("/api/oauth.v2.access", token)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/api/oauth.v2.access"
    await runner.cleanup()


async def test_slack_errors_with_http_200_are_refusals(slack_like: str) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(TokenRejected) as refused:
            await request_token(http, slack_like, {"code": "x"}, retry_delays=())
    assert refused.value.oauth_error == "invalid_code"


async def test_a_discovery_document_arriving_in_pieces_is_read_whole() -> None:
    """A provider's discovery document (or JWKS: Microsoft's is over 10 KiB) may reach the
    socket in several pieces; the first alone was "not JSON" and the connect failed."""
    server = SplitAnswer(b"")
    await server.start()
    try:
        issuer = server.url("")
        server.body = json.dumps({
            "issuer": issuer, "authorization_endpoint": f"{issuer}/authorize",
            "token_endpoint": f"{issuer}/token", "jwks_uri": f"{issuer}/jwks",
            "pad": "x" * 4000}).encode()  # fmt: skip
        async with aiohttp.ClientSession() as http:
            found = await flow.endpoints(http, flow.Connection(flow.preset("oidc"), "app",
                                                               issuer=issuer))  # fmt: skip
        assert (found.token, found.jwks_uri, server.cut) == (
            f"{issuer}/token",
            f"{issuer}/jwks",
            False,
        )
    finally:
        await server.close()
