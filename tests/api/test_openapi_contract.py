"""Our own /openapi.json as a contract: explicit operation ids, the errors each operation can
really return, a server entry, and a generated Python client that passes ``mypy --strict``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from toolrelay.api.app import create_app
from toolrelay.api.context import ApiSettings

METHODS = {"get", "put", "post", "patch", "delete", "head", "options"}
ERROR_REF = "#/components/schemas/ErrorBody"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    # No database is touched: the schema is built from the routes alone.
    app = create_app(ApiSettings(database_url="postgresql:///unused", run_worker=False))
    response = TestClient(app).get("/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): op
        for path, item in document["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }


def test_every_operation_has_an_explicit_unique_id(document: dict[str, Any]) -> None:
    ops = operations(document)
    ids = [op.get("operationId", "") for op in ops.values()]
    # FastAPI's default ids end in the method (show_tool_v1_tools__key__get); ours are short.
    defaults = [i for i in ids if not i or "__" in i or i.endswith(tuple(f"_{m}" for m in METHODS))]
    assert defaults == []
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    assert all(len(i) <= 30 and i.isidentifier() for i in ids), ids
    by_route = {f"{m} {p}": op["operationId"] for (m, p), op in ops.items()}
    assert by_route["GET /v1/tools"] == "listTools"
    assert by_route["GET /v1/tools/{key}"] == "getTool"
    assert by_route["POST /v1/invocations/{invocation_id}/approve"] == "approveInvocation"
    assert by_route["POST /v1/invocations/{invocation_id}/retry"] == "retryInvocation"
    assert by_route["POST /v1/agent/invocations"] == "createAgentInvocation"
    assert by_route["GET /healthz"] == "getHealth"


@pytest.mark.parametrize(
    ("route", "statuses"),
    [
        ("GET /healthz", {"200", "503"}),
        ("GET /v1/me", {"200", "401", "429", "503"}),
        ("GET /v1/tools", {"200", "401", "403", "429", "503"}),
        ("GET /v1/tools/{key}", {"200", "401", "403", "404", "422", "429", "503"}),
        (
            "POST /v1/tools",
            {"201", "400", "401", "403", "409", "413", "422", "429", "503"},
        ),
        (
            "POST /v1/invocations/{invocation_id}/retry",
            {"201", "401", "403", "404", "409", "422", "429", "503"},
        ),
        ("GET /v1/invocations", {"200", "401", "403", "422", "429", "503"}),
        (
            "POST /v1/agent/invocations",
            {"202", "400", "401", "403", "404", "409", "413", "422", "429", "503"},
        ),
    ],
)
def test_operations_declare_only_their_errors(
    document: dict[str, Any], route: str, statuses: set[str]
) -> None:
    method, path = route.split(" ", 1)
    responses = operations(document)[(method, path)]["responses"]
    assert set(responses) == statuses
    for status, response in responses.items():
        if int(status) >= 400 and path != "/healthz":
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": ERROR_REF}, (route, status)


def test_the_document_names_a_server(document: dict[str, Any]) -> None:
    assert document["servers"][0]["url"] == "/"


@pytest.mark.skipif(
    shutil.which("openapi-python-client", path=str(Path(sys.executable).parent)) is None,
    reason="openapi-python-client is not installed (see docs/api.md)",
)
def test_a_generated_python_client_type_checks(document: dict[str, Any], tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(document))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"post_hooks": []}))  # no ruff run on the output
    generated = subprocess.run(
        [str(bin_dir / "openapi-python-client"), "generate", "--path", str(spec),
         "--config", str(config), "--meta", "none", "--output-path", "toolrelay_client"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    output = generated.stdout + generated.stderr
    assert generated.returncode == 0, output
    # Any warning is about our schema (a skipped operation, an unsupported construct).
    assert "Warning" not in output, output
    package = tmp_path / "toolrelay_client"
    mypy_ini = tmp_path / "mypy.ini"
    mypy_ini.write_text("[mypy]\n")  # the client on its own, not under the project's settings
    assert (package / "api" / "tools" / "get_tool.py").exists()
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--config-file", str(mypy_ini), str(package.name)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
