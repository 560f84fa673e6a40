"""Where a text may be cut without splitting what a reader sees as one character (pure).

Python slices code points, so a cut can fall inside an emoji sequence (a family is five code
points joined by U+200D), a flag (two regional indicators), an emoji and its skin tone or
variation selector, a letter and its combining accent, or an Indic conjunct (two consonants
joined by a virama, ``क्ष``): the head then shows another emoji, a lone letter, a half
letter, or loses the accent. :func:`cut_point` moves a cut back to the start
of the cluster it falls in: an approximation of Unicode's extended grapheme clusters
(UAX #29) for those cases, without a dependency.
"""

from __future__ import annotations

import unicodedata

_ZWJ = "\u200d"


def _extends(char: str) -> bool:
    """Does ``char`` belong to the cluster before it (a mark, a joiner, a selector, a skin
    tone, an emoji tag, a Hangul vowel or final consonant jamo)?"""
    code = ord(char)
    return (unicodedata.category(char) in ("Mn", "Mc", "Me") or char == _ZWJ
            or 0xFE00 <= code <= 0xFE0F or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F
            or 0xE0100 <= code <= 0xE01EF or 0x1160 <= code <= 0x11FF)


# The viramas that join two consonants into one letter (UAX #29 GB9c, Indic_Conjunct_Break=Linker):
# Devanagari, Bengali, Gujarati, Oriya, Telugu, Malayalam
_LINKERS = frozenset("\u094d\u09cd\u0acd\u0b4d\u0c4d\u0d4d")


def _conjunct(before: str, after: str) -> bool:
    """Is ``before`` a virama joining the consonant ``after`` to the one before it (``क्ष``)?"""
    return before in _LINKERS and 0x900 <= ord(after) < 0xD80 and unicodedata.category(after) == "Lo"


def _regional(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def cut_point(text: str, n: int) -> int:
    """The largest ``m <= n`` such that ``text[:m]`` ends between two clusters (pure):
    ``cut_point("e\\u0301x", 1) == 0``; ``n`` itself where it is already such a place."""
    n = max(0, min(n, len(text)))
    while 0 < n < len(text):
        before, after = text[n - 1], text[n]
        if _extends(after) or before == _ZWJ or (before == "\r" and after == "\n") or _conjunct(before, after):
            n -= 1
        elif _regional(before) and _regional(after):
            run = n  # a flag is a pair: a cut is inside one after an odd run of indicators
            while run > 0 and _regional(text[run - 1]):
                run -= 1
            if (n - run) % 2 == 0:
                return n
            n -= 1
        else:
            return n
    return n
