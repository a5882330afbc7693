"""Tests for the request template language (toolrelay.dispatch.template)."""

from __future__ import annotations

import json
import math
import os
from typing import Any
from unittest import mock
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from toolrelay.dispatch.template import (
    RenderedRequest,
    render_request,
    uses_input_placeholders,
    validate_template,
)
from toolrelay.errors import TemplateError

BASE = "https://api.example.com"


def render(
    template: dict[str, Any],
    input: dict[str, Any],
    method: str = "POST",
    url: str = f"{BASE}/v1/things",
    **auth: str,
) -> RenderedRequest:
    return render_request(url, method, template, input, "inv-123", **auth)


def render_error(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(TemplateError) as caught:
        render(*args, **kwargs)
    assert caught.value.code == "template_error"
    return caught.value.message


def validate_error(
    template: Any, url: str | None = f"{BASE}/x", method: str = "POST", **auth: str
) -> str:
    with pytest.raises(TemplateError) as caught:
        validate_template(url, method, template, **auth)
    return caught.value.message


# --- placeholders in the body -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [{"k": [1, {"z": None}]}, [1, "two", 3.5], 42, 2.5, True, False, None, "text"]
)
def test_whole_placeholder_keeps_type(value: Any) -> None:
    body = render({"body": {"v": "{{input.v}}"}}, {"v": value}).body
    assert body == {"v": value}
    assert type(body["v"]) is type(value)


def test_whole_placeholder_in_array_and_at_top_level() -> None:
    request = render({"body": ["{{input.a}}", "{{invocation.id}}"]}, {"a": {"x": 1}})
    assert request.body == [{"x": 1}, "inv-123"]
    assert render({"body": "{{input.a}}"}, {"a": [1, 2]}).body == [1, 2]


def test_whitespace_inside_braces_is_allowed() -> None:
    body = render({"body": {"v": "{{ input.a.b }}", "w": "<{{\tinput.a.b\t}}>"}}, {"a": {"b": 1}})
    assert body.body == {"v": 1, "w": "<1>"}


def test_paths_with_dots_indexes_dashes_and_underscores() -> None:
    source = {"my-list": [[0, {"_x": "deep"}]]}
    body = render({"body": {"v": "{{input.my-list[0][1]._x}}"}}, source).body
    assert body == {"v": "deep"}


def test_missing_path_omits_object_member() -> None:
    template = {"body": {"keep": 1, "gone": "{{input.nope}}", "nested": {"x": "{{input.a.b.c}}"}}}
    assert render(template, {"a": {"b": 5}}).body == {"keep": 1, "nested": {}}


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("input.items[2]", {"items": [1, 2]}),
        ("input.items[0]", {"items": {"0": 1}}),
        ("input.a.b", {"a": "not an object"}),
        ("input.a.b", {"a": None}),
    ],
)
def test_paths_that_cannot_be_followed_are_missing(path: str, source: dict[str, Any]) -> None:
    assert render({"body": {"v": "{{" + path + "}}"}}, source).body == {}


def test_missing_whole_body_means_no_body() -> None:
    assert render({"body": "{{input.payload}}"}, {"other": 1}).body is None


def test_missing_path_in_array_is_an_error() -> None:
    message = render_error({"body": {"items": [1, "{{input.nope}}"]}}, {"a": 1})
    assert message.startswith("body.items[1]: placeholder {{input.nope}}")
    assert "missing" in message


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("raw text", "raw text"),
        (7, "7"),
        (-1.5, "-1.5"),
        (True, "true"),
        (False, "false"),
        (None, "null"),
    ],
)
def test_inline_placeholder_inserts_text(value: Any, text: str) -> None:
    body = render({"body": {"v": "id={{input.v}};"}}, {"v": value}).body
    assert body == {"v": f"id={text};"}


