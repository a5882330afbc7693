"""The strict conversion (toolrelay.export.strict) on the shapes the OpenAPI corpus has that
it used to refuse or get wrong, each cut down from a real document: a strict form exists and
is exact (a call a model sends under strict mode, nulls for what it leaves out, is valid for
the strict schema and comes back from ``from_strict_call`` as a valid input for the tool's
own schema), or there is none and NotStrict says why."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.corpus.strict import strict_violations
from toolrelay.export.strict import NotStrict, from_strict_call, strict_schema


def tool(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    """A tool's schema_input as the importer writes it: a closed object at the root."""
    return {"type": "object", "properties": properties, "additionalProperties": False} | more


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    out = strict_schema(schema)
    assert strict_violations(out) == []
    Draft202012Validator.check_schema(out)
    return out


def round_trip(schema: dict[str, Any], sent: dict[str, Any], expected: dict[str, Any]) -> None:
    """``sent`` (a strict call) fits the strict form and comes back as ``expected``."""
    Draft202012Validator(strict(schema)).validate(sent)
    back = from_strict_call(schema, sent)
    assert back == expected
    Draft202012Validator(schema).validate(back)


# --- allOf -------------------------------------------------------------------------------------

# box.com: a Base schema extended through allOf
USER = tool(
    {
        "user": {
            "description": "The user to notify.",
            "allOf": [
                {"$ref": "#/$defs/User--Base"},
                {
                    "properties": {
                        "login": {"type": "string", "format": "email"},
                        "name": {"type": "string", "maxLength": 50},
                    }
                },
            ],
        }
    },
    **{
        "$defs": {
            "User--Base": {
                "type": "object",
                "required": ["id", "type"],
                "properties": {
                    "id": {"type": "string"},
                    "type": {"type": "string", "enum": ["user"]},
                },
            }
        }
    },
)


def test_an_allof_of_objects_is_merged_into_one() -> None:
    user = strict(USER)["properties"]["user"]
    assert user["type"] == ["object", "null"]  # optional: null = left out
    assert user["description"] == "The user to notify."
    assert list(user["properties"]) == ["id", "type", "login", "name"]
    assert user["required"] == ["id", "type", "login", "name"]
    assert user["properties"]["id"] == {"type": "string"}  # required in the base: not null
    assert user["properties"]["login"]["type"] == ["string", "null"]
    assert user["properties"]["name"]["description"] == "maxLength: 50"
    assert user["additionalProperties"] is False
    round_trip(
        USER,
        {"user": {"id": "1", "type": "user", "login": None, "name": "Ann"}},
        {"user": {"id": "1", "type": "user", "name": "Ann"}},
    )
    round_trip(USER, {"user": None}, {})


def test_an_allof_keeps_every_part_s_constraint() -> None:
    bounded = tool(
        {"n": {"allOf": [{"type": "number", "minimum": 1},
                         {"type": "integer", "minimum": 5, "maximum": 10}, {"maximum": 8}]},
         "kind": {"allOf": [{"type": "string", "enum": ["a", "b", "c"]}, {"enum": ["c", "b"]}]}},
        required=["n", "kind"],
    )  # fmt: skip
    props = strict(bounded)["properties"]
    assert props["n"] == {"type": "integer", "minimum": 5, "maximum": 8}
    assert props["kind"] == {"type": "string", "enum": ["b", "c"]}


@pytest.mark.parametrize(
    ("member", "why"),
    [
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "no value in common"),
        ({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}, "pattern"),
        ({"allOf": [{"type": "object"}, {"description": "Free-form."}]}, "free-form"),
        (
            {
                "allOf": [
                    {"type": "object", "additionalProperties": {"type": "string"}},
                    {"properties": {"x": {"type": "integer"}}},
                ]
            },
            "map",
        ),
    ],
)
def test_an_allof_without_an_exact_merge_is_not_strict(member: dict[str, Any], why: str) -> None:
    with pytest.raises(NotStrict, match=why):
        strict_schema(tool({"x": member}, required=["x"]))


