"""An agent's tools as OpenAI function-calling definitions.

MCP tool names are the tool keys as they are; OpenAI function names allow only
``[A-Za-z0-9_-]{1,64}``, so ``.`` becomes ``__`` (``postiz.create_post`` →
``postiz__create_post``), and a longer name is shortened (export/names.py). Map a function
name back with ``openai_names`` or ``key_for``, not by string replacement: a key may hold
``__`` itself. Other targets and ``--strict``: export/targets.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from toolrelay.errors import InvalidArgument
from toolrelay.export.names import exported_names
from toolrelay.export.targets import export_tools

__all__ = ["openai_name", "openai_names", "openai_tools"]

OPENAI_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def openai_name(key: str) -> str:
    """The SPEC mapping alone, ``.`` → ``__``; an error when that does not fit 64 characters
    (``exported_name`` shortens instead)."""
    name = key.replace(".", "__")
    if not OPENAI_NAME.fullmatch(name):
        raise InvalidArgument(
            f"tool {key}: {name!r} is not a valid OpenAI function name"
            " (letters, digits, '_' and '-', at most 64 characters)"
        )
    return name


def openai_names(keys: Iterable[str]) -> dict[str, str]:
    """Function name → tool key (shortened names included); a collision is an error."""
    return exported_names(keys)


def openai_tools(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``[{"type": "function", "function": {name, description, parameters}}]`` per tool."""
    return export_tools(rows, "openai").tools