def test_inline_placeholder_referring_to_object_names_path() -> None:
    template = {"body": {"posts": [{"value": "x {{input.x}}"}]}}
    message = render_error(template, {"x": {"a": 1}})
    assert message == (
        "body.posts[0].value: placeholder {{input.x}} inside a string refers to an object"
    )


def test_inline_placeholder_referring_to_array_or_missing_is_an_error() -> None:
    assert "refers to an array" in render_error({"body": {"v": "a{{input.x}}"}}, {"x": [1]})
    message = render_error({"body": {"v": "a{{input.x}}"}}, {})
    assert (
        message == "body.v: placeholder {{input.x}} inside a string refers to a missing input path"
    )


def test_substituted_text_is_not_expanded_again() -> None:
    source = {"a": "{{invocation.id}}", "b": {"k": "{{input.a}}"}}
    body = render({"body": {"x": "<{{input.a}}>", "y": "{{input.b}}"}}, source).body
    assert body == {"x": "<{{invocation.id}}>", "y": {"k": "{{input.a}}"}}


def test_rendered_body_does_not_alias_input() -> None:
    source: dict[str, Any] = {"a": {"list": [1]}}
    body = render({"body": {"v": "{{input.a}}"}}, source).body
    source["a"]["list"].append(2)
    assert body == {"v": {"list": [1]}}


def test_keys_with_odd_characters_are_named_in_brackets() -> None:
    message = render_error({"body": {"a key": ["{{input.x}}"]}}, {})
    assert message.startswith('body["a key"][0]:')


# --- placeholder syntax -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "{{env.HOME}}",
        "{{secrets.token}}",
        "{{input}}",
        "{{invocation}}",
        "{{invocation.user}}",
        "{{input.a | upper}}",
        "{{input.a + 1}}",
        "{{ }}",
        "{{input.a[-1]}}",
        "{{input.a[01]}}",
        "{{input[0]}}",
        "{{input.1a}}",
        "{{input..a}}",
        "{{input.a.}}",
        "{{{input.a}}}",
        "x {{input.a",
        "{{input.a} }",
        "{{input.a\n}}",
        "{{ Input.a }}",
    ],
)
def test_malformed_placeholders_are_rejected_at_validation(text: str) -> None:
    message = validate_error({"body": {"field": ["ok", text]}})
    assert message.startswith("body.field[1]: ")


def test_lone_closing_braces_are_literal_text() -> None:
    assert render({"body": {"v": "a }} b"}}, {}).body == {"v": "a }} b"}


def test_placeholder_in_body_key_is_an_error() -> None:
    message = validate_error({"body": {"outer": {"{{input.k}}": 1}}})
    assert message.startswith("body.outer: key '{{input.k}}' contains a placeholder")


def test_uses_input_placeholders() -> None:
    assert uses_input_placeholders(f"{BASE}/u/{{{{input.id}}}}", {})
    assert uses_input_placeholders(None, {"body": {"a": ["x {{ input.a }}"]}})
    assert uses_input_placeholders(None, {"headers": {"X-A": "{{input.a}}"}})
    assert not uses_input_placeholders(f"{BASE}/x", {"body": {"id": "{{invocation.id}}"}})
    assert not uses_input_placeholders(None, {"body": {"{{input.key}}": "input.a"}})


# --- template shape and method ----------------------------------------------------------------