def test_an_allof_of_one_ref_is_that_ref_even_inside_itself() -> None:
    # atlassian.com/jira writes {"allOf": [{"$ref": …}], "description": …} for every $ref
    node: dict[str, Any] = {"type": "object", "properties": {"name": {"type": "string"}, "parent": {
        "allOf": [{"$ref": "#/$defs/Node"}], "description": "The parent node."}}}  # fmt: skip
    schema = tool({"node": {"allOf": [{"$ref": "#/$defs/Node"}], "description": "A node."}},
                  required=["node"], **{"$defs": {"Node": node}})  # fmt: skip
    out = strict(schema)
    assert out["properties"]["node"]["description"] == "A node."  # spelt out, once
    assert out["properties"]["node"]["properties"]["parent"] == {
        "anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]  # inside itself: the $ref
    }
    round_trip(
        schema,
        {"node": {"name": "a", "parent": {"name": None, "parent": None}}},
        {"node": {"name": "a", "parent": {}}},
    )
    node["properties"]["parent"]["minProperties"] = 1  # more than annotations: no strict form
    with pytest.raises(NotStrict, match="inside itself"):
        strict_schema(schema)


def test_a_closed_part_forbids_the_members_it_does_not_have() -> None:
    # atlassian.com/jira: a closed object whose anyOf branches name members it forbids
    variable = {
        "type": "object",
        "properties": {"type": {"type": "string", "enum": ["issue", "user"]}},
        "required": ["type"],
        "additionalProperties": False,
        "anyOf": [
            {"type": "object", "properties": {"accountId": {"type": "string"},
                                              "type": {"type": "string"}},
             "required": ["accountId", "type"]},  # needs a forbidden member: no call fits
            {"type": "object", "properties": {"id": {"type": "integer"},
                                              "type": {"type": "string"}}},
        ],
    }  # fmt: skip
    schema = tool({"context": variable}, required=["context"])
    (branch,) = strict(schema)["properties"]["context"]["anyOf"]
    assert branch["properties"] == {"type": {"type": "string", "enum": ["issue", "user"]}}
    round_trip(schema, {"context": {"type": "issue"}}, {"context": {"type": "issue"}})


# --- keywords beside anyOf / oneOf ------------------------------------------------------------

# api.github.com repos/update-information-about-pages-site: which member is required, in anyOf
PAGES = tool(
    {
        "body": {
            "type": "object",
            "properties": {
                "cname": {"type": ["string", "null"]},
                "build_type": {"type": "string", "enum": ["legacy", "workflow"]},
                "source": {
                    "anyOf": [
                        {"type": "string"},
                        {
                            "type": "object",
                            "required": ["branch"],
                            "properties": {
                                "branch": {"type": "string"},
                                "path": {"type": "string"},
                            },
                        },
                    ]
                },
            },
            "anyOf": [
                {"required": ["build_type"]},
                {"required": ["source"]},
                {"required": ["public"]},
            ],  # public: not among the properties
        }
    },
    required=["body"],
)


def test_keywords_beside_an_anyof_go_into_each_branch() -> None:
    body = strict(PAGES)["properties"]["body"]
    assert set(body) == {"anyOf"}  # nothing beside it: every branch is the whole object
    by_build, by_source = body["anyOf"]  # the third needs `public`, which no call can send
    assert by_build["required"] == by_source["required"] == ["cname", "build_type", "source"]
    assert by_build["properties"]["build_type"]["type"] == "string"  # required here
    assert by_source["properties"]["build_type"]["type"] == ["string", "null"]
    assert by_build["properties"]["cname"] == {"type": ["string", "null"]}  # null as it was
    round_trip(
        PAGES,
        {"body": {"cname": "docs.example.com", "build_type": "legacy", "source": None}},
        {"body": {"cname": "docs.example.com", "build_type": "legacy"}},
    )
    round_trip(
        PAGES,
        {"body": {"cname": None, "build_type": None, "source": {"branch": "main", "path": None}}},
        {"body": {"cname": None, "source": {"branch": "main"}}},
    )


