"""`toolrelay export openai|openai-responses|anthropic|gemini --agent ID [--strict]`: each
target checked with that vendor's own SDK types, the strict form against the documented
strict rules, and long keys shortened, with the name taking calls back to the tool."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic.types import ToolParam
from anthropic.types.tool_param import InputSchemaTyped
from google.genai import types as genai
from jsonschema import Draft202012Validator
from openai.types.chat import ChatCompletionFunctionTool, ChatCompletionToolParam
from openai.types.responses import FunctionTool, FunctionToolParam
from openai.types.shared_params import FunctionDefinition
from pydantic import TypeAdapter

from tests.api.conftest import api, keyring  # noqa: F401  (the real app on loopback)
from tests.corpus.strict import strict_violations
from tests.interop.conftest import Owner
from tests.mcp.conftest import http_client
from toolrelay.export.names import exported_name, exported_names, key_for, may_be_exported
from toolrelay.export.strict import from_strict_call
from toolrelay.registry import ToolSpec
from toolrelay.tokens import TokenStore

# GitHub-like keys: `gh.` + operation ids, four of them past 64 characters after `.` → `__`
LONG_KEYS = [
    "gh.codespaces.list_repositories_for_secret_for_authenticated_user",
    "gh.actions.list_selected_repositories_enabled_github_actions_organization",
    "gh.enterprise_admin.update_attribute_for_enterprise_group_member_a",
    "gh.enterprise_admin.update_attribute_for_enterprise_group_member_b",  # same prefix
]
ISSUES_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "owner": {"type": "string", "minLength": 1, "description": "The account owner."},
        "per_page": {"type": "integer", "default": 30, "maximum": 100},
        "since": {"type": "string", "format": "date-time"},
        "id": {"type": "integer", "format": "int64", "examples": [42]},
        "labels": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "assignee": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        "state": {"type": "string", "enum": ["open", "closed"]},
        "milestone": {"type": ["integer", "null"]},
        "author": {
            "type": "object",
            "properties": {"login": {"type": "string"}, "email": {"type": "string"}},
            "required": ["login"],
        },
        "team": {"$ref": "#/$defs/Team", "description": "The team to notify."},
        "reviewer": {"$ref": "#/$defs/Team"},
    },
    "required": ["owner"],
    "additionalProperties": False,
    "$defs": {
        "Team": {
            "type": "object",
            "properties": {"slug": {"type": "string"}, "parent": {"$ref": "#/$defs/Team"}},
            "required": ["slug"],
        }
    },
}
FREE_FORM_INPUT = {"type": "object", "properties": {"payload": {"type": "object"}}}
TARGETS = ["openai", "openai-responses", "anthropic", "gemini"]


def register(owner: Owner, key: str, **fields: Any) -> None:
    values = {"key": key, "name": key, "endpoint_url": "https://api.example.com/x",
              "http_method": "POST", "egress_class": "write"} | fields  # fmt: skip
    owner.registry.register_tool(ToolSpec.from_mapping(values))


@pytest.fixture
def bot(owner: Owner) -> uuid.UUID:
    """Agent ``bot`` with the long keys, a rich schema, a free-form one, a long description."""
    for key in LONG_KEYS:
        register(owner, key, schema_input=ISSUES_INPUT, description="List things.")
    register(owner, "gh.issues.list_for_repo", schema_input=ISSUES_INPUT)
    register(owner, "hooks.deliver", schema_input=FREE_FORM_INPUT)
    register(owner, "docs.long", description="d" * 1500)
    register(owner, "1password.items.get")  # Gemini: a name must not start with a digit
    agent_id = owner.registry.create_agent("bot")
    for key in [*LONG_KEYS, "gh.issues.list_for_repo", "hooks.deliver", "docs.long",
                "1password.items.get"]:  # fmt: skip
        owner.registry.assign("bot", key)
    return agent_id


def export(owner: Owner, *args: str) -> tuple[list[dict[str, Any]], str]:
    result = owner.cli("export", *args, "--agent", "bot")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def shape(value: Mapping[str, Any], typed: Any) -> None:
    """Valid for the SDK's TypedDict, and no key it does not declare (pydantic lets them by)."""
    TypeAdapter(typed).validate_python(value, strict=False)
    assert set(value) <= set(typed.__annotations__), set(value) - set(typed.__annotations__)


