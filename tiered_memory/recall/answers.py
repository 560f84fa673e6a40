"""What kind of answer a question asks for, and whether a turn holds one: answer-type
matching, the oldest trick of question answering, without an LLM. A *how many* question is
answered by a number, a *where* question by a place, a *who* question by a person, and *what
is the name of* / *what book* by a name or a title; a turn that holds nothing of the kind is
less likely to be the answer, however close its words. :func:`.query.answer_kind` reads the
question (``QueryPlan.answer``); this module reads the turns. Pure; :mod:`.fusion` reads it as
the ``answer_type`` signal.

The tests are deliberately plain, and English: a number is digits or a number word, a place is
a capitalised word after a place preposition (``in Paris``, ``from Sweden``), a person or name
is a capitalised word inside a sentence that is not one of the chat's own participants (they
are greeted and addressed all the time: ``Thanks, Mel!``), and a title is also anything in
quotes.
"""

from __future__ import annotations

import calendar
import re
from functools import lru_cache
from typing import Collection

from ..textcache import holds_texts
from .query import NAME, NUMBER, PERSON, PLACE, STOPWORDS, words
from .scoring import without_speaker

_NUMBER_WORDS = ("one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty forty "
                 "fifty hundred thousand dozen couple first second third once twice")
_NUMBER_WORD = frozenset(_NUMBER_WORDS.split())
_DIGIT = re.compile(r"\d")
_PLACE = re.compile(r"\b(?:in|at|to|from|near|around|visited|visit)\s+(?:the\s+)?[A-Z][a-z]")
_CAPITALISED = re.compile(r"\b[A-Z][a-z][\w'’-]*")
_QUOTED = re.compile(r"[\"“][^\"”]{2,}[\"”]")
_POSSESSIVE = re.compile(r"['’]s$")
_CALENDAR = frozenset(n.lower() for n in (*calendar.month_name, *calendar.day_name) if n)


def holds_answer(kind: str, text: str, participants: Collection[str] = ()) -> bool:
    """Does ``text`` (a leading ``"Name: "`` left out) hold an answer of ``kind``? A person or a
    name must be a capitalised word inside a sentence that is none of ``participants`` (the
    chat's speakers and the names the question itself mentions)."""
    if kind == NUMBER:
        return _has_number(text)
    if kind == PLACE:
        return _has_place(text)
    if kind in (PERSON, NAME):
        if kind == NAME and _QUOTED.search(text):
            return True
        return any(word not in participants for word in capitalised(text))
    return False


@holds_texts
@lru_cache(maxsize=16384)  # the same turns come back query after query
def _has_number(text: str) -> bool:
    """A digit, or a number word as a whole word (a set test: a regex of the words with
    ``re.I`` cost 60 us a turn)."""
    body = without_speaker(text)
    return bool(_DIGIT.search(body)) or not _NUMBER_WORD.isdisjoint(words(body.lower()))


@holds_texts
@lru_cache(maxsize=16384)
def _has_place(text: str) -> bool:
    return bool(_PLACE.search(without_speaker(text)))


@holds_texts
@lru_cache(maxsize=16384)
def capitalised(text: str) -> frozenset[str]:
    """The capitalised words of ``text`` that stand inside a sentence (not its first word), a
    leading ``"Name: "`` left out, possessive ``'s`` removed; stopwords, months and weekdays
    are not names."""
    body = without_speaker(text)
    out = set()
    for m in _CAPITALISED.finditer(body):
        j = m.start() - 1
        while j >= 0 and body[j].isspace():
            j -= 1
        if j < 0 or body[j] in ".!?\"“'(":
            continue  # a sentence's first word is capitalised whatever it is
        word = _POSSESSIVE.sub("", m[0])
        if word.lower() not in STOPWORDS and word.lower() not in _CALENDAR:
            out.add(word)
    return frozenset(out)
