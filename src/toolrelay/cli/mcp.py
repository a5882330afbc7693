"""`toolrelay mcp`: MCP over stdio, as the agent whose token is in TOOLRELAY_AGENT_TOKEN."""

from __future__ import annotations

import os

import psycopg
import typer

from toolrelay import logs
from toolrelay.cli.context import database, fail
from toolrelay.cli.interop import database_error
from toolrelay.errors import ConfigurationError, ToolrelayError
from toolrelay.mcp.limits import DEFAULT_WAIT_SECONDS, MAX_WAIT_SECONDS, WAIT_ENV
from toolrelay.tokens import JWT_SECRET_ENV, Authenticator

AGENT_TOKEN_ENV = "TOOLRELAY_AGENT_TOKEN"


def mcp(
    wait_seconds: float = typer.Option(
        DEFAULT_WAIT_SECONDS,
        envvar=WAIT_ENV,
        min=0,
        max=MAX_WAIT_SECONDS,
        help="How long tools/call waits for the dispatcher's outcome before answering"
        " 'still running'.",
    ),
    log_level: str = typer.Option("WARNING", help="DEBUG, INFO, WARNING or ERROR (to stderr)."),
) -> None:
    """Serve MCP over stdio as the agent whose token is in TOOLRELAY_AGENT_TOKEN.

    Calls are dispatched by a worker running elsewhere (`toolrelay serve` or
    `toolrelay worker`); stdout carries the protocol only.
    """
    import anyio
    from mcp.server.stdio import stdio_server

    from toolrelay.mcp.server import McpSettings, agent_only, build_server, token_caller

    logs.configure(log_level)
    token = os.environ.get(AGENT_TOKEN_ENV, "").strip()
    try:
        if not token:
            raise ConfigurationError(
                f"{AGENT_TOKEN_ENV} is not set: put an agent token in it"
                " (toolrelay token create --agent NAME)"
            )
        db = database()
        authenticator = Authenticator(db, os.environ.get(JWT_SECRET_ENV) or None)
        agent_only(authenticator.authenticate(token))  # refuse at once, not on the first call
        server = build_server(db, token_caller(authenticator, token), McpSettings(wait_seconds))
    except ToolrelayError as exc:
        raise fail(exc) from None
    except psycopg.Error as exc:
        raise fail(database_error(exc)) from None

    async def serve() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(serve)
