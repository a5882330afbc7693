"""A rendered body as the bytes sent: JSON, unless the template's Content-Type says form.

The template renders a JSON value (docs/templates.md); its ``Content-Type`` header decides
the encoding, so what an approval binds to (the rendered body and every header) decides the
bytes too:

- ``application/x-www-form-urlencoded``: the body must be an object. Each member is one
  pair, ``key=value``; an array of scalars repeats the key (``tag=a&tag=b``); a nested
  object or an array holding objects or arrays uses brackets (``card[number]=…``,
  ``items[0][price]=…``), the convention of Stripe, Rails and PHP. Booleans are
  ``true``/``false``, numbers as in JSON, ``null`` leaves the pair out. A key may carry
  its own brackets (``expand[]``), which are kept.
- ``multipart/form-data``: the body must be an object; each member one text part (an array
  of scalars one part per element, an object or an array of objects one part holding its
  JSON, typed ``application/json``). Files are not sent. The boundary is derived from the
  body (the same call, the same bytes) and added to the header.
- anything else, or no Content-Type: JSON (``application/json`` unless the template set
  another type, such as ``application/merge-patch+json``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from toolrelay.errors import TemplateError

__all__ = [
    "FORM", "MULTIPART", "check_body", "encode_body", "form_pairs", "media_type",
    "multipart_parts", "shown_body",
]  # fmt: skip

FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
JSON_TYPE = "application/json"


def media_type(headers: Mapping[str, str]) -> str | None:
    """The Content-Type's media type, lower-cased, without parameters (None: not set)."""
    for name, value in headers.items():
        if name.lower() == "content-type":
            return value.split(";", 1)[0].strip().lower()
    return None


def encode_body(body: Any, headers: dict[str, str]) -> bytes:
    """The bytes to send for ``body``; sets or completes ``headers``' Content-Type."""
    kind = media_type(headers)
    if kind == FORM:
        return urlencode(form_pairs(body)).encode()  # WHATWG's serializer: spaces as +
    if kind == MULTIPART:
        payload, boundary = _multipart(body)
        _set_content_type(headers, f"{MULTIPART}; boundary={boundary}")
        return payload
    if kind is None:
        headers["Content-Type"] = JSON_TYPE
    return json.dumps(body).encode()


def form_pairs(body: Any) -> list[tuple[str, str]]:
    """The (key, value) pairs of a form body, in order. Raises TemplateError."""
    check_body(body, {"Content-Type": FORM})
    assert isinstance(body, Mapping)
    pairs: list[tuple[str, str]] = []
    for key, value in body.items():
        if isinstance(value, list) and all(_scalar(v) for v in value):
            pairs += [(str(key), _text(v)) for v in value if v is not None]
        else:
            pairs += list(_flatten(str(key), value))
    return pairs


def _flatten(key: str, value: Any) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for sub, item in value.items():
            yield from _flatten(f"{key}[{sub}]", item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _flatten(f"{key}[{index}]", item)
    elif value is not None:
        yield key, _text(value)


def _multipart(body: Any) -> tuple[bytes, str]:
    parts = multipart_parts(body)
    seed = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    boundary = "toolrelay-" + hashlib.sha256(seed).hexdigest()[:32]
    while any(boundary in text or boundary in name for name, text, _ in parts):
        boundary += "x"  # never inside a part (a part would have to quote it on purpose)
    chunks = []
    for name, text, content_type in parts:
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{_field_name(name)}"\r\n'
        if content_type:
            head += f"Content-Type: {content_type}\r\n"
        chunks.append(f"{head}\r\n{text}\r\n")
    chunks.append(f"--{boundary}--\r\n")
    return "".join(chunks).encode(), boundary


def multipart_parts(body: Any) -> list[tuple[str, str, str | None]]:
    """The parts of a multipart body: (name, text, content type when not plain text)."""
    check_body(body, {"Content-Type": MULTIPART})
    assert isinstance(body, Mapping)
    parts: list[tuple[str, str, str | None]] = []
    for key, value in body.items():
        if isinstance(value, list) and all(_scalar(v) for v in value):
            parts += [(str(key), _text(v), None) for v in value if v is not None]
        elif isinstance(value, Mapping | list):
            parts.append((str(key), json.dumps(value), JSON_TYPE))
        elif value is not None:
            parts.append((str(key), _text(value), None))
    return parts


def shown_body(body: Any, headers: Mapping[str, str]) -> str:
    """The body as a reviewer reads it, unambiguous whatever the values hold: JSON indented;
    a form body as sent, one percent-encoded pair per line; multipart as a JSON list of
    [name, value] parts (the boundary is not shown)."""
    kind = media_type(headers)
    if kind == FORM:
        return "&\n".join(urlencode([pair]) for pair in form_pairs(body))
    if kind == MULTIPART:
        shown = [[name, text] for name, text, _ in multipart_parts(body)]
        return json.dumps(shown, indent=2, ensure_ascii=False)
    return json.dumps(body, indent=2, ensure_ascii=False)


def _field_name(name: str) -> str:
    """A field name inside the quoted Content-Disposition parameter (WHATWG's escaping)."""
    return name.replace("\r", "%0D").replace("\n", "%0A").replace('"', "%22")


def _set_content_type(headers: dict[str, str], value: str) -> None:
    for name in list(headers):
        if name.lower() == "content-type":
            headers[name] = value
            return
    headers["Content-Type"] = value


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)  # true, false, numbers as in JSON


def check_body(body: Any, headers: Mapping[str, str]) -> None:
    """Refuse at rendering a body its declared form type cannot carry (TemplateError)."""
    kind = media_type(headers)
    if kind in (FORM, MULTIPART) and not isinstance(body, Mapping):
        raise TemplateError(f"body: a {kind} body must render to a JSON object, got {_kind(body)}")


def _kind(value: Any) -> str:
    if value is None:
        return "no body"
    return {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number")