def test_valid_template_passes_validation() -> None:
    template = {
        "headers": {"X-Trace": "{{invocation.id}}", "Accept": "application/json"},
        "query": {"limit": 10, "ratio": 0.5, "flag": True, "none": None, "q": "{{input.q}}"},
        "body": {"items": ["{{input.items[0]}}"], "n": None},
    }
    validate_template(f"{BASE}/v1/{{{{input.id}}}}?x={{{{input.x}}}}", "post", template)
    validate_template(None, "GET", {})


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ({"headers": {}, "extra": 1}, "request_template: unknown member 'extra'"),
        ([], "request_template: must be a JSON object"),
        ({"headers": ["X-A"]}, "headers: must be an object of strings"),
        ({"headers": {"X-A": 1}}, "headers.X-A: must be a string"),
        ({"headers": {"X-A": None}}, "headers.X-A: must be a string"),
        ({"query": "a=1"}, "query: must be an object"),
        ({"query": {"a": {"b": 1}}}, "query.a: must be a string, number, boolean or null"),
        ({"query": {"a": [1]}}, "query.a: must be a string, number, boolean or null"),
        ({"query": {"": "x"}}, "query: parameter name must not be empty"),
        ({"query": {"{{input.k}}": "x"}}, "query: key '{{input.k}}' contains a placeholder"),
        ({"body": {"v": {1, 2}}}, "body.v: a value that is not JSON"),
        ({"body": {"v": math.nan}}, "body.v: a value that is not JSON"),
    ],
)
def test_template_shape_errors(template: Any, expected: str) -> None:
    assert validate_error(template).startswith(expected)


def test_method_is_checked_and_upper_cased() -> None:
    assert render({}, {}, method="patch").method == "PATCH"
    for method in ("HEAD", "OPTIONS", "", "GET "):
        assert validate_error({}, method=method).startswith("http_method:")


# --- endpoint URL -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/relative/path", "must be an absolute http or https URL"),
        ("ftp://api.example.com/x", "scheme must be http or https"),
        ("http:///x", "must have a host"),
        ("https://api.example.com:99999/", "host or port is malformed"),
        ("https://api.example.com:0/", "port must be between 1 and 65535"),
        ("https://api.example.com/x#frag", "must not have a fragment"),
        ("https://api.example.com/a b", "must be percent-encoded"),
        ("https://api.example.com/é", "must be percent-encoded"),
        ("https://api.example.com/a%zz", "'%' is not followed by two hex digits"),
        ("https://api.example.com/a/../b", "dot-segment '..' is not allowed"),
        ("https://api.example.com/a/%2e/b", "dot-segment '%2e' is not allowed"),
        ("", "must be a non-empty string"),
    ],
)
def test_bad_endpoint_urls(url: str, expected: str) -> None:
    message = validate_error({}, url=url)
    assert message.startswith("endpoint_url")
    assert expected in message


@pytest.mark.parametrize(
    "url",
    [
        "{{input.scheme}}://api.example.com/x",
        "https://{{input.host}}/x",
        "https://api.{{input.host}}.com/x",
        "https://api.example.com{{input.path}}",
        "https://api.example.com:{{input.port}}/x",
        "https://{{input.user}}@api.example.com/x",
        "https://user:{{input.password}}@api.example.com/x",
    ],
)
def test_placeholders_outside_path_and_query_are_rejected(url: str) -> None:
    message = validate_error({}, url=url)
    assert "not in the scheme, user info, host or port" in message


def test_url_placeholder_must_be_well_formed() -> None:
    assert validate_error({}, url=f"{BASE}/{{{{env.HOME}}}}").startswith("endpoint_url: ")


@pytest.mark.parametrize(
    ("value", "segment"),
    [
        ("a/b", "a%2Fb"),
        ("a?b", "a%3Fb"),
        ("a#b", "a%23b"),
        ("100%", "100%25"),
        ("../../admin", "..%2F..%2Fadmin"),
        ("@evil.com:80", "%40evil.com%3A80"),
        ("sp ace+plus", "sp%20ace%2Bplus"),
        ("é", "%C3%A9"),
        ("a\r\nb", "a%0D%0Ab"),
        ("~safe-._", "~safe-._"),
        (12, "12"),
        (True, "true"),
        (None, "null"),
    ],
)
def test_path_values_are_percent_encoded_as_one_segment(value: Any, segment: str) -> None:
    url = render({}, {"v": value}, url=f"{BASE}/users/{{{{input.v}}}}/posts").url
    assert url == f"{BASE}/users/{segment}/posts"


