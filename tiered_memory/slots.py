"""The slot a fact's words name (pure): "User lives in Porto" is the fact of slot ``residence``.

A slot holds one value at a time: a new fact of a slot replaces the old one (the rules of
:mod:`~tiered_memory.layers.resolution`). The extractive rules
(:mod:`~tiered_memory.layers.extractive`) give the facts they write their slot; any other
fact, the model's, an application's, a judge's rewrite, is in the slot its words name
when they are the rules' words (:func:`stated_slot`). Below both the layers and the
stores: the store's migration that fills the slots of facts written without one reads them
here too.
"""

from __future__ import annotations

import re

RELATIONS = ("wife|husband|partner|girlfriend|boyfriend|son|daughter|brother|sister|mother|mom|mum|father|dad"
             "|dog|cat|boss|friend|colleague|manager")
DIETS = "vegetarian|vegan|pescatarian|lactose intolerant|gluten[- ]free"

_USER = r"^(?:the )?user"
#: a fact as the rules write it (and as applications often do: "User lives in Porto") -> its slot
_STATED: list[tuple[re.Pattern[str], str, int]] = [(re.compile(p, re.I), key, polarity) for p, key, polarity in [
    (_USER + r"'s name is (?P<x>.+)", "name", 1),
    (_USER + r" (?:now )?(?:lives|is living|resides) in (?P<x>.+)", "residence", 1),
    (_USER + r" (?:has )?(?:just |recently )?moved to (?P<x>.+)", "residence", 1),
    (_USER + r" (?:now )?works (?:at|for) (?P<x>.+)", "employer", 1),
    (_USER + r" is allergic to (?P<x>.+)", "allergy:{x}", 1),
    (_USER + r" (?:does not|doesn't|cannot|can't|never) eats? (?P<x>.+)", "diet:{x}", 1),
    (_USER + rf" is (?P<x>{DIETS})", "diet:{x}", 1),
    (_USER + r" (?:dislikes|hates|does not like|doesn't like) (?P<x>.+)", "pref:{x}", -1),
    (_USER + r" (?:likes|loves|enjoys|adores) (?P<x>.+)", "pref:{x}", 1),
    (_USER + r" prefers (?P<x>.+)", "prefer:{x}", 1),
    (_USER + r"'s favou?rite (?P<what>[a-z ]{2,30}?) is (?P<x>.+)", "favourite:{what}", 1),
    (_USER + rf"'s (?P<rel>{RELATIONS}) is (?:called |named )?(?P<x>.+)", "rel:{rel}", 1),
]]
_THEIR = re.compile(r"\btheir\b", re.I)


def _stated(text: str) -> tuple[str, int, str] | None:
    said = " ".join(text.replace("\u2019", "'").split()).rstrip(".!")
    for pattern, key_t, polarity in _STATED:
        found = pattern.fullmatch(said)
        if found:
            groups = {k: _THEIR.sub("my", v.strip()) for k, v in found.groupdict().items()}
            return normalize_key(key_t.format(**groups)), polarity, groups["x"]
    return None


def stated_slot(text: str) -> tuple[str, int] | None:
    """The slot (key, polarity) of a fact said of "User" in the words the rules write ("User
    lives in Porto" -> ``("residence", 1)``), so that it replaces the fact of that slot as the
    user's own "I moved to Porto" does; ``None`` for any other fact (pure)."""
    found = _stated(text)
    return None if found is None else found[:2]


def text_slot(text: str) -> tuple[str | None, int]:
    """The slot (key, polarity) a fact with ``text`` is in: the one its words name
    (:func:`stated_slot`), else none, ``(None, 1)`` (pure)."""
    return stated_slot(text) or (None, 1)


def stated_value(text: str) -> str | None:
    """What a fact in the rules' words says its slot holds, lower-cased ("User moved to Lisbon,
    Portugal" -> ``"lisbon, portugal"``; "User's sister is called Ana" -> ``"ana"``), so that
    the same value in other words is the same fact; ``None`` where :func:`stated_slot` is (pure)."""
    found = _stated(text)
    return None if found is None else " ".join(found[2].lower().split())


def normalize_key(key: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\b(?:the|a|an|my|some)\b", " ", key.lower())).strip()
