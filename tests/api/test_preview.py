"""The approval preview: the dispatcher's rendering, with the credential masked."""

from __future__ import annotations

import uuid
from typing import Any

from toolrelay.registry.preview import MASK, preview_request


def row(**fields: Any) -> dict[str, Any]:
    return {
        "id": uuid.UUID(int=7),
        "input": {"q": "cats"},
        "endpoint_url": "https://api.example.com/search?lang=en",
        "http_method": "GET",
        "request_template": {},
        "schema_input": {"properties": {"limit": {"default": 5}}},
        "auth_method": "api_key",
        "auth_placement": "query",
        "auth_param_name": "api_key",
        "auth_param_prefix": "",
        "credential_ref": uuid.UUID(int=9),
        "idempotency_header": None,
        "tool_changed": False,
    } | fields


def test_query_credential_is_masked_and_schema_defaults_are_not_sent() -> None:
    preview = preview_request(row())
    assert preview.url == f"https://api.example.com/search?lang=en&q=cats&api_key={MASK}"
    assert preview.headers == [("X-Toolrelay-Invocation", str(uuid.UUID(int=7)))]
    assert preview.body is None and preview.error is None and preview.warnings == []


def test_header_credential_keeps_its_prefix_and_writes_show_their_body() -> None:
    preview = preview_request(row(http_method="POST", auth_placement="header",
                                  auth_param_name="Authorization", auth_param_prefix="Bearer ",
                                  idempotency_header="Idempotency-Key"))  # fmt: skip
    assert ("Authorization", f"Bearer {MASK}") in preview.headers
    assert ("Idempotency-Key", f"toolrelay-{uuid.UUID(int=7)}") in preview.headers
    assert ("Content-Type", "application/json") in preview.headers
    assert preview.body == '{\n  "q": "cats"\n}'  # the schema's default is not sent


def test_what_would_fail_is_said_before_approving() -> None:
    changed = preview_request(row(tool_changed=True, credential_ref=None))
    assert any("tool_changed" in w for w in changed.warnings)
    assert any("credential_missing" in w for w in changed.warnings)
    broken = preview_request(row(request_template={"headers": {"X-A": "{{input.missing}} x"}}))
    assert broken.error is not None and "template_error" in broken.error
