"""Schema keywords that carry URIs, under random URIs: refused or accepted, never fetched.

``$ref``, ``$id``, ``$dynamicRef``, ``$recursiveRef``, ``$schema``, ``$anchor`` and
``$dynamicAnchor``, at the root and nested in properties, items, allOf, $defs and places no
keyword applies, hold http/https/file/ftp/relative/odd URIs — many pointing at a counting
loopback server or at a file on disk. For every schema, ``check_json_schema`` accepts it or
refuses it with InvalidArgument, the validator agrees, and checking values against it opens
no socket and no file (an audit hook records ``socket.connect``, ``urllib.Request``,
``open``, ...) while the server counts no request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.fuzz.strategies import json_values
from tests.security.tripwires import CountingServer, io_events
from toolrelay.errors import InvalidArgument, InvalidInput
from toolrelay.registry.validation import check_json_schema, validate_input, validator

MARKER = "MARKER-fuzzed-schema-file"
# No database: every example is cheap, so many more of them.
URI_FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KNOWN_DRAFTS = [
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema#",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-04/schema#",
    "http://json-schema.org/draft-03/schema#",
]
REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
NAMES = ("$anchor", "$dynamicAnchor")


@dataclass(frozen=True)
class Targets:
    counter: CountingServer
    path: Path


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Targets]:
    path = tmp_path_factory.mktemp("schema-fuzz") / "schema.json"
    path.write_text(json.dumps({"const": MARKER, "$defs": {"a": {"const": MARKER}}}))
    counter = CountingServer()
    # Warm up every code path once, so what the audit hook sees is the schema's doing and
    # not a first import.
    warm = {"$id": "https://x.example/", "$defs": {"a": {"$anchor": "a", "pattern": "^a"}},
            "properties": {"p": {"$ref": "#a"}, "q": {"$dynamicRef": "#/$defs/a"}},
            "patternProperties": {"^z": {}}, "unevaluatedProperties": False}  # fmt: skip
    check_json_schema("schema_input", warm)
    list(validator(warm).iter_errors({"p": "a", "q": "b", "z": 1, "r": 2}))
    yield Targets(counter, path)
    counter.close()


@st.composite
def uris(draw: st.DrawFn, t: Targets) -> str:
    base = t.counter.base_url
    host = base.removeprefix("http://")
    file_uri = t.path.as_uri()
    directory = f"{t.path.parent.as_uri()}/"
    fixed = [
        f"{base}/s.json", f"{base}/s.json#/definitions/a", f"{base}/#a", f"{base}/",
        f"https://{host}/s.json", f"//{host}/s.json", f"ftp://{host}/s.json",
        f"HTTP://{host.upper()}/S.JSON", f"http://localhost:{host.rsplit(':', 1)[1]}/s.json",
        file_uri, f"{file_uri}#/const", f"{file_uri}#/$defs/a", f"file://localhost{t.path}",
        f"file:{t.path}", str(t.path), directory, t.path.name, f"./{t.path.name}",
        f"../{t.path.parent.name}/{t.path.name}",
        "#", "#/", "#/$defs/a", "#/definitions/a", "#/properties/a", "#/items", "#/allOf/0",
        "#/x-lib", "#/const", "#a", "#node", "#/%24defs/a", "#/$defs/a/$ref", "#%25",
        "", ".", "..", "?x", "s.json", "a.json", "urn:uuid:00000000-0000-0000-0000-000000000000",
        "urn:x:y", "tag:example.com,2026:x", "data:application/json,{}", "http://[::1",
        "http://127.0.0.1:0/", "\\\\host\\share\\s.json", "jar:file:///x!/y", " http://x/",
        "http://a b/", "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2020-12/meta/core", "mailto:a@example.com",
        *KNOWN_DRAFTS,
    ]  # fmt: skip
    prefixes = [base + "/", "https://", "file:///", "ftp://", "#/", "#", "", "//"]
    return draw(
        st.one_of(
            st.sampled_from(fixed),
            st.builds(str.__add__, st.sampled_from(prefixes), st.text(max_size=12)),
            st.text(max_size=16),
        )
    )


def uri_keywords(uri: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Some of the URI-carrying keywords, most with a URI, now and then any JSON value."""
    anchors = st.one_of(st.sampled_from(["a", "node", "meta", "x.y-z"]), uri)
    # one in ten not a string at all
    odd = st.tuples(st.integers(0, 9), uri, json_values).map(lambda d: d[2] if d[0] == 7 else d[1])
    values = {k: odd for k in REFERENCES}
    values |= {"$id": odd, "$recursiveAnchor": st.booleans()}
    values |= {k: anchors for k in NAMES}
    # $schema now and then below the root too (it is refused there), more often at the root
    nested_dialect = st.tuples(st.integers(0, 19), dialects(uri)).map(
        lambda drawn: {"$schema": drawn[1]} if drawn[0] == 7 else {}
    )
    return st.builds(dict.__or__, st.fixed_dictionaries({}, optional=values), nested_dialect)