@pytest.mark.parametrize(
    ("url", "value"),
    [
        ("/files/{{input.v}}", ".."),
        ("/files/{{input.v}}", "."),
        ("/files/{{input.v}}/x", ""),
        ("/files/.{{input.v}}", "."),
        ("/files/%2e{{input.v}}", "."),
    ],
)
def test_dot_and_empty_segments_are_errors(url: str, value: str) -> None:
    message = render_error({}, {"v": value}, url=BASE + url)
    assert message.startswith("endpoint_url path: segment")


def test_dots_inside_a_longer_segment_are_fine() -> None:
    url = render({}, {"v": ".."}, url=f"{BASE}/files/{{{{input.v}}}}.txt").url
    assert url == f"{BASE}/files/...txt"


def test_path_placeholder_errors() -> None:
    url = f"{BASE}/u/{{{{input.v}}}}"
    assert "refers to a missing input path" in render_error({}, {}, url=url)
    assert "in the URL path refers to an object" in render_error({}, {"v": {}}, url=url)


def test_url_query_placeholders() -> None:
    url = f"{BASE}/search?q={{{{input.q}}}}&tag=x-{{{{input.t}}}}&lit=a%20b&flag"
    rendered = render({}, {"q": "a&b=c#d+e", "t": 5}, url=url).url
    assert rendered == f"{BASE}/search?q=a%26b%3Dc%23d%2Be&tag=x-5&lit=a%20b&flag"


def test_url_query_missing_whole_value_is_omitted_but_inline_is_an_error() -> None:
    url = f"{BASE}/s?q={{{{input.q}}}}&n={{{{input.n}}}}&k=1"
    assert render({}, {"n": None}, url=url).url == f"{BASE}/s?k=1"
    message = render_error({}, {}, url=f"{BASE}/s?q=x{{{{input.q}}}}")
    assert message.startswith("endpoint_url query 'q': placeholder {{input.q}}")
    assert "refers to an array" in render_error({}, {"q": [1]}, url=f"{BASE}/s?q={{{{input.q}}}}")


def test_url_query_parameter_names_are_not_templated() -> None:
    message = validate_error({}, url=f"{BASE}/s?{{{{input.k}}}}=1")
    assert "names are not templated" in message


def test_registered_port_and_userinfo_are_kept() -> None:
    url = "https://user@API.example.com:8443/a/{{input.v}}"
    assert render({}, {"v": "b"}, url=url).url == "https://user@API.example.com:8443/a/b"
    assert render({}, {}, url=BASE, method="GET").url == f"{BASE}/"


# --- query ------------------------------------------------------------------------------------


def test_template_query_values_render_as_text() -> None:
    template = {
        "query": {
            "limit": 10,
            "ratio": 0.5,
            "flag": False,
            "literal_null": None,
            "q": "{{input.q}}",
            "n": "{{input.n}}",
            "gone": "{{input.nope}}",
            "null": "{{input.z}}",
            "mixed": "p{{input.n}}-{{input.z}}",
            "a b": "x&y",
        }
    }
    source = {"q": "hello world/?#", "n": 3, "z": None, "other": 1}
    url = render(template, source, method="GET").url
    query = "limit=10&ratio=0.5&flag=false&q=hello%20world%2F%3F%23&n=3&mixed=p3-null&a%20b=x%26y"
    assert url == f"{BASE}/v1/things?{query}"


def test_query_placeholder_to_object_is_an_error() -> None:
    message = render_error({"query": {"q": "{{input.q}}"}, "body": {}}, {"q": {"a": 1}})
    assert message == "query.q: placeholder {{input.q}} in a query value refers to an object"


def test_url_query_comes_before_template_query() -> None:
    url = render({"query": {"b": "2"}}, {}, url=f"{BASE}/x?a=1", method="GET").url
    assert url == f"{BASE}/x?a=1&b=2"


# --- headers ----------------------------------------------------------------------------------


