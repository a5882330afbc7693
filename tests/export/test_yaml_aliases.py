"""YAML aliases in the files the CLI reads (`import openapi`, `tool apply`).

An alias names a node instead of copying it, so nine lines of nested aliases stand for a
billion values ("billion laughs"): PyYAML loads them in microseconds, and whatever walks the
document afterwards (the importer, json.dumps of a schema) runs for hours. An alias inside
the node it names makes a document that contains itself. Both are refused as they are read;
aliases that repeat a part, as API documents use them, still load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from toolrelay.errors import InvalidArgument
from toolrelay.export.openapi_load import MAX_EXPANDED_VALUES, load_openapi, load_yaml

OPERATION = """\
paths:
  /x:
    post:
      operationId: x
      requestBody:
        content:
          application/json:
            schema: {schema}
      responses: {{'200': {{description: ok}}}}
"""


def laughs(levels: int) -> str:
    """Anchors l0..l{levels-1}, each a list of ten of the one before: 10**levels values."""
    lines = ["  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines)


def bomb(levels: int = 9) -> str:
    schema = f"{{type: object, properties: {{a: {{type: array, example: *l{levels - 1}}}}}}}"
    return (
        f"openapi: 3.0.3\ninfo: {{title: bomb, version: '1'}}\nx-laughs:\n{laughs(levels)}\n"
        + OPERATION.format(schema=schema)
    )


LOOP = """\
openapi: 3.0.3
info: {title: loop, version: '1'}
x-schemas:
  node: &node
    type: object
    properties:
      child: *node
""" + OPERATION.format(schema="*node")


def test_a_document_whose_aliases_multiply_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    assert len(path.read_bytes()) < 1_000  # a billion values in under a kilobyte
    with pytest.raises(InvalidArgument) as raised:
        load_openapi(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: its YAML aliases make it stand for more than")
    assert f"{MAX_EXPANDED_VALUES:,} values" in message


def test_a_document_that_contains_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text(LOOP)
    with pytest.raises(InvalidArgument, match="a YAML alias refers to a node that contains it"):
        load_openapi(path)


def test_aliases_that_repeat_a_part_still_load(tmp_path: Path) -> None:
    # Below the bound however they nest (10**6 values), and the same as written out.
    path = tmp_path / "anchors.yaml"
    path.write_text(bomb(levels=6))
    doc = load_openapi(path)
    assert len(doc["x-laughs"]["l5"]) == 10 and doc["x-laughs"]["l5"][0][0][0][0][0] == ["lol"] * 10
    shared = load_yaml("a: &x {k: v}\nb: *x\nc: [*x, *x]\n", "inline")
    assert shared == {"a": {"k": "v"}, "b": {"k": "v"}, "c": [{"k": "v"}, {"k": "v"}]}


def test_scalars_and_empty_documents_pass_the_count() -> None:
    assert load_yaml("", "empty") is None
    assert load_yaml("just text", "scalar") == "just text"
    assert load_yaml("[[], {}]", "empties") == [[], {}]


TOOLS_LOOP = """\
tools:
  - key: loop.tool
    name: Loop
    endpoint_url: https://api.example.com/x
    http_method: POST
    schema_input: &s
      type: object
      properties: {self: *s}
"""


def tools_bomb() -> str:
    return f"x-laughs:\n{laughs(9)}\n" + TOOLS_LOOP.replace(
        "&s\n      type: object\n      properties: {self: *s}", "{type: object, examples: [*l8]}"
    )


@pytest.mark.parametrize(
    ("argv", "text", "message"),
    [
        (["import", "openapi", "--dry-run"], bomb(), "its YAML aliases make it stand for more"),
        (["import", "openapi", "--dry-run"], LOOP, "a YAML alias refers to a node that contains"),
        (["tool", "apply"], tools_bomb(), "its YAML aliases make it stand for more"),
        (["tool", "apply"], TOOLS_LOOP, "a YAML alias refers to a node that contains"),
    ],
    ids=["import-bomb", "import-loop", "apply-bomb", "apply-loop"],
)
def test_the_cli_says_so_in_one_line_and_writes_nothing(
    argv: list[str], text: str, message: str, tmp_path: Path, database_url: str
) -> None:
    # Its own process, so that a CLI walking a billion values fails here (the timeout)
    # instead of hanging the suite. Before the check: the import ran for hours, and
    # `tool apply` of the loop ended in "unexpected error (a bug): RecursionError".
    path = tmp_path / "file.yaml"
    path.write_text(text)
    env = os.environ | {"DATABASE_URL": database_url, "TOOLRELAY_OWNER": str(uuid.uuid4())}
    done = subprocess.run(
        [sys.executable, "-m", "toolrelay.cli", *argv, str(path)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        next(line for line in done.stderr.splitlines() if line.startswith(f"error: {path}: "))
    ]
    assert message in done.stderr
    with psycopg.connect(database_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM agents.tools_registry WHERE owner = %s", (env["TOOLRELAY_OWNER"],)
        ).fetchone() == (0,)
