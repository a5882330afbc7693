"""`toolrelay login`, `logout`, `whoami`: a member signs the CLI in through the OpenID
Connect provider (docs/approvals.md).

`login` runs the native-app flow of RFC 8252: a loopback redirect on a free port, PKCE S256,
state and nonce, with the CLI's public client (TOOLRELAY_OIDC_CLI_CLIENT_ID). The member the
ID token names gets a session token of their own, kept in TOOLRELAY_HOME/session.json (0600);
from then on every command acts as that member, whose role the database checks, and whose
decisions carry their name. The session ends when it expires, at `logout`, or when an admin
removes the member.
"""

from __future__ import annotations

import asyncio
import webbrowser
from uuid import UUID

import typer

from toolrelay.cli.context import (
    CliSession,
    acting,
    database,
    err_console,
    fail,
    owner_id,
    save_session,
    session_path,
    signed_in,
)
from toolrelay.errors import ConfigurationError, ToolrelayError
from toolrelay.registry.members import Members
from toolrelay.signin import AmbiguousMember, OidcClient, OidcSettings, SignIns, loopback
from toolrelay.signin.oidc import CLI_CLIENT_ID_ENV, ISSUER_ENV
from toolrelay.tokens import Caller


def login(
    owner: UUID | None = typer.Option(
        None, "--owner", help="The organization, when you are a member of several."
    ),
    browser: bool = typer.Option(
        True, "--browser/--no-browser", help="Open the sign-in page (else only print it)."
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the provider."),
) -> None:
    """Sign in as a member through the OpenID Connect provider."""
    try:
        settings = OidcSettings.from_env()
        if settings is None:
            raise ConfigurationError(
                f"sign-in is not set up: set {ISSUER_ENV} and {CLI_CLIENT_ID_ENV} (a public,"
                " native client at the provider that allows http://127.0.0.1/callback)"
            )
        client = OidcClient.for_cli(settings)
        who = asyncio.run(loopback.sign_in(client, _show(browser), timeout))
        try:
            session = SignIns(database()).sign_in(who, owner, "cli")
        except AmbiguousMember as exc:
            choices = ", ".join(f"{m.owner} ({m.name}, {m.role})" for m in exc.matches)
            raise ToolrelayError(f"{exc.message} with --owner: {choices}") from None
        previous = signed_in()
        path = save_session(
            CliSession(session.token, session.owner, session.member_id, session.name,
                       session.role, session.expires_at)
        )  # fmt: skip
        if previous is not None:
            SignIns(database()).sign_out(previous.token)
    except ToolrelayError as exc:
        raise fail(exc) from None
    err_console.print(
        f"signed in as {session.name} ({session.role}) in organization {session.owner}, until"
        f" {session.expires_at:%Y-%m-%d %H:%M %Z}; the session is in {path}",
        markup=False, highlight=False, soft_wrap=True,
    )  # fmt: skip


def logout() -> None:
    """End the CLI's sign-in: its session token revoked, the file removed."""
    try:
        session = signed_in()
        if session is None:
            err_console.print("not signed in", markup=False)
            return
        SignIns(database()).sign_out(session.token)
    except ToolrelayError as exc:
        raise fail(exc) from None
    session_path().unlink(missing_ok=True)
    err_console.print(f"signed out {session.name}", markup=False, highlight=False)


def whoami() -> None:
    """Who the CLI acts as: a signed-in member (checked now) or the tenant itself."""
    try:
        who = acting()
        if isinstance(who, Caller) and who.member_id is not None:
            me = Members(database()).get(who, who.member_id)  # the role as it is now
            typer.echo(f"{me.name}\t{me.role}\tmember {me.id}\torganization {who.owner}")
        else:
            typer.echo(f"the tenant itself\t\t\torganization {owner_id()}")
    except ToolrelayError as exc:
        raise fail(exc) from None


def _show(open_browser: bool) -> loopback.Show:
    def show(url: str) -> None:
        err_console.print("Sign in at this address (it brings you back here):", markup=False)
        err_console.print(url, markup=False, highlight=False, soft_wrap=True)
        if open_browser:
            webbrowser.open(url)

    return show