def test_headers_render() -> None:
    template = {
        "headers": {
            "X-Trace": "{{invocation.id}}",
            "X-User": "user-{{input.user.id}}",
            "X-Count": "{{input.n}}",
            "X-Gone": "{{input.nope}}",
            "Accept": "application/json",
        }
    }
    request = render(template, {"user": {"id": 9}, "n": 2})
    assert request.headers == {
        "X-Trace": "inv-123",
        "X-User": "user-9",
        "X-Count": "2",
        "Accept": "application/json",
    }


@pytest.mark.parametrize("bad", ["a\rb", "a\nb", "a\r\nX-Injected: 1", "a\x00b", "\x7f"])
def test_header_values_with_cr_lf_nul_are_rejected(bad: str) -> None:
    template = {"headers": {"X-Key": "key {{input.v}}"}}
    message = render_error(template, {"v": bad})
    assert message.startswith("headers.X-Key: value contains CR, LF, NUL")
    assert bad not in message


def test_literal_control_characters_in_headers_are_rejected_at_validation() -> None:
    message = validate_error({"headers": {"X-A": "a\r\nB: c"}})
    assert message.startswith("headers.X-A: contains CR, LF, NUL")


def test_header_placeholder_to_object_is_an_error() -> None:
    message = render_error({"headers": {"X-A": "{{input.v}}"}}, {"v": [1]})
    assert message == "headers.X-A: placeholder {{input.v}} in a header value refers to an array"


@pytest.mark.parametrize(
    "name", ["Host", "host", "Content-Length", "TRANSFER-ENCODING", "connection"]
)
def test_forbidden_headers(name: str) -> None:
    message = validate_error({"headers": {name: "x"}})
    assert message.startswith(f"headers.{name}: set by the HTTP client")


@pytest.mark.parametrize("name", ["Authorization", "authorization", "AUTHORIZATION"])
def test_auth_header_cannot_be_set(name: str) -> None:
    message = validate_error({"headers": {name: "Bearer {{input.token}}"}})
    assert message.startswith(f"headers.{name}: is the tool's auth header")


def test_custom_auth_header_name_is_protected() -> None:
    auth = {"auth_placement": "header", "auth_param_name": "X-Api-Key"}
    assert "auth header" in validate_error({"headers": {"x-api-key": "k"}}, **auth)
    validate_template(f"{BASE}/x", "GET", {"headers": {"Authorization": "x"}}, **auth)


@pytest.mark.parametrize("name", ["", "X A", "X:A", "Ä", "X-{{input.h}}", "a\r\nb"])
def test_header_names_must_be_tokens(name: str) -> None:
    assert validate_error({"headers": {name: "x"}}).startswith("headers: ")


def test_duplicate_header_names_are_rejected() -> None:
    message = validate_error({"headers": {"X-A": "1", "x-a": "2"}})
    assert message == "headers.x-a: header is set twice (names ignore case)"


# --- auth parameter in the query ---------------------------------------------------------------

QUERY_AUTH = {"auth_placement": "query", "auth_param_name": "api_key"}


@pytest.mark.parametrize("name", ["api_key", "API_KEY"])
def test_template_query_cannot_set_query_auth_param(name: str) -> None:
    message = validate_error({"query": {name: "{{input.k}}"}}, **QUERY_AUTH)
    assert message.startswith(f"query.{name}: is the tool's auth parameter")


@pytest.mark.parametrize(
    "query", ["api_key=x", "a=1&API_KEY={{input.k}}", "api%5Fkey=1", "api_key"]
)
def test_endpoint_url_cannot_set_query_auth_param(query: str) -> None:
    message = validate_error({}, url=f"{BASE}/x?{query}", **QUERY_AUTH)
    assert message.startswith("endpoint_url query:")
    assert "auth parameter" in message


def test_merged_input_cannot_set_query_auth_param() -> None:
    message = render_error({}, {"q": "x", "Api_Key": "stolen"}, method="GET", **QUERY_AUTH)
    assert message == "input.Api_Key: would set the tool's auth query parameter"
    # Members that would not become parameters are ignored as usual.
    request = render({}, {"api_key": {"nested": 1}, "q": "x"}, method="GET", **QUERY_AUTH)
    assert request.url == f"{BASE}/v1/things?q=x"


