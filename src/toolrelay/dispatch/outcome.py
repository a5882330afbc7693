"""What one attempt came to, and how that is recorded."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from toolrelay.dispatch.spellings import form_pattern, lower_hex, secret_forms, spelled_pattern
from toolrelay.registry.validation import UNSTORABLE

REDACTED = "[redacted]"
ERROR_BODY_CHARS = 500  # a trimmed body in an error message
TRIMMED = "…"  # ends a trimmed text
MIN_SECRET_CHARS = 4  # shorter values (and spellings) are not scrubbed: ordinary text has them
MIN_CUT_CHARS = 4  # the shortest start of a secret cut off by trim() that is still redacted
SCRUBBER_CACHE = 256  # sets of secrets whose compiled spellings are remembered

# Codes whose message is for the owner alone: the agent reads this text in the invocation,
# the owner the message itself in the attempt row (Outcome.detail).
AGENT_MESSAGES = {
    "egress_blocked": "egress_blocked: destination not allowed"
    " (the owner sees why in the attempt history)",
}


HANDED_BACK = "handed_back"  # Outcome.status: not sent, back to the queue (see Outcome)


@dataclass
class Outcome:
    """The decision for one claimed invocation.

    ``status`` is terminal (completed, failed, expired) or ``running`` for a retry after
    ``retry_in`` seconds. ``clear_sent`` marks a retry whose request provably never left.
    ``error`` is what the agent reads; ``detail``, when set, is the owner's fuller account
    for the attempt row (internal addresses, DNS answers, the allow entry that did not apply).
    Two statuses are never recorded: ``lost`` (another worker owns the lease now) and
    ``handed_back`` (this worker lacks the master key ``detail`` names: nothing was sent,
    and the call goes back to the queue for a worker that has it).
    """

    status: str
    output: Any = None
    error: str | None = None
    error_code: str | None = None
    http_status: int | None = None
    output_mismatch: str | None = None
    retry_in: float = 0.0
    clear_sent: bool = False
    detail: str | None = None

    @classmethod
    def failed(cls, code: str, message: str, http_status: int | None = None) -> Outcome:
        error, detail = _for_agent(code, message)
        return cls("failed", error=error, error_code=code, http_status=http_status, detail=detail)

    @classmethod
    def retry(
        cls,
        delay: float,
        code: str,
        message: str,
        *,
        never_left: bool,
        http_status: int | None = None,
    ) -> Outcome:
        error, detail = _for_agent(code, message)
        return cls(
            "running",
            error=error,
            error_code=code,
            retry_in=delay,
            clear_sent=never_left,
            http_status=http_status,
            detail=detail,
        )


# A socket address as asyncio words a failed connection: ('10.0.0.5', 443), or
# ('fd00::5', 443, 0, 0); one per address tried after "Multiple exceptions:".
_SOCKET_ADDRESS = re.compile(r"\('[^'\s]*', \d+(?:, \d+, \d+)?\)")
ADDRESS_WITHHELD = "(address in the attempt history)"


def _for_agent(code: str, message: str) -> tuple[str, str | None]:
    """The agent's message and the owner's detail (None when they are the same). A host
    the allow-list names may resolve to an internal address: the agent reads the message
    without the addresses connected to, the owner the whole of it."""
    public = AGENT_MESSAGES.get(code) or _SOCKET_ADDRESS.sub(ADDRESS_WITHHELD, message)
    return (message, None) if public == message else (public, message)


# --- scrubbing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scrubber:
    pattern: re.Pattern[str]  # every spelling of every secret, longest first
    starts: tuple[str, ...]  # the spellings (also with lower-case hex) for cut-off starts
    numbers: bool = False  # a secret of digits: JSON numbers may spell it too

    def __call__(self, text: str) -> str:
        if self.pattern.search(text) is not None:  # rare: a search is cheaper than a sub
            text = self.pattern.sub(REDACTED, text)
        return self._cut_starts(text) if TRIMMED in text else text

    def _cut_starts(self, text: str) -> str:
        """A trimmed text may end in the first part of a secret, and a message may go on
        after a trimmed quote: redact the part before each mark of a cut too."""
        parts = text.split(TRIMMED)
        return TRIMMED.join([*map(self._cut_start, parts[:-1]), parts[-1]])

    def _cut_start(self, body: str) -> str:
        for form in self.starts:
            for cut in range(min(len(form) - 1, len(body)), MIN_CUT_CHARS - 1, -1):
                if body.endswith(form[:cut]):
                    return body[:-cut] + REDACTED
        return body


@lru_cache(maxsize=SCRUBBER_CACHE)
def _scrubber(secrets: tuple[str, ...]) -> _Scrubber:
    forms = {f for s in secrets for f in secret_forms(s) if len(f) >= MIN_SECRET_CHARS}
    ordered = sorted(forms, key=len, reverse=True)  # at one position the longest wins
    lower = {lower_hex(f) for f in ordered}
    # after the whole forms: the mixtures of per-character escapes (HTML, JSON \uXXXX)
    patterns = [*map(form_pattern, ordered), *map(spelled_pattern, secrets)]
    return _Scrubber(
        pattern=re.compile("|".join(patterns)),
        starts=tuple(sorted(set(ordered) | lower, key=len, reverse=True)),
        numbers=any(_DIGITS.fullmatch(s) for s in secrets),
    )


def scrub(value: Any, secrets: Iterable[str]) -> Any:
    """Replace every known secret inside strings of a JSON value, in any of its spellings
    (spellings.py), and the start of a whole spelling that trim() cut off."""
    known = tuple(sorted({s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}))
    if not known:
        return value
    return _scrub(value, _scrubber(known))


_DIGITS = re.compile(r"[0-9]+")


def _scrub(value: Any, scrubber: _Scrubber) -> Any:
    if isinstance(value, str):
        return scrubber(value)
    if scrubber.numbers and isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value)  # a PIN echoed back as a number: the number becomes the text
        scrubbed = scrubber(text)
        return value if scrubbed == text else scrubbed
    if isinstance(value, list):
        return [_scrub(v, scrubber) for v in value]
    if isinstance(value, dict):
        return {_scrub(k, scrubber): _scrub(v, scrubber) for k, v in value.items()}
    return value


REPLACEMENT = "\ufffd"  # what an undecodable byte becomes, too


def storable(value: Any) -> Any:
    """``value`` with what PostgreSQL cannot store (UNSTORABLE: U+0000, an unpaired
    surrogate) in its strings and keys replaced by U+FFFD: one such character in a result
    would fail its whole batch's write. Recursive: the value's depth is bounded first
    (registry/validation.py, MAX_JSON_DEPTH)."""
    if isinstance(value, str):
        return UNSTORABLE.sub(REPLACEMENT, value)
    if isinstance(value, list):
        return [storable(v) for v in value]
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    return value


def trim(text: str, limit: int = ERROR_BODY_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + TRIMMED
