"""`toolrelay webhook ...`: notifications of invocation events (docs/notifications.md)."""

from __future__ import annotations

import getpass
import sys
from enum import StrEnum

import typer

from toolrelay import config
from toolrelay.cli.context import acting, console, database, err_console, fail
from toolrelay.cli.render import Output, detail, listing, output_option, shape
from toolrelay.credentials import load_keyring
from toolrelay.errors import ToolrelayError
from toolrelay.notify import EVENTS, Webhooks
from toolrelay.notify.subscriptions import rewrap_secrets

webhook_app = typer.Typer(
    help="Webhooks: POST a signed event (or a Slack message) when a call changes state.",
    no_args_is_help=True,
)

WEBHOOK = shape(
    "webhook",
    """
    id uuid
    url string
    format string
    events string[]
    enabled boolean
    created_at time
    secret_rotated_at time?
    pending integer?
    dead integer?
    """,
)

DELIVERY = shape(
    "webhook_delivery",
    """
    id uuid
    subscription_id uuid
    invocation_id uuid
    event string
    payload object
    created_at time
    attempts integer
    max_attempts integer
    next_attempt_at time
    last_attempt_at time?
    last_status integer?
    last_error text?
    delivered_at time?
    dead boolean
    """,
)


class Format(StrEnum):
    standard = "standard"
    slack = "slack"


def _webhooks(with_keys: bool = False) -> Webhooks:
    db = database()
    keyring = (
        load_keyring(db, embedded=config.database_url_from_env() is None) if with_keys else None
    )
    return Webhooks(db, acting(), keyring)


def _secret_shown_once(action: str, row: dict[str, object], secret: str) -> None:
    err_console.print(
        f"webhook {row['id']} {action}; its signing secret (on stdout) is shown only now",
        markup=False,
        highlight=False,
    )
    typer.echo(secret)


def _read_url() -> str:
    """The URL from stdin (one line; surrounding blanks dropped); on a terminal, asked for
    without echo. Never from argv: ``ps`` and shell history keep argv, and a webhook's URL
    can be its credential (a Slack incoming webhook's path is)."""
    if sys.stdin.isatty():
        return getpass.getpass("webhook URL (input hidden): ").strip()
    return sys.stdin.read().strip()


@webhook_app.command()
def add(
    url: str | None = typer.Argument(
        None,
        hidden=True,
        help="Refused: the URL is read from stdin (argv is visible to ps and shell history).",
    ),
    events: list[str] = typer.Option(
        list(EVENTS),
        "--events",
        "-e",
        help="Events, comma-separated or repeated: pending, approved, rejected, completed,"
        " failed, expired (the invocation. prefix may be left out). Default: all.",
    ),
    fmt: Format = typer.Option(Format.standard, "--format", help="standard or slack."),
) -> None:
    """Subscribe a URL, read from stdin (asked for, hidden, on a terminal): it can be a
    credential, so never an argument. Prints the signing secret alone on stdout, this once.

    printf '%s' "$SLACK_WEBHOOK_URL" | toolrelay webhook add --format slack -e pending
    """
    if url is not None:
        err_console.print(
            "error: the webhook URL is read from stdin, never from the command line, where"
            " `ps` and your shell history keep it; if it holds a token (a Slack incoming"
            " webhook's path does), take it as exposed and make a new one. Then:\n"
            "  printf '%s' \"$URL\" | toolrelay webhook add [--format slack] [--events ...]",
            markup=False,
            highlight=False,
        )
        raise typer.Exit(2)
    try:
        row, secret = _webhooks(with_keys=True).add(_read_url(), events, fmt.value)
    except ToolrelayError as exc:
        raise fail(exc) from None
    _secret_shown_once("added", row, secret)


@webhook_app.command("list")
def list_(output: Output = output_option()) -> None:
    """Your webhooks (never their secrets; each URL as scheme://host/…), with deliveries
    pending and dead."""
    try:
        rows = _webhooks().list()
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(WEBHOOK, rows, ["id", "url", "format", "events", "enabled", "pending", "dead",
                            "created_at:created"], output)  # fmt: skip


@webhook_app.command()
def remove(webhook_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Delete a webhook and its deliveries (dead letters included)."""
    try:
        _webhooks().remove(webhook_id)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"removed {webhook_id}", markup=False)


@webhook_app.command()
def enable(webhook_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Send to it again (deliveries held while it was disabled go out)."""
    _set_enabled(webhook_id, True)


@webhook_app.command()
def disable(webhook_id: str = typer.Argument(..., metavar="ID")) -> None:
    """Stop enqueueing and sending for it; what is queued waits."""
    _set_enabled(webhook_id, False)


def _set_enabled(webhook_id: str, enabled: bool) -> None:
    try:
        _webhooks().set_enabled(webhook_id, enabled)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"{'enabled' if enabled else 'disabled'} {webhook_id}", markup=False)


@webhook_app.command("rotate-secret")
def rotate_secret(webhook_id: str = typer.Argument(..., metavar="ID")) -> None:
    """A new signing secret, used from the next attempt on; prints it alone on stdout."""
    try:
        row, secret = _webhooks(with_keys=True).rotate_secret(webhook_id)
    except ToolrelayError as exc:
        raise fail(exc) from None
    _secret_shown_once("has a new secret", row, secret)


@webhook_app.command()
def deliveries(
    dead: bool = typer.Option(False, "--dead", help="Only dead letters."),
    webhook: str | None = typer.Option(None, "--webhook", help="Only this webhook's (its id)."),
    limit: int = typer.Option(50, min=1, max=1000, help="At most this many, newest first."),
    output: Output = output_option(),
) -> None:
    """Deliveries, newest first: attempts, the last answer or error, delivered or dead."""
    try:
        rows = _webhooks().deliveries(dead=dead, subscription_id=webhook, limit=limit)
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(DELIVERY, rows, ["id", "event", "invocation_id:invocation", "attempts",
                             "last_status:status", "last_error:error", "next_attempt_at:next",
                             "delivered_at:delivered", "dead"], output)  # fmt: skip


@webhook_app.command()
def redeliver(
    delivery_id: str = typer.Argument(..., metavar="ID"), output: Output = output_option()
) -> None:
    """Send a delivery again now (a dead letter, or one the receiver lost); same webhook-id."""
    try:
        row = _webhooks().redeliver(delivery_id)
    except ToolrelayError as exc:
        raise fail(exc) from None
    detail(DELIVERY, row, output)


@webhook_app.command()
def rewrap() -> None:
    """Re-wrap every webhook's secret and URL under the newest master key, and seal URLs
    stored before they were sealed (all owners'; run it once after upgrading, and with
    `toolrelay credential rewrap` when rotating keys); prints how many changed."""
    try:
        db = database()
        count = rewrap_secrets(
            db, load_keyring(db, embedded=config.database_url_from_env() is None)
        )
    except ToolrelayError as exc:
        raise fail(exc) from None
    typer.echo(str(count))
