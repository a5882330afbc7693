"""What an agent wrote cannot drive the terminal of a person reading a call as JSON.

`toolrelay invocations show ID` prints JSON by default: the command a person runs to look at
a call waiting for them. Its input and reason are the agent's text. JSON escapes only
U+0000 to U+001F, so C1 controls (U+009B is CSI, U+009D OSC: colours, clearing the screen,
writing the clipboard in terminals that act on them), bidi overrides (U+202E shows "0001"
as "1000") and other format characters reached the terminal raw, where the table output
already drew them as U+FFFD. JSON output now writes them as ``\\uXXXX`` escapes: the same
JSON values for a script, nothing a terminal acts on.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from tests.registry.helpers import add_tool
from toolrelay.cli import context
from toolrelay.cli.main import app
from toolrelay.registry import Registry

# CSI "clear screen", OSC 52 "set the clipboard" ended by ST, a bidi override and isolate,
# a zero-width joiner, a line separator, a language tag (a format character past U+FFFF)
HOSTILE = "ok\u009b2J\u009d52;c;cm0gLXJmIH4=\u009c \u202e0001\u2066x\u2069\u200d\u2028\U000e0041"
NOT_ON_A_TERMINAL = ("Cc", "Cf", "Zl", "Zp")


@pytest.fixture
def call(registry: Registry, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A call waiting for approval whose input and reason hold HOSTILE; the CLI acts as its
    owner."""
    add_tool(registry, "notes.create", http_method="POST", egress_class="write", schema_input={})
    registry.create_agent("bot")
    registry.assign("bot", "notes.create")
    made = registry.invoke("bot", "notes.create", {"text": HOSTILE, HOSTILE: 1}, reason=HOSTILE)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("TOOLRELAY_OWNER", str(registry.owner))
    context.database.cache_clear()
    yield str(made)
    context.database.cache_clear()


def raw_controls(text: str) -> list[str]:
    return [
        f"U+{ord(c):04X}"
        for c in text
        if c != "\n" and unicodedata.category(c) in NOT_ON_A_TERMINAL
    ]


@pytest.mark.parametrize(
    "args",
    [
        ("invocations", "show", "{call}"),  # JSON by default
        ("invocations", "show", "{call}", "-o", "jsonl"),
        ("invocations", "list", "-o", "json"),
        ("invocations", "list", "-o", "jsonl"),
    ],
)
def test_json_output_escapes_what_a_terminal_would_act_on(call: str, args: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [a.format(call=call) for a in args])
    assert result.exit_code == 0, result.output
    assert raw_controls(result.stdout) == []
    # Still the same JSON: a script reads the agent's text exactly as stored.
    lines = result.stdout.splitlines() if "jsonl" in args else [result.stdout]
    docs = [json.loads(line) for line in lines]
    [shown] = [d for doc in docs for d in doc.get("items", [doc]) if d["id"] == call]
    assert shown["reason"] == HOSTILE
    assert shown["input"] == {"text": HOSTILE, HOSTILE: 1}
