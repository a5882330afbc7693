"""Importing a document again never takes away an approval an owner asked for.

An import infers gating from the method: a GET needs no approval, anything else does. An
owner who gated a read by hand (`tool update KEY --set requires_approval=true`: a read of
private files, say) and later imported the same document again, for its new operations,
found that read silently ungated: the import wrote `requires_approval: false` over their
decision. An import may now add gating to a tool that has a key already, never remove it;
it says which tools kept their gating.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.interop.conftest import Owner
from toolrelay.registry import ToolSpec

DOC = {
    "openapi": "3.0.0",
    "info": {"title": "files", "version": "1"},
    "servers": [{"url": "https://api.example.com"}],
    "paths": {
        "/files/{path}": {
            "get": {
                "operationId": "read",
                "parameters": [{"name": "path", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"200": {"description": "ok"}},
            },
            "delete": {
                "operationId": "remove",
                "parameters": [{"name": "path", "in": "path", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {"204": {"description": "gone"}},
            },
        }
    },
}  # fmt: skip


def _gated(owner: Owner, key: str) -> tuple[bool, bool, str]:
    tool = owner.registry.get_tool(key)
    return tool["requires_approval"], tool["is_dangerous"], tool["egress_class"]


def test_a_second_import_keeps_the_gating_an_owner_added(owner: Owner, tmp_path: Path) -> None:
    path = tmp_path / "files.json"
    path.write_text(json.dumps(DOC))
    first = owner.cli("import", "openapi", str(path), "--prefix", "files.")
    assert first.exit_code == 0, first.output
    assert _gated(owner, "files.read") == (False, False, "read_only")  # as inferred
    for change in ("requires_approval=true", "is_dangerous=true"):
        done = owner.cli("tool", "update", "files.read", "--set", change)
        assert done.exit_code == 0, done.output

    again = owner.cli("import", "openapi", str(path), "--prefix", "files.")
    assert again.exit_code == 0, again.output
    assert _gated(owner, "files.read") == (True, True, "read_only")  # the owner's decision
    assert "files.read keeps is_dangerous=true, requires_approval=true (set on the tool;" in (
        again.output
    )
    assert _gated(owner, "files.remove") == (True, False, "write")  # inferred, as before


def test_an_import_still_adds_gating(owner: Owner, tmp_path: Path) -> None:
    """A read the document now says is a write (or a tool first made by hand) is gated."""
    loose = json.loads(json.dumps(DOC))
    loose["paths"]["/files/{path}"]["get"]["operationId"] = "remove"  # a GET under that key
    del loose["paths"]["/files/{path}"]["delete"]
    path = tmp_path / "loose.json"
    path.write_text(json.dumps(loose))
    assert owner.cli("import", "openapi", str(path), "--prefix", "f.").exit_code == 0
    assert _gated(owner, "f.remove") == (False, False, "read_only")
    path.write_text(json.dumps(DOC))
    assert owner.cli("import", "openapi", str(path), "--prefix", "f.").exit_code == 0
    assert _gated(owner, "f.remove") == (True, False, "write")


def test_an_import_keeps_a_dangerous_tool_dangerous(owner: Owner, tmp_path: Path) -> None:
    """is_dangerous sets the quorum's default (two approvers): an import never infers it, so
    it never clears it, even on a tool that stays gated for another reason."""
    path = tmp_path / "files.json"
    path.write_text(json.dumps(DOC))
    assert owner.cli("import", "openapi", str(path), "--prefix", "d.").exit_code == 0
    assert owner.cli("tool", "update", "d.remove", "--set", "is_dangerous=true").exit_code == 0
    again = owner.cli("import", "openapi", str(path), "--prefix", "d.")
    assert again.exit_code == 0, again.output
    assert _gated(owner, "d.remove") == (True, True, "write")
    assert "d.remove keeps is_dangerous=true" in again.output


def test_an_import_says_what_it_changed_on_a_tool_of_the_same_key(
    owner: Owner, tmp_path: Path
) -> None:
    """A document whose operation has the key of a tool made by hand overwrites it: the
    import says so, naming the fields, instead of "imported" as for a new tool."""
    owner.registry.register_tool(ToolSpec.from_mapping({
        "key": "files.read", "name": "read", "http_method": "GET", "egress_class": "read_only",
        "endpoint_url": "https://files.internal.example/read/{{input.path}}",
    }))  # fmt: skip
    path = tmp_path / "files.json"
    path.write_text(json.dumps(DOC))
    result = owner.cli("import", "openapi", str(path), "--prefix", "files.")
    assert result.exit_code == 0, result.output
    read, remove = result.stdout.splitlines()
    assert read.startswith("updated files.read (GET https://api.example.com/files/")
    assert "endpoint_url" in read.split(": ", 1)[1]
    assert remove.startswith("created files.remove (DELETE https://api.example.com/files/")