def test_query_auth_leaves_headers_and_header_auth_leaves_query() -> None:
    validate_template(f"{BASE}/x", "GET", {"headers": {"Authorization": "x"}}, **QUERY_AUTH)
    validate_template(f"{BASE}/x?Authorization=1", "GET", {"query": {"authorization": "x"}})


# --- input merge ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_merge_into_body_when_no_input_placeholders(method: str) -> None:
    template = {"body": {"a": {"keep": 1, "over": 1}, "list": [1, 2], "id": "{{invocation.id}}"}}
    source = {"a": {"over": 2, "new": 3}, "list": [9], "extra": None}
    body = render(template, source, method=method).body
    assert body == {
        "a": {"keep": 1, "over": 2, "new": 3},
        "list": [9],
        "id": "inv-123",
        "extra": None,
    }


def test_merge_without_body_sends_input_and_replaces_non_object_body() -> None:
    assert render({}, {"x": 1}).body == {"x": 1}
    assert render({}, {}).body == {}
    assert render({"body": [1, 2]}, {"x": 1}).body == {"x": 1}
    assert render({"body": {"a": [1]}}, {"a": {"b": 2}}).body == {"a": {"b": 2}}


def test_no_merge_when_any_input_placeholder_is_used() -> None:
    assert render({"body": {"a": 1}}, {"x": 1}, url=f"{BASE}/{{{{input.x}}}}").body == {"a": 1}
    assert render({"headers": {"X-A": "{{input.x}}"}}, {"x": 1}).body is None
    request = render({"query": {"q": "{{input.q}}"}}, {"q": "s", "x": 1}, method="GET")
    assert request.url == f"{BASE}/v1/things?q=s"


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_merge_into_query_for_get_and_delete(method: str) -> None:
    source = {
        "q": "a b&c",
        "n": 5,
        "f": 1.5,
        "t": True,
        "no": False,
        "z": None,
        "obj": {},
        "l": [1],
    }
    request = render({}, source, method=method)
    assert request.url == f"{BASE}/v1/things?q=a%20b%26c&n=5&f=1.5&t=true&no=false"
    assert request.body is None
    assert request.method == method


def test_merged_input_wins_over_template_and_url_query() -> None:
    request = render(
        {"query": {"limit": 10, "sort": "asc"}},
        {"limit": 5, "x y": "1"},
        method="GET",
        url=f"{BASE}/s?limit=1&keep=1",
    )
    assert request.url == f"{BASE}/s?keep=1&sort=asc&limit=5&x%20y=1"


def test_get_with_template_body_sends_it() -> None:
    request = render({"body": {"id": "{{invocation.id}}"}}, {"q": 1}, method="GET")
    assert request.body == {"id": "inv-123"}
    assert request.url == f"{BASE}/v1/things?q=1"


# --- robustness -------------------------------------------------------------------------------


def test_non_json_input_values_are_template_errors() -> None:
    assert "cannot be rendered" in render_error({"body": {"v": "{{input.v}}"}}, {"v": {1, 2}})
    assert "cannot be rendered" in render_error({}, {"v": math.inf})
    assert "refers to a value that is not JSON" in render_error(
        {"body": {"v": "a{{input.v}}"}}, {"v": b"x"}
    )
    message = render_error({}, {"v": object()}, method="GET")
    assert message.startswith("input.v: a value that is not JSON")


def test_lone_surrogates_cannot_reach_url_or_headers() -> None:
    message = render_error({}, {"v": "\ud800"}, url=f"{BASE}/{{{{input.v}}}}")
    assert message == "endpoint_url path: value is not valid Unicode text"
    message = render_error({"headers": {"X-A": "{{input.v}}"}}, {"v": "\udfff"})
    assert message == "headers.X-A: value is not valid Unicode text"


