"""The spellings in which a credential that was sent may come back from an upstream.

An upstream that reflects a credential (an error page quoting the Authorization header, a
debug echo) spells it the way its own serializer escapes text: percent-encoded in URLs,
base64 in Basic auth, JSON-escaped, and in HTML or in "HTML-safe" JSON one character at a
time: ``&amp;`` or ``&#38;`` in a page, ``\\u0026`` from Go's encoding/json, ``\\u002B``
from .NET's System.Text.Json. outcome.scrub redacts all of them.
"""

from __future__ import annotations

import base64
import html
import json
import re
from html.entities import html5
from typing import Any
from urllib.parse import quote, quote_plus

from yarl import URL

__all__ = ["form_pattern", "lower_hex", "secret_forms", "spelled_pattern"]

# Characters that HTML-safe JSON encoders write as \uXXXX: Go's encoding/json (<, >, &)
# and .NET's default System.Text.Json encoder (those, ', ", +, ` and all non-ASCII).
_GO_JSON = "<>&\u2028\u2029"
_DOTNET_JSON = "<>&'\"+`"


def secret_forms(secret: str) -> set[str]:
    """The whole spellings of ``secret`` that are looked for as they are (and whose first
    part is redacted where trim() cut one off).

    As sent (and with its whitespace collapsed, as trim() does); percent-encoded the ways
    clients and servers encode (``quote`` with and without ``/`` safe, ``quote_plus``,
    JavaScript's encodeURIComponent, yarl's query encoding that placed it in the URL);
    base64 and base64url, with and without padding; JSON-escaped, ASCII-only or not, once
    or twice, with ``/`` escaped or not, and as Go's and .NET's HTML-safe JSON write it;
    HTML-escaped as Python and as Go's html/template or Jinja do, or every character but
    letters and digits as a decimal or hex character reference. Percent escapes match in
    either hex case. Mixtures of the character-by-character escapes: spelled_pattern.
    """
    forms = {secret, " ".join(secret.split())}
    forms |= {
        quote(secret),
        quote(secret, safe=""),
        quote(secret, safe="!'()*"),
        quote_plus(secret),
        URL.build(query={"k": secret}).raw_query_string.removeprefix("k="),
    }
    raw = secret.encode()
    forms |= {raw.hex(), raw.hex().upper()}  # a hex dump of what was received
    for coder in (base64.b64encode, base64.urlsafe_b64encode):
        text = coder(raw).decode("ascii")
        forms |= {text, text.rstrip("=")}
        forms |= _base64_inside(raw, coder)
    for ascii_only in (True, False):
        once = json.dumps(secret, ensure_ascii=ascii_only)[1:-1]
        forms |= {once, once.replace("/", "\\/"), json.dumps(once, ensure_ascii=ascii_only)[1:-1]}
    forms |= {
        _json_escaping(secret, _GO_JSON, upper=False, ascii_only=False),
        _json_escaping(secret, _DOTNET_JSON, upper=True, ascii_only=True),
        html.escape(secret),
        html.escape(secret).replace("&quot;", "&#34;").replace("&#x27;", "&#39;"),
        "".join(c if _plain(c) else f"&#{ord(c)};" for c in secret),
        "".join(c if _plain(c) else f"&#x{ord(c):x};" for c in secret),
    }
    return forms


def _base64_inside(raw: bytes, coder: Any) -> set[str]:
    """What base64 of any text holding ``raw`` holds of it, whatever came before: the
    characters of the groups made of ``raw``'s bytes alone, at each of the three places
    ``raw`` may start in a group of three (a cursor encoding the query it was sent)."""
    found = set()
    for offset in (0, 1, 2):
        whole = (offset + len(raw)) // 3  # groups of three complete without what follows
        text = coder(b"\0" * offset + raw).decode("ascii")
        inside = text[4 if offset else 0 : 4 * whole]
        if len(inside) >= 16:  # shorter runs occur by chance in any base64
            found.add(inside)
    return found


def _plain(char: str) -> bool:
    """Whether no encoder escapes ``char`` one character at a time (ASCII letters, digits)."""
    return char.isascii() and char.isalnum()


def _json_escaping(secret: str, escaped: str, upper: bool, ascii_only: bool) -> str:
    """``secret`` JSON-escaped by an encoder that also writes ``escaped`` as \\uXXXX."""
    text = json.dumps(secret, ensure_ascii=ascii_only)[1:-1]
    for char in escaped:  # as the same dumps spelled it (U+2028 raw when not ascii_only)
        text = text.replace(json.dumps(char, ensure_ascii=ascii_only)[1:-1], f"\\u{ord(char):04x}")
    if upper:
        text = re.sub(r"\\u([0-9a-f]{4})", lambda m: "\\u" + m[1].upper(), text)
    return text


_PERCENT_ESCAPE = re.compile(r"(%[0-9A-F]{2})")


def form_pattern(form: str) -> str:
    """``form`` as a regular expression in which each ``%XX`` matches either hex case."""
    pieces = _PERCENT_ESCAPE.split(form)  # odd indexes hold the escapes
    return "".join(
        f"%[{p[1]}{p[1].lower()}][{p[2]}{p[2].lower()}]" if i % 2 else re.escape(p)
        for i, p in enumerate(pieces)
    )


def lower_hex(form: str) -> str:
    """``form`` with its percent escapes in lower-case hex."""
    return _PERCENT_ESCAPE.sub(lambda m: m[1].lower(), form)


def spelled_pattern(secret: str) -> str:
    """``secret`` as a regular expression in which every character that is not a letter or
    digit of ASCII may be written as itself, as a JSON ``\\uXXXX`` escape (either hex case;
    a surrogate pair beyond the BMP) or short escape, or as an HTML character reference
    (decimal, hex with any leading zeros, or any of its named ones), in any mixture."""
    return "".join(_char_pattern(char) for char in secret)


def _char_pattern(char: str) -> str:
    if _plain(char):
        return char
    code = ord(char)
    spellings = [re.escape(char), _json_unicode(code), f"&#0*{code};"]
    spellings.append("&#[xX]0*" + _either_case(f"{code:x}") + ";")
    spellings += sorted(re.escape("&" + name) for name in _ENTITY_NAMES.get(char, ()))
    short = json.dumps(char)[1:-1]
    if short.startswith("\\") and not short.startswith("\\u"):
        spellings.append(re.escape(short))
    if char == "/":
        spellings.append(re.escape("\\/"))
    return "(?:" + "|".join(spellings) + ")"


def _json_unicode(code: int) -> str:
    if code <= 0xFFFF:
        return r"\\u" + _either_case(f"{code:04x}")
    high, low = divmod(code - 0x10000, 0x400)
    return _json_unicode(0xD800 + high) + _json_unicode(0xDC00 + low)


def _either_case(hex_digits: str) -> str:
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in hex_digits)


def _entity_names() -> dict[str, list[str]]:
    """Every named character reference (with its semicolon) of each single character."""
    names: dict[str, list[str]] = {}
    for name, value in html5.items():
        if name.endswith(";") and len(value) == 1:
            names.setdefault(value, []).append(name)
    return names


_ENTITY_NAMES = _entity_names()
