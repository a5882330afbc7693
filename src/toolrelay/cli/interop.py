"""`toolrelay export openai|openai-responses|anthropic|gemini` and `toolrelay import openapi`
(docs/interop.md)."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import UUID

import psycopg
import typer
import yaml

from toolrelay.cli.context import acting, database, err_console, fail
from toolrelay.cli.context import registry as context_registry
from toolrelay.cli.render import registered
from toolrelay.credentials import CredentialStore
from toolrelay.errors import ConfigurationError, InvalidArgument, NotFound, ToolrelayError
from toolrelay.export.openapi import load_openapi, tools_from_openapi
from toolrelay.export.openapi_auth import AUTH_SCHEMES
from toolrelay.export.targets import export_tools
from toolrelay.registry import Registry

export_app = typer.Typer(help="Export tools for other agent frameworks.", no_args_is_help=True)
import_app = typer.Typer(help="Import tools from API descriptions.", no_args_is_help=True)


def _registry() -> Registry:
    return context_registry()


def _note(text: str) -> None:
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


AgentOption = typer.Option(..., "--agent", help="The agent (name or id) whose tools to export.")
StrictOption = typer.Option(
    False, "--strict", help="OpenAI Structured Outputs' strict subset (openai targets only)."
)
MappingOption = typer.Option(
    None, "--mapping", help="Also write the function name → tool key table here (JSON)."
)


def _export(target: str, agent: str, strict: bool, mapping: Path | None) -> None:
    try:
        result = export_tools(_registry().agent_tools(agent), target, strict=strict)
        if mapping is not None:
            text = json.dumps(result.names, indent=2, ensure_ascii=False)
            try:
                mapping.write_text(text + "\n", encoding="utf-8")
            except OSError as exc:
                raise InvalidArgument(f"--mapping {mapping}: {exc.strerror}") from None
    except ToolrelayError as exc:
        raise fail(exc) from None
    except psycopg.Error as exc:
        raise fail(database_error(exc)) from None
    for line in result.warnings:
        _note(f"warning: {line}")
    typer.echo(json.dumps(result.tools, indent=2, ensure_ascii=False))


@export_app.command("openai")
def export_openai(
    agent: str = AgentOption, strict: bool = StrictOption, mapping: Path | None = MappingOption
) -> None:
    """Print the agent's tools as OpenAI Chat Completions tools (JSON, '.' → '__')."""
    _export("openai", agent, strict, mapping)


@export_app.command("openai-responses")
def export_openai_responses(
    agent: str = AgentOption, strict: bool = StrictOption, mapping: Path | None = MappingOption
) -> None:
    """Print the agent's tools as OpenAI Responses API function tools (the flat shape)."""
    _export("openai-responses", agent, strict, mapping)


@export_app.command("anthropic")
def export_anthropic(
    agent: str = AgentOption, strict: bool = StrictOption, mapping: Path | None = MappingOption
) -> None:
    """Print the agent's tools as Anthropic tools ({name, description, input_schema})."""
    _export("anthropic", agent, strict, mapping)  # --strict refused: it is OpenAI's


@export_app.command("gemini")
def export_gemini(
    agent: str = AgentOption, strict: bool = StrictOption, mapping: Path | None = MappingOption
) -> None:
    """Print the agent's tools as Gemini function declarations."""
    _export("gemini", agent, strict, mapping)  # --strict refused: it is OpenAI's


@import_app.command("openapi")
def import_openapi(
    file: Path = typer.Argument(..., help="An OpenAPI 3.x document, YAML or JSON."),
    credential: str | None = typer.Option(
        None, "--credential", help="Credential uuid for the tools whose API needs one."
    ),
    prefix: str = typer.Option("", "--prefix", help="Put before every tool key, e.g. 'petstore.'."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the tools as a `tool apply` file; write nothing."
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Refuse the whole document when one operation is broken."
    ),
    server: str | None = typer.Option(
        None, "--server", help="Base URL when the document has no server or a relative one."
    ),
    auth: str | None = typer.Option(
        None,
        "--auth",
        help=f"How to send the credential when the document declares no security: {AUTH_SCHEMES}.",
    ),
) -> None:
    """Create or update (by key) one tool per operation, all in one transaction; each line
    says created, updated (with what changed) or unchanged."""
    try:
        credential_ref = _credential(credential)
        doc = load_openapi(file)
        try:
            plan = tools_from_openapi(
                doc,
                credential_ref=credential_ref,
                key_prefix=prefix,
                strict=strict,
                server=server,
                auth=auth,
                credential_kind=_credential_kind(credential_ref),
            )
        except InvalidArgument as exc:
            raise InvalidArgument(f"{file}: {exc.message}") from None
        for line in plan.skipped:
            _note(f"skipped {line}")
        for line in plan.warnings:
            _note(f"warning: {line}")
        if dry_run:
            tools = [
                {k: (str(v) if isinstance(v, UUID) else v) for k, v in spec.as_dict().items()
                 if v is not None}
                for spec in plan.tools
            ]  # fmt: skip
            typer.echo(yaml.safe_dump({"tools": tools}, sort_keys=False, allow_unicode=True))
            return
        # gating the owner added by hand survives a second import (inferred gating is added)
        inferred = {spec.key for spec in plan.tools}
        rows = _registry().register_tools(plan.tools, keep_gating=inferred)
    except ToolrelayError as exc:
        raise fail(exc) from None
    except psycopg.Error as exc:
        raise fail(database_error(exc)) from None
    for row in rows:
        typer.echo(registered(row, f"{row['key']} ({row['http_method']} {row['endpoint_url']})"))
        if row["kept_gating"]:  # gating is only ever added by an import
            kept = ", ".join(row["kept_gating"])
            _note(f"{row['key']} keeps {kept} (set on the tool; the document does not ask it)")


def database_error(exc: psycopg.Error) -> ToolrelayError:
    """A database that cannot be reached, in one line."""
    first = (str(exc).strip().splitlines() or ["unknown error"])[0]
    return ConfigurationError(f"cannot reach the database: {first}")


def _credential_kind(credential_ref: UUID | None) -> str | None:
    """The credential's kind, so each operation gets a scheme it fits; None when it is not
    found (registering then refuses it, naming the tool)."""
    if credential_ref is None:
        return None
    try:
        return CredentialStore(database()).get(acting(), credential_ref).kind
    except NotFound:
        return None


def _credential(value: str | None) -> UUID | None:
    if value is None:
        return None
    try:
        return UUID(value)
    except ValueError:
        raise InvalidArgument(f"--credential is not a credential uuid: {value!r}") from None
