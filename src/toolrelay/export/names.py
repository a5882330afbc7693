"""Function names for exported tools, and the way back from a name to its tool key.

SPEC: ``.`` becomes ``__`` (``postiz.create_post`` → ``postiz__create_post``). Vendors allow
``[A-Za-z0-9_-]{1,64}``; a key that is longer after mapping (GitHub's ``gh.`` + operation ids
often are) keeps a readable prefix and ends in ``_`` + a hash of the whole key, so the name
depends on the key alone: the same on every run and machine, whatever else is assigned.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Final

from toolrelay.errors import InvalidArgument

__all__ = [
    "MAX_NAME",
    "exported_name",
    "exported_names",
    "gemini_name",
    "key_for",
    "may_be_exported",
]

MAX_NAME: Final = 64  # characters, OpenAI's, Anthropic's and Gemini's limit
HASH_CHARS: Final = 10  # hex digits of sha256(key): 40 bits, collisions are still checked
VENDOR_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def exported_name(key: str) -> str:
    """The function name for a tool key: ``.`` → ``__``, shortened past 64 characters."""
    name = key.replace(".", "__")
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(key.encode()).hexdigest()[:HASH_CHARS]
        name = f"{name[: MAX_NAME - HASH_CHARS - 1]}_{digest}"
    if not VENDOR_NAME.fullmatch(name):  # keys are [A-Za-z0-9_.-]: only an unchecked key
        raise InvalidArgument(f"tool {key}: {name!r} is not a valid function name")
    return name


def exported_names(keys: Iterable[str]) -> dict[str, str]:
    """Function name → tool key; two keys mapping to the same name are an error."""
    names: dict[str, str] = {}
    for key in keys:
        name = exported_name(key)
        if name in names:
            raise InvalidArgument(
                f"tools {names[name]} and {key} both become the OpenAI function name {name!r}"
            )
        names[name] = key
    return names


def gemini_name(key: str) -> str:
    """Gemini's names start with a letter or ``_``: a key starting with a digit gets ``_``
    before its name (keys never start with ``_``, so this cannot clash)."""
    name = exported_name(key)
    return f"_{name}" if name[0].isdigit() else name


def may_be_exported(name: str) -> bool:
    """Whether ``name`` can be an exported name that differs from its key: a mapped key
    holds ``__``, a shortened one is 64 characters, Gemini's may start with ``_``; one with
    a dot is a key."""
    return "." not in name and ("__" in name or len(name) == MAX_NAME or name[:1] == "_")


def key_for(name: str, keys: Iterable[str]) -> str | None:
    """The key among ``keys`` (an agent's tools) that ``name`` stands for: the key itself
    (MCP names are keys), else the key exported as ``name``; None when there is none."""
    keys = list(keys)
    if name in keys:
        return name
    return next((key for key in keys if name in (exported_name(key), gemini_name(key))), None)