# --- names -------------------------------------------------------------------------------------


def test_long_keys_get_short_unique_names_stable_across_runs() -> None:
    names = exported_names([*LONG_KEYS, "gh.repos.get", "plain"])
    assert list(names.values()) == [*LONG_KEYS, "gh.repos.get", "plain"]
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,64}", n) for n in names)
    assert len(set(names)) == len(names)
    # the hash of the whole key: the same on every machine (pinned), readable prefix kept
    assert (
        exported_name(LONG_KEYS[0])
        == "gh__codespaces__list_repositories_for_secret_for_auth_f794631412"
    )
    assert exported_name(LONG_KEYS[2]) != exported_name(LONG_KEYS[3])
    assert exported_name("gh.repos.get") == "gh__repos__get"  # SPEC: fits, `.` → `__`
    assert exported_name("x" * 128) == exported_name("x" * 128) != exported_name("x" * 127)


def test_an_exported_name_maps_back_to_its_key_among_the_agents() -> None:
    keys = [*LONG_KEYS, "gh.repos.get", "my__tool"]
    for name, key in exported_names(keys).items():
        assert key_for(name, keys) == key
        assert key_for(key, keys) == key  # MCP names are the keys
    assert key_for("gh__repos__get", ["gh.other"]) is None
    assert may_be_exported(exported_name(LONG_KEYS[1])) and may_be_exported("gh__repos__get")
    assert not may_be_exported("gh.repos.get") and not may_be_exported("plain")


def test_cli_prints_the_renames_and_writes_the_mapping(
    owner: Owner, bot: uuid.UUID, tmp_path: Path
) -> None:
    mapping = tmp_path / "names.json"
    tools, stderr = export(owner, "openai", "--mapping", str(mapping))
    table = json.loads(mapping.read_text())
    assert [t["function"]["name"] for t in tools] == list(table)
    assert sorted(table.values()) == sorted([*LONG_KEYS, "docs.long", "gh.issues.list_for_repo",
                                             "hooks.deliver", "1password.items.get"])  # fmt: skip
    assert table["gh__issues__list_for_repo"] == "gh.issues.list_for_repo"
    for key in LONG_KEYS:
        assert f"warning: tool {key}: exported as {exported_name(key)}" in stderr
        assert len(exported_name(key)) <= 64
    again, _ = export(owner, "openai")
    assert again == tools


# --- each vendor's shape -------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_validates_with_the_vendors_sdk_types(
    owner: Owner, bot: uuid.UUID, target: str
) -> None:
    tools, _ = export(owner, target)
    assert len(tools) == 8
    for tool in tools:
        if target == "openai":
            shape(tool, ChatCompletionToolParam)
            shape(tool["function"], FunctionDefinition)
            ChatCompletionFunctionTool.model_validate(tool)
            schema = tool["function"]["parameters"]
        elif target == "openai-responses":
            shape(tool, FunctionToolParam)
            FunctionTool.model_validate(tool)
            assert tool["strict"] is False  # Responses reads a missing flag as strict
            schema = tool["parameters"]
        elif target == "anthropic":
            shape(tool, ToolParam)
            # a JSON Schema: its typed part checked, other keywords are JSON Schema's own
            TypeAdapter(InputSchemaTyped).validate_python(tool["input_schema"])
            schema = tool["input_schema"]
        else:
            declaration = genai.FunctionDeclaration.model_validate(tool)  # extra="forbid"
            assert declaration.name == tool["name"] and declaration.parameters_json_schema
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}", tool["name"])  # its rule
            schema = tool["parametersJsonSchema"]
        assert schema["type"] == "object"
        Draft202012Validator.check_schema(schema)


