"""`toolrelay credential ...`: secrets come from standard input, never from argv."""

from __future__ import annotations

import getpass
import json
import sys
from dataclasses import asdict
from enum import StrEnum
from uuid import UUID

import typer
from rich.table import Table

from toolrelay import config
from toolrelay.cli.context import acting, console, database, err_console, fail
from toolrelay.cli.render import CREDENTIAL, KEY_STATUS, Output, listing, output_option
from toolrelay.credentials import (
    CredentialStore,
    Keyring,
    generate_master_key,
    key_status,
    load_keyring,
)
from toolrelay.errors import InvalidArgument, ToolrelayError

credential_app = typer.Typer(
    help="Manage credentials: encrypted secrets that tools use to authenticate.",
    no_args_is_help=True,
)


class Kind(StrEnum):
    api_key = "api_key"
    oauth = "oauth"
    service_account = "service_account"
    basic = "basic"


def _keyring() -> Keyring:
    """Checked against the database: a key id in use but missing refuses (never regenerated)."""
    return load_keyring(database(), embedded=config.database_url_from_env() is None)


def _store(with_keys: bool = False) -> CredentialStore:
    return CredentialStore(database(), _keyring() if with_keys else None)


def _read_secret(kind: str) -> str:
    """The secret from stdin, with one trailing newline dropped."""
    if sys.stdin.isatty():
        if kind == Kind.api_key.value:
            return getpass.getpass("secret (input hidden): ")
        if kind == Kind.basic.value:  # the username shown as typed, the password hidden
            username = input("username: ")
            return json.dumps({"username": username, "password": getpass.getpass("password: ")})
        err_console.print(f"paste the {kind} JSON, then press Ctrl-D", highlight=False)
    text = sys.stdin.read()
    if text.endswith("\r\n"):
        return text[:-2]
    return text.removesuffix("\n")


def _uuid(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise InvalidArgument(f"not a credential id (uuid): {value!r}") from None


@credential_app.command()
def add(
    kind: Kind = typer.Option(
        ..., "--kind", help="api_key, oauth, service_account or basic ({username, password})."
    ),
    name: str = typer.Option(..., "--name", help="A name unique among your credentials."),
    host: list[str] = typer.Option(
        [], "--host", help="Allowed host or host:port (repeatable; default: first tool's host)."
    ),
) -> None:
    """Add a credential; the secret is read from stdin. Prints the new id."""
    try:
        store = _store(with_keys=True)
        new_id = store.add(acting(), kind.value, name, _read_secret(kind.value), host)
    except ToolrelayError as exc:
        raise fail(exc) from None
    typer.echo(str(new_id))


@credential_app.command("list")
def list_(output: Output = output_option()) -> None:
    """List your credentials (metadata only)."""
    try:
        infos = _store().list(acting())
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(
        CREDENTIAL,
        infos,
        ["id", "name", "kind", "status", "allowed_hosts:hosts", "created_at:created",
         "last_used_at:last used", "expires_at:expires"],
        output,
    )  # fmt: skip
    for info in infos:  # on stderr: the listing itself stays machine-readable
        if info.kind == Kind.oauth.value and info.status == "needs_reauth":
            err_console.print(f"{info.name} needs a person to sign in again: toolrelay"
                              f" credential connect --reconnect {info.id}",
                              markup=False, highlight=False, soft_wrap=True)  # fmt: skip


@credential_app.command()
def rotate(credential_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Replace the secret (read from stdin); the id stays the same."""
    try:
        ident = _uuid(credential_id)
        store = _store(with_keys=True)
        info = store.get(acting(), ident)
        store.rotate(acting(), ident, _read_secret(info.kind))
    except ToolrelayError as exc:
        raise fail(exc) from None
    err_console.print(f"rotated {ident}", highlight=False)


@credential_app.command()
def hosts(
    credential_id: str = typer.Argument(..., metavar="ID"),
    host: list[str] = typer.Option([], "--host", help="Allowed host or host:port (repeatable)."),
) -> None:
    """Replace the hosts a credential may be sent to."""
    try:
        _store().set_hosts(acting(), _uuid(credential_id), host)
    except ToolrelayError as exc:
        raise fail(exc) from None


@credential_app.command()
def delete(
    credential_id: str = typer.Argument(..., metavar="ID"),
    force: bool = typer.Option(False, "--force", help="Unbind tools that use it, then delete."),
) -> None:
    """Delete a credential (refused while tools use it, unless --force)."""
    try:
        unbound = _store().delete(acting(), _uuid(credential_id), force=force)
    except ToolrelayError as exc:
        raise fail(exc) from None
    if unbound:
        err_console.print(f"unbound tool(s): {', '.join(unbound)}", highlight=False)


@credential_app.command()
def rewrap() -> None:
    """Re-wrap every data key under the newest master key; prints how many changed."""
    try:
        count = _store(with_keys=True).rewrap()
    except ToolrelayError as exc:
        raise fail(exc) from None
    typer.echo(str(count))


@credential_app.command()
def keys(output: Output = output_option()) -> None:
    """Which master key ids are configured, which are in use (credentials and webhook
    secrets), and whether each configured key opens what it seals.

    Exits 1 when secrets in use cannot be read: their key id is not configured, or the key
    of that id is another one (the checks worker and serve make before starting)."""
    try:
        statuses = key_status(database())
    except ToolrelayError as exc:
        raise fail(exc) from None
    if output is not Output.table:
        listing(KEY_STATUS, [asdict(st) for st in statuses], [], output)
    else:
        out = Table()
        for column in ("key id", "configured", "credentials", "webhook secrets", "opens",
                       "newest"):  # fmt: skip
            out.add_column(column)
        for st in statuses:
            configured = "yes" if st.configured else "MISSING" if st.unreadable else "no"
            opens = {True: "yes", False: "NO: another key", None: ""}[st.opens]
            out.add_row(st.key_id, configured, str(st.credentials), str(st.webhook_secrets),
                        opens, "yes" if st.newest else "")  # fmt: skip
        console.print(out)
    if any(st.unreadable for st in statuses):
        raise typer.Exit(1)


@credential_app.command()
def keygen(key_id: str = typer.Option("default", "--id", help="The new key's id.")) -> None:
    """Print a new master key entry (id:base64) for TOOLRELAY_MASTER_KEY."""
    try:
        typer.echo(generate_master_key(key_id))
    except ToolrelayError as exc:
        raise fail(exc) from None


from toolrelay.cli.connect import connect  # noqa: E402  (it reads this module's keyring)

credential_app.command()(connect)