def test_a_discriminator_s_properties_beside_its_anyof() -> None:
    # @readme/oas-examples discriminators.json: before, additionalProperties false beside the
    # anyOf refused every branch's own members, so no strict call was valid
    option = {
        "type": "object",
        "required": ["discrim"],
        "properties": {"discrim": {"type": "string"}, "optionone": {"type": "number"}},
    }
    schema = tool(
        {"body": {"required": ["discrim"], "properties": {"discrim": {"enum": ["One", "Two"]}},
                  "anyOf": [{"$ref": "#/$defs/One"}, {"$ref": "#/$defs/Two"}]}},
        **{"$defs": {"One": option, "Two": option | {"title": "Two"}}},
    )  # fmt: skip
    body = strict(schema)["properties"]["body"]
    assert body["anyOf"][-1] == {"type": "null"}  # optional
    assert body["anyOf"][0]["properties"]["discrim"] == {"type": "string", "enum": ["One", "Two"]}
    round_trip(
        schema, {"body": {"discrim": "One", "optionone": None}}, {"body": {"discrim": "One"}}
    )


def test_anyof_and_oneof_side_by_side_is_not_strict() -> None:
    both = {"anyOf": [{"type": "string"}, {"type": "integer"}], "oneOf": [{"minimum": 1}]}
    with pytest.raises(NotStrict, match="side by side"):
        strict_schema(tool({"x": both}))


def test_a_required_member_without_a_schema_is_not_strict() -> None:
    # asana.com SectionRequest: `project` required, not among the properties; before, the
    # strict form forbade it, so no strict call was valid
    section = {"type": "object", "required": ["project", "name"],
               "properties": {"name": {"type": "string"}}}  # fmt: skip
    with pytest.raises(NotStrict, match="required member that is not among its properties"):
        strict_schema(tool({"data": section}))


def test_nulls_under_oneof_are_dropped_when_no_branch_takes_null() -> None:
    # api.github.com issues/add-labels: an object or an array; labels of strings or objects
    label = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "rationale": {"type": "string"}},
    }
    schema = tool({"body": {"oneOf": [
        {"type": "object", "properties": {"labels": {"type": "array", "minItems": 1,
                                                     "items": {"oneOf": [{"type": "string"}, label]}}}},
        {"type": "array", "items": {"type": "string"}},
    ]}})  # fmt: skip
    round_trip(schema, {"body": {"labels": None}}, {"body": {}})
    round_trip(
        schema,
        {"body": {"labels": ["bug", {"name": "p1", "rationale": None}]}},
        {"body": {"labels": ["bug", {"name": "p1"}]}},
    )
    round_trip(schema, {"body": ["bug"]}, {"body": ["bug"]})


# --- $ref --------------------------------------------------------------------------------------


def test_a_ref_whose_name_is_escaped_resolves() -> None:
    # openai.com: a $defs name with "/" in it, "~1" in the $ref (JSON Pointer)
    schema = tool(
        {"expand": {"$ref": "#/$defs/Req~1properties~1expand"}},
        **{"$defs": {"Req/properties/expand": {"type": "object", "properties": {
            "depth": {"type": "integer"}, "fields": {"type": "array", "items": {"type": "string"}}}}}},
    )  # fmt: skip
    assert strict(schema)["properties"]["expand"] == {
        "anyOf": [{"$ref": "#/$defs/Req~1properties~1expand"}, {"type": "null"}]
    }
    round_trip(schema, {"expand": None}, {})
    round_trip(schema, {"expand": {"depth": 2, "fields": None}}, {"expand": {"depth": 2}})


def test_a_nullable_ref_with_a_description_gets_no_second_null() -> None:
    # api.github.com code-scanning: tool_guid, a $ref to ["string", "null"] with a description
    schema = tool(
        {"tool_guid": {"$ref": "#/$defs/guid", "description": "The GUID of the tool."}},
        **{"$defs": {"guid": {"type": ["string", "null"]}}},
    )
    assert strict(schema)["properties"]["tool_guid"] == {
        "type": ["string", "null"],
        "description": "The GUID of the tool.",
    }
    round_trip(schema, {"tool_guid": None}, {"tool_guid": None})  # null is its own value