def test_deeply_nested_input_is_a_template_error() -> None:
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert "nested too deeply" in render_error({"body": {"v": "{{input.v}}"}}, {"v": deep})


def test_input_must_be_an_object() -> None:
    with pytest.raises(TemplateError, match="input: must be a JSON object"):
        render_request(f"{BASE}/x", "POST", {}, [1], "i")  # type: ignore[arg-type]


# --- property tests ---------------------------------------------------------------------------

NASTY = ["/", "?", "#", "@", ":", "\r", "\n", "\r\n", "%", "%2e", "..", ".", "", " ", "&", "=", "+"]
NASTY += ["{{invocation.id}}", "{{input.a}}", "http://evil.com", "\\", "\x00", "é", "\u2028"]
texts = st.one_of(
    st.text(),
    st.sampled_from(NASTY),
    st.lists(st.sampled_from([*NASTY, "a", "evil.com"]), max_size=6).map("".join),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), texts
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
inputs = st.dictionaries(texts, json_values, max_size=4).flatmap(
    lambda extra: st.fixed_dictionaries(
        {name: scalars | json_values for name in ("a", "b", "c", "d")},
        optional={"e": scalars, "f": json_values},
    ).map(lambda fixed: {**extra, **fixed})
)
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

URL_TEMPLATE = (
    "https://api.example.com:8443/v1/{{input.a}}/x{{input.b}}y/{{ input.c }}"
    "?q={{input.d}}&lit=1&inline=pre-{{input.a}}"
)
FULL_TEMPLATE = {
    "headers": {"X-A": "{{input.a}}", "X-B": "pre {{input.b}} post", "X-Id": "{{invocation.id}}"},
    "query": {"c": "{{input.c}}", "n": 3, "e": "{{input.e}}"},
    "body": {
        "d": "{{input.d}}",
        "list": ["{{invocation.id}}", "{{input.a}}"],
        "t": "<{{input.b}}>",
        "f": "{{input.f}}",
    },
}
ORIGIN = ("https", "api.example.com", 8443)


def segments(path: str) -> list[str]:
    return [unquote(segment) for segment in path.split("/")]


def check_safe(request: RenderedRequest, origin: tuple[str, str, int]) -> None:
    parsed = URL(request.url, encoded=True)
    assert (parsed.scheme, parsed.host, parsed.port) == origin
    split = urlsplit(request.url)
    assert (split.scheme, split.hostname, split.port or 443) == origin
    reparsed = URL(request.url)  # as aiohttp parses a str URL: the meaning must not change
    assert segments(reparsed.raw_path) == segments(parsed.raw_path)
    assert parse_qsl(reparsed.raw_query_string) == parse_qsl(parsed.raw_query_string)
    assert "#" not in request.url
    for segment in split.path.split("/")[1:]:
        assert unquote(segment) not in (".", "..")
    for value in request.headers.values():
        assert not any(ch in value for ch in "\r\n\x00")


@PROPERTY
@given(source=inputs, method=st.sampled_from(["GET", "POST", "DELETE", "PATCH"]))
def test_property_url_and_headers_stay_safe(source: dict[str, Any], method: str) -> None:
    try:
        request = render_request(URL_TEMPLATE, method, FULL_TEMPLATE, source, "inv-1")
    except TemplateError:
        return
    check_safe(request, ORIGIN)
    path_parts = urlsplit(request.url).path.split("/")
    assert unquote(path_parts[2]) == source["a"] or not isinstance(source["a"], str)


@PROPERTY
@given(
    source=st.dictionaries(texts, json_values, max_size=6),
    method=st.sampled_from(["GET", "DELETE"]),
)
def test_property_merged_query_is_exactly_the_scalar_input(
    source: dict[str, Any], method: str
) -> None:
    request = render_request(f"{BASE}:443/p", method, {}, source, "inv-1")
    check_safe(request, ("https", "api.example.com", 443))
    expected = [
        (name, value if isinstance(value, str) else json.dumps(value))
        for name, value in source.items()
        if value is not None and not isinstance(value, dict | list)
    ]
    assert parse_qsl(urlsplit(request.url).query, keep_blank_values=True) == expected