def dialects(uri: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(KNOWN_DRAFTS), st.sampled_from(KNOWN_DRAFTS), uri)


@cache
def schemas(t: Targets) -> st.SearchStrategy[dict[str, Any]]:
    uri = uris(t)
    plain = st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["string", "object", "array", "integer"]),
            "pattern": st.sampled_from(["^a", "b$", "^(a+)+$"]),
            "const": json_values,
        },
    )
    leaf = st.builds(dict.__or__, plain, uri_keywords(uri))

    def nested(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        names = st.sampled_from(["a", "b", "$ref", "$id"])
        children = st.fixed_dictionaries(
            {},
            optional={
                "properties": st.dictionaries(names, inner, max_size=2),
                "items": inner,
                "allOf": st.lists(inner, max_size=2),
                "anyOf": st.lists(inner, max_size=2),
                "not": inner,
                "additionalProperties": inner,
                "$defs": st.dictionaries(names, inner, max_size=2),
                "definitions": st.dictionaries(names, inner, max_size=2),
                "x-lib": inner,  # no keyword applies here, but a pointer can lead here
                "default": inner,  # an annotation: data, never a schema
            },
        )
        return st.builds(dict.__or__, leaf, children)

    root_dialect = st.fixed_dictionaries({}, optional={"$schema": dialects(uri)})
    return st.builds(dict.__or__, st.recursive(leaf, nested, max_leaves=8), root_dialect)


_shaped = st.fixed_dictionaries(
    {}, optional={"a": json_values, "b": json_values, "$ref": json_values}
)
values = st.one_of(json_values, _shaped, st.lists(_shaped, max_size=2), st.just("a" * 30 + "!"))


@URI_FUZZ
@given(data=st.data())
def test_uri_keywords_are_refused_or_applied_and_never_reach_outside(
    targets: Targets, data: st.DataObject
) -> None:
    schema = data.draw(schemas(targets), label="schema")
    checked = data.draw(st.lists(values, min_size=1, max_size=3), label="values")
    message = None
    with io_events() as events:
        try:
            check_json_schema("schema_input", schema)
        except InvalidArgument as exc:
            message = exc.message
        compiled = validator(schema)
        for value in checked:
            list(compiled.iter_errors(value))
            compiled.is_valid(value)
            try:
                validate_input(schema, value)
            except InvalidInput as exc:
                assert MARKER not in exc.message
    assert events == [], events
    assert targets.counter.requests == []
    # registration and every validation site agree on what may be used
    assert (compiled.refusal is None) == (message is None), (message, compiled.refusal)
    if message is not None:
        assert message.startswith("schema_input ")
        assert MARKER not in message
    event("accepted" if message is None else refusal_kind(message))


def refusal_kind(message: str) -> str:
    for kind in ("outside the schema", "does not resolve", "unknown $schema", "only allowed at",
                 "only '#'", "must be a string", "not a valid JSON Schema", "pattern"):  # fmt: skip
        if kind in message:
            return f"refused: {kind}"
    return f"refused: {message}"
