"""`toolrelay credential connect`: make or reconnect an ``oauth`` credential by signing in
at the provider (authorization code + PKCE, a loopback redirect per RFC 8252), instead of
pasting tokens (docs/credentials.md#connect-an-account)."""

from __future__ import annotations

import asyncio
import sys
import webbrowser
from uuid import UUID

import typer

from toolrelay.cli.context import acting, database, err_console, fail
from toolrelay.credentials import connect as flow
from toolrelay.credentials.connect_flows import ConnectFlows, record_connection
from toolrelay.credentials.store import CredentialStore
from toolrelay.dispatch.egress import EgressPolicy, make_connector
from toolrelay.dispatch.http import outbound_session
from toolrelay.errors import InvalidArgument, ToolrelayError
from toolrelay.signin import loopback
from toolrelay.tokens import Caller


def connect(
    provider: str | None = typer.Option(None, "--provider", help="A provider preset: github, google, slack, microsoft, oidc, or one of TOOLRELAY_OAUTH_PROVIDERS_DIR (a reconnect: the one it was connected with)."),
    name: str | None = typer.Option(None, "--name", help="The new credential's name (default: the provider's)."),
    client_id: str | None = typer.Option(None, "--client-id", help="Your OAuth app's client id at the provider."),
    client_secret_stdin: bool = typer.Option(False, "--client-secret-stdin", help="Read the app's client secret from stdin (never argv)."),
    scope: list[str] = typer.Option([], "--scope", help="Scopes to ask for (repeatable; default: the preset's)."),
    issuer: str | None = typer.Option(None, "--issuer", help="The issuer, for --provider oidc."),
    param: list[str] = typer.Option([], "--param", help="NAME=VALUE for the preset's endpoints (e.g. tenant=contoso.com)."),
    host: list[str] = typer.Option([], "--host", help="Allowed host (repeatable; default: the preset's)."),
    reconnect: UUID | None = typer.Option(None, "--reconnect", metavar="ID", help="Sign in again for this credential (needs_reauth): same id, new tokens."),
    browser: bool = typer.Option(True, "--browser/--no-browser", help="Open the sign-in page (else only print it)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the provider."),
) -> None:  # fmt: skip
    """Connect an account: sign in at the provider; the tokens are stored sealed as an oauth
    credential (refreshed as any). Prints the credential's id."""
    from toolrelay.cli.credentials import _store  # the CLI's keyring, checked

    try:
        store = _store(with_keys=True)
        if reconnect is not None and provider is None:  # as it was connected
            known = ConnectFlows(database(), None).connected_with(acting(), reconnect)
            if known is None:
                raise InvalidArgument(f"credential {reconnect} was not connected: give --provider")
            provider, issuer = known["provider"], issuer or known["issuer"]
            param = param or [f"{k}={v}" for k, v in known["parameters"].items()]
        if provider is None:
            raise InvalidArgument("give --provider (github, google, slack, microsoft, oidc, ...)")
        connection = _connection(store, provider, client_id, client_secret_stdin, scope,
                                 issuer, param, reconnect)  # fmt: skip
        secret = asyncio.run(_run(connection, browser, timeout))
        if reconnect is not None:
            store.rotate(acting(), reconnect, secret)
            made = reconnect
        else:
            hosts = host or list(connection.preset.allowed_hosts)
            made = store.add(acting(), "oauth", name or provider, secret, hosts)
        owner = acting()
        record_connection(database(), made, owner.owner if isinstance(owner, Caller) else owner,
                          connection.preset.name, connection.issuer,
                          dict(connection.parameters))  # fmt: skip
    except ToolrelayError as exc:
        raise fail(exc) from None
    what = "reconnected" if reconnect is not None else "connected"
    err_console.print(f"{what} {connection.preset.title}: credential {made}", markup=False,
                      highlight=False)  # fmt: skip
    typer.echo(str(made))


def _connection(
    store: CredentialStore,
    provider: str,
    client_id: str | None,
    secret_stdin: bool,
    scope: list[str],
    issuer: str | None,
    param: list[str],
    reconnect: UUID | None,
) -> flow.Connection:
    chosen = flow.preset(provider)
    secret = _first_line(sys.stdin.read()) if secret_stdin else None
    scopes = flow.scopes_of(scope)
    if reconnect is not None:  # the app it was made with, unless given again
        old = store.oauth_client(acting(), reconnect)
        client_id = client_id or old.client_id
        secret = secret or old.client_secret
        scopes = scopes or flow.scopes_of([old.scope or ""])
    if not client_id:
        raise InvalidArgument("give --client-id: your OAuth app's client id at the provider")
    params: dict[str, str] = {}
    for item in param:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidArgument(f"--param {item!r}: give NAME=VALUE")
        params[key] = value
    return flow.Connection(chosen, client_id, secret, scopes, issuer, params)


def _first_line(text: str) -> str | None:
    line = text.splitlines()[0].strip() if text.strip() else ""
    return line or None


async def _run(connection: flow.Connection, open_browser: bool, timeout: float) -> str:
    connector = make_connector(EgressPolicy.from_env())
    async with outbound_session(connector) as http:
        started: list[flow.Started] = []

        async def begin(redirect: str) -> tuple[str, str]:
            started.append(await flow.start(http, connection, redirect))
            return started[0].url, started[0].state

        def show(url: str) -> None:
            err_console.print("Sign in at the provider (it brings you back here):", markup=False)
            err_console.print(url, markup=False, highlight=False, soft_wrap=True)
            if open_browser:
                webbrowser.open(url)

        params, _ = await loopback.receive(begin, show, timeout)
        said = loopback.provider_error(params)
        if said is not None:
            raise flow.ConnectError(f"the provider said {said}; nothing was stored")
        if not params.get("code"):
            raise flow.ConnectError("the provider's answer carries no code; nothing was stored")
        return await flow.exchange(http, connection, started[0], params["code"])