def test_long_descriptions_are_shortened_with_a_warning(owner: Owner, bot: uuid.UUID) -> None:
    tools, stderr = export(owner, "anthropic")
    (long,) = [t for t in tools if t["name"] == "docs__long"]
    assert len(long["description"]) == 1024 and long["description"].endswith("…")
    assert "warning: tool docs.long: description shortened from 1500 to 1024 characters" in stderr


def test_strict_is_only_for_the_openai_targets(owner: Owner, bot: uuid.UUID) -> None:
    for target in ("anthropic", "gemini"):
        result = owner.cli("export", target, "--agent", "bot", "--strict")
        assert result.exit_code == 1 and result.stdout == ""
        assert (
            result.stderr == f"error: --strict is OpenAI's Structured Outputs: not for {target}\n"
        )


def test_gemini_names_start_with_a_letter_or_underscore(
    owner: Owner, bot: uuid.UUID, tmp_path: Path
) -> None:
    mapping = tmp_path / "names.json"
    tools, _ = export(owner, "gemini", "--mapping", str(mapping))
    assert "_1password__items__get" in [t["name"] for t in tools]
    assert json.loads(mapping.read_text())["_1password__items__get"] == "1password.items.get"
    openai, _ = export(owner, "openai")
    assert "1password__items__get" in [t["function"]["name"] for t in openai]  # SPEC as is


# --- strict ------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["openai", "openai-responses"])
def test_strict_output_keeps_the_strict_rules_and_the_sdk_types(
    owner: Owner, bot: uuid.UUID, target: str
) -> None:
    assert len(strict_violations(ISSUES_INPUT)) >= 8  # the input as is: default, int64, oneOf…
    tools, stderr = export(owner, target, "--strict")
    functions = [t["function"] if target == "openai" else t for t in tools]
    strict = {f["name"]: f for f in functions if f["strict"] is True}
    assert set(strict) == {exported_name(k) for k in LONG_KEYS} | {
        "gh__issues__list_for_repo", "docs__long", "1password__items__get"
    }  # fmt: skip
    for function in strict.values():
        assert strict_violations(function["parameters"]) == [], function["name"]
        Draft202012Validator.check_schema(function["parameters"])
    for tool in tools:
        shape(tool, ChatCompletionToolParam if target == "openai" else FunctionToolParam)
    # a free-form object has no strict form: exported as it is, strict false, said so
    (free,) = [f for f in functions if f["name"] == "hooks__deliver"]
    assert free["strict"] is False and free["parameters"] == FREE_FORM_INPUT
    assert "warning: tool hooks.deliver: exported with strict false" in stderr


