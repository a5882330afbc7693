"""An approximation of X's weighted character count (twitter-text v3 configuration).

What it does, like twitter-text: text is NFC-normalized; code points in the Latin and
general-punctuation ranges weigh 1, every other code point weighs 2 (CJK, most symbols);
each URL weighs 23 whatever its length; an emoji weighs 2 however many code points it
spans (ZWJ sequences, skin tones, variation selectors and flag pairs collapse into one).

Where it is only approximate: URLs are found by a simple pattern (`http://`, `https://` or
`www.` followed by non-spaces), so bare domains such as `example.com` count by their
characters; emoji are recognised by code-point ranges, not by Unicode's emoji data, so a
keycap (a digit, U+FE0F, U+20E3) weighs 1 instead of 2.
"""

from __future__ import annotations

import re
import unicodedata

X_MAX_WEIGHTED_LENGTH = 280
URL_WEIGHT = 23
_URL = re.compile(r"(?:https?://|www\.)\S+", re.IGNORECASE)
_LIGHT_RANGES = ((0x0000, 0x10FF), (0x2000, 0x200D), (0x2010, 0x201F), (0x2032, 0x2037))
_ZWJ = 0x200D
_JOINED_MARKS = (  # modifiers that add no weight of their own
    (0xFE00, 0xFE0F),  # variation selectors
    (0x1F3FB, 0x1F3FF),  # skin-tone modifiers
    (0x20E3, 0x20E3),  # combining keycap
    (0xE0020, 0xE007F),  # tag characters (subdivision flags)
)
_EMOJI_RANGES = ((0x2600, 0x27BF), (0x1F000, 0x1FAFF))
_REGIONAL_INDICATORS = (0x1F1E6, 0x1F1FF)


def weighted_length(text: str) -> int:
    text = unicodedata.normalize("NFC", text)
    total, start = 0, 0
    for match in _URL.finditer(text):
        total += _weigh(text[start : match.start()]) + URL_WEIGHT
        start = match.end()
    return total + _weigh(text[start:])


def is_too_long_for_x(text: str) -> bool:
    return weighted_length(text) > X_MAX_WEIGHTED_LENGTH


def _weigh(text: str) -> int:
    total = 0
    after_emoji = joining = in_flag = False
    for char in text:
        point = ord(char)
        if joining:
            joining = False  # joined to the emoji already counted
            continue
        if _within(point, _JOINED_MARKS):
            continue
        if after_emoji and point == _ZWJ:
            joining = True
            continue
        if _within(point, (_REGIONAL_INDICATORS,)):
            in_flag = not in_flag  # a flag is a pair of indicators: count the first only
            total += 2 if in_flag else 0
            after_emoji = True
            continue
        in_flag = False
        after_emoji = _within(point, _EMOJI_RANGES)
        total += 1 if _within(point, _LIGHT_RANGES) else 2
    return total


def _within(point: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= point <= high for low, high in ranges)