@PROPERTY
@given(value=json_values)
def test_property_whole_placeholder_round_trips(value: Any) -> None:
    request = render({"body": {"v": "{{input.v}}", "w": ["{{input.v}}"]}}, {"v": value})
    assert request.body == {"v": value, "w": [value]}


@PROPERTY
@given(value=texts)
def test_property_path_value_is_exactly_one_segment(value: str) -> None:
    try:
        url = render({}, {"v": value}, url=f"{BASE}/files/{{{{input.v}}}}/meta").url
    except TemplateError:
        assert value in ("", ".", "..")
        return
    path_parts = urlsplit(url).path.split("/")
    assert len(path_parts) == 4
    assert unquote(path_parts[2]) == value


SENTINEL = "ENV-SENTINEL-7f3a9c"
template_strings = st.sampled_from(
    [
        "{{input.a}}",
        "{{input.b[0]}}",
        "x {{input.a}} y",
        "{{invocation.id}}",
        "{{ input.c.d }}",
        "{{env.SECRET}}",
        "{{input.a",
        "plain",
        "${SECRET}",
        "$SECRET",
        "%SECRET%",
    ]
)
template_values = st.recursive(
    st.one_of(template_strings, st.integers(), st.none()),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["k", "l", "m"]), inner, max_size=3)
    ),
    max_leaves=6,
)


@PROPERTY
@given(
    source=inputs,
    body=template_values,
    header=template_strings,
    query=template_strings,
    method=st.sampled_from(["GET", "POST", "PUT"]),
)
def test_property_output_never_contains_environment(
    source: dict[str, Any], body: Any, header: str, query: str, method: str
) -> None:
    template = {"headers": {"X-H": header}, "query": {"q": query}, "body": body}
    with mock.patch.dict(os.environ, {"SECRET": SENTINEL, "HOME": SENTINEL, "PATH": SENTINEL}):
        try:
            request = render_request(f"{BASE}/r", method, template, source, "inv-1")
        except TemplateError as error:
            assert SENTINEL not in error.message
            return
    assert SENTINEL not in repr(request)
    check_safe(request, ("https", "api.example.com", 443))


def test_a_template_cannot_multiply_a_large_input_without_end() -> None:
    """A thousand placeholders of one 1 MiB input would build a gigabyte in the worker's
    loop, every tenant's: the placeholders may place 16 MiB into one request in all."""
    big = "y" * 2**20
    many = {"body": {f"k{i}": "{{input.x}}" for i in range(1000)}}
    with pytest.raises(TemplateError, match="16 MiB"):
        render_request("https://api.example.com/p", "POST", many, {"x": big}, "id-1")
    headers = {"headers": {f"X-H{i}": "v={{input.x}}" for i in range(40)}}
    with pytest.raises(TemplateError, match="16 MiB"):
        render_request("https://api.example.com/p", "GET", headers, {"x": big[:500_000]}, "id-1")
    nested = {"body": {f"k{i}": "{{input.o}}" for i in range(100)}}
    obj = {"rows": [{"a": "z" * 100} for _ in range(3000)]}  # ~330 kB as JSON
    with pytest.raises(TemplateError, match="16 MiB"):
        render_request("https://api.example.com/p", "POST", nested, {"o": obj}, "id-1")
    # The same input placed a few times is fine.
    few = {"body": {"a": "{{input.x}}", "b": "{{input.x}}"}, "headers": {"X-N": "{{input.n}}"}}
    sent = render_request("https://api.example.com/p", "POST", few, {"x": big, "n": 3}, "id-1")
    assert sent.body == {"a": big, "b": big} and sent.headers["X-N"] == "3"
