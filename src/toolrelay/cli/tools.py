"""`toolrelay tool ...`: register, update, apply, list, show, disable, enable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from toolrelay.cli.context import console, fail, registry
from toolrelay.cli.render import TOOL, Output, detail, listing, output_option, registered
from toolrelay.errors import InvalidArgument, ToolrelayError
from toolrelay.export.openapi_load import load_yaml
from toolrelay.registry import ToolSpec

tool_app = typer.Typer(help="Register and manage tools.", no_args_is_help=True)


def parse_json(option: str, text: str | None) -> Any:
    """A JSON option value, or @FILE to read it from a file."""
    if text is None:
        return None
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise InvalidArgument(f"--{option} @{text[1:]}: cannot read the file: {why}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(
            f"--{option} is not valid JSON: {exc.msg} at char {exc.pos}"
        ) from None


@tool_app.command("register")
def register(
    key: str,
    name: str = typer.Option(..., help="Human-readable name."),
    description: str | None = None,
    category: str = "general",
    endpoint_url: str | None = typer.Option(None, "--endpoint-url", "--endpoint"),
    http_method: str | None = typer.Option(None, "--http-method", "--method"),
    egress_class: str | None = typer.Option(None, help="none, read_only or write."),
    auth_method: str = "none",
    credential: str | None = typer.Option(None, help="Credential uuid (credential_ref)."),
    auth_placement: str | None = None,
    auth_param_name: str | None = None,
    auth_param_prefix: str | None = None,
    schema_input: str | None = typer.Option(None, help="JSON Schema (JSON or @file)."),
    schema_output: str | None = typer.Option(None, help="JSON Schema (JSON or @file)."),
    template: str | None = typer.Option(None, help="request_template (JSON or @file)."),
    response_pointer: str | None = None,
    requires_approval: bool = False,
    dangerous: bool = False,
) -> None:
    """Create or update (by KEY) a tool."""
    try:
        spec = ToolSpec.from_mapping(
            {
                "key": key,
                "name": name,
                "description": description,
                "category": category,
                "endpoint_url": endpoint_url,
                "http_method": http_method.upper() if http_method else None,
                "egress_class": egress_class,
                "auth_method": auth_method,
                "credential_ref": credential,
                "auth_placement": auth_placement,
                "auth_param_name": auth_param_name,
                "auth_param_prefix": auth_param_prefix,
                "schema_input": parse_json("schema-input", schema_input) or {},
                "schema_output": parse_json("schema-output", schema_output) or {},
                "request_template": parse_json("template", template),
                "response_pointer": response_pointer,
                "requires_approval": requires_approval,
                "is_dangerous": dangerous,
            }
        )
        row = registry().register_tool(spec)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(str(row["id"]), markup=False, highlight=False)


@tool_app.command("update")
def update(
    key: str,
    set_: list[str] = typer.Option(
        ..., "--set", help="FIELD=VALUE; VALUE is parsed as JSON when it parses."
    ),
) -> None:
    """Change fields of a tool, e.g. --set endpoint_url=https://... --set timeout_seconds=10."""
    changes: dict[str, Any] = {}
    for item in set_:
        field, sep, raw = item.partition("=")
        if not sep:
            raise fail(InvalidArgument(f"--set expects FIELD=VALUE, got {item!r}"))
        try:
            changes[field] = json.loads(raw)
        except json.JSONDecodeError:
            changes[field] = raw
    try:
        row = registry().update_tool(key, changes)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"updated {row['key']}", markup=False)


def load_tool_file(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidArgument(f"{path}: cannot read tools: {exc}") from None
    data = load_yaml(text, str(path), "cannot read tools: not valid YAML")
    if isinstance(data, dict):
        data = data.get("tools", [data])
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise InvalidArgument(f"{path}: expected a list of tools or {{tools: [...]}}")
    return data


# What a file says about approval; a tool whose entry names neither keeps its own.
APPROVAL_FIELDS = frozenset({"requires_approval", "is_dangerous"})


@tool_app.command("apply")
def apply(path: Path) -> None:
    """Create or update every tool in a YAML/JSON file (idempotent): all of them, or none
    when one is refused."""
    try:
        entries = load_tool_file(path)
        specs = [ToolSpec.from_mapping(t) for t in entries]
        # A tool whose entry says nothing of approval keeps its gating (an owner's
        # `requires_approval=true` set by hand is not undone by applying the file again).
        unstated = {spec.key for spec, t in zip(specs, entries, strict=True)
                    if not APPROVAL_FIELDS & t.keys()}  # fmt: skip
        rows = registry().register_tools(specs, keep_gating=unstated)  # one transaction
    except ToolrelayError as exc:
        raise fail(exc) from None
    for spec, row in zip(specs, rows, strict=True):
        console.print(registered(row, spec.key), markup=False)
        if row["kept_gating"]:
            kept = ", ".join(row["kept_gating"])
            console.print(f"{spec.key} keeps {kept} (set on the tool; the file does not say)",
                          markup=False)  # fmt: skip


@tool_app.command("list")
def list_(output: Output = output_option()) -> None:
    """List your tools."""
    try:
        rows = registry().list_tools()
    except ToolrelayError as exc:
        raise fail(exc) from None
    listing(
        TOOL,
        rows,
        ["key", "name", "status", "egress_class:egress", "http_method:method",
         "endpoint_url:endpoint", "auth_method:auth"],
        output,
    )  # fmt: skip


@tool_app.command("show")
def show_(key: str, output: Output = output_option(Output.json)) -> None:
    """Show one tool (never secret material: credentials are referenced by id)."""
    try:
        detail(TOOL, registry().get_tool(key), output)
    except ToolrelayError as exc:
        raise fail(exc) from None


def _set_status(key: str, status: str, done: str) -> None:
    try:
        registry().set_tool_status(key, status)
    except ToolrelayError as exc:
        raise fail(exc) from None
    console.print(f"{done} {key}", markup=False)


@tool_app.command("disable")
def disable(key: str) -> None:
    """Disable a tool: invocations not yet sent will not be sent."""
    _set_status(key, "disabled", "disabled")


@tool_app.command("enable")
def enable(key: str) -> None:
    """Enable a disabled (or deprecated) tool again: agents can call it."""
    _set_status(key, "active", "enabled")