def test_strict_conversion_is_faithful(owner: Owner, bot: uuid.UUID) -> None:
    tools, _ = export(owner, "openai", "--strict")
    (tool,) = [t["function"] for t in tools if t["function"]["name"] == "gh__issues__list_for_repo"]
    params = tool["parameters"]
    props = params["properties"]
    assert sorted(params["required"]) == sorted(ISSUES_INPUT["properties"])
    assert props["owner"]["type"] == "string"  # required: not nullable
    assert props["owner"]["description"] == "The account owner. (minLength: 1)"
    assert props["per_page"] == {"type": ["integer", "null"], "maximum": 100,
                                 "description": "default: 30"}  # fmt: skip
    assert props["id"]["description"] == 'examples: [42]; format: "int64"'
    assert props["assignee"]["anyOf"][-1] == {"type": "null"}  # oneOf → anyOf, nullable
    assert props["state"]["enum"] == ["open", "closed", None]
    assert props["milestone"] == {"type": ["integer", "null"]}  # already nullable: as it was
    assert props["author"]["additionalProperties"] is False
    assert props["author"]["properties"]["email"]["type"] == ["string", "null"]
    assert props["team"]["description"] == "The team to notify."  # $ref + siblings: spelt out
    assert props["reviewer"] == {"anyOf": [{"$ref": "#/$defs/Team"}, {"type": "null"}]}
    # what the model sends under strict (null = left out) is the call the tool accepts
    sent = {"owner": "octo", "per_page": None, "since": None, "id": 7, "labels": ["bug"],
            "assignee": None, "state": "open", "milestone": None,
            "author": {"login": "a", "email": None}, "team": {"slug": "t", "parent": None},
            "reviewer": None}  # fmt: skip
    Draft202012Validator(params).validate(sent)
    dropped = {k: v for k, v in sent.items() if v is not None or k == "milestone"}
    dropped["author"] = {"login": "a"}
    dropped["team"] = {"slug": "t"}
    assert from_strict_call(ISSUES_INPUT, sent) == dropped  # null = left out, unless allowed
    Draft202012Validator(ISSUES_INPUT).validate(dropped)


# --- calls come back with the exported name ----------------------------------------------------


@pytest.fixture
def agent_token(owner: Owner, bot: uuid.UUID, db: Any) -> str:
    _, token = TokenStore(db).create(owner.id, bot, name="bot")
    return token


@pytest.fixture
def agent_http(api: str, agent_token: str) -> Iterator[httpx.Client]:  # noqa: F811
    headers = {"Authorization": f"Bearer {agent_token}"}
    with httpx.Client(base_url=api, headers=headers, timeout=30.0) as http:
        yield http


def test_api_invoke_with_an_exported_name_reaches_the_tool(agent_http: httpx.Client) -> None:
    names = {exported_name(k): k for k in [*LONG_KEYS, "gh.issues.list_for_repo"]}
    for name, key in names.items():
        response = agent_http.post(
            "/v1/agent/invocations", json={"tool": name, "input": {"owner": "octo"}}
        )
        assert response.status_code == 202, response.text
        assert response.json()["tool_key"] == key
    gemini = agent_http.post("/v1/agent/invocations", json={"tool": "_1password__items__get"})
    assert gemini.status_code == 202 and gemini.json()["tool_key"] == "1password.items.get"
    by_key = agent_http.post("/v1/agent/invocations", json={"tool": LONG_KEYS[0],
                                                            "input": {"owner": "o"}})  # fmt: skip
    assert by_key.status_code == 202 and by_key.json()["tool_key"] == LONG_KEYS[0]
    unknown = agent_http.post("/v1/agent/invocations", json={"tool": "gh__nothing", "input": {}})
    assert unknown.status_code in (403, 404), unknown.text


def test_a_strict_call_s_nulls_arrive_as_left_out(agent_http: httpx.Client) -> None:
    """Under strict mode the model sends null for what it omits; the tool never sees it."""
    sent = {"owner": "octo", "per_page": None, "milestone": None, "author": {"login": "a",
            "email": None}}  # fmt: skip
    response = agent_http.post(
        "/v1/agent/invocations", json={"tool": "gh__issues__list_for_repo", "input": sent}
    )
    assert response.status_code == 202, response.text
    stored = response.json()["input"]
    assert stored == {"owner": "octo", "milestone": None, "author": {"login": "a"}}


async def test_mcp_call_with_an_exported_name_reaches_the_tool(
    owner: Owner,
    api: str,  # noqa: F811
    agent_token: str,
) -> None:
    name = exported_name(LONG_KEYS[1])
    async with http_client(api, agent_token) as client:
        result = await client.call_tool(name, {"owner": "octo"})
    assert f"The call to {LONG_KEYS[1]} awaits a human's approval" in json.dumps(
        result.model_dump(mode="json")
    )
    (row,) = owner.registry.list_invocations()
    assert row["tool_key"] == LONG_KEYS[1]
