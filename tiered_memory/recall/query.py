"""Reading a query without an LLM: its keywords and keyword (FTS) expression, the proper
names and dates it mentions, whether it asks *when*, and whether it asks for several things.

Pure functions; :mod:`.scoring` scores turns with the :class:`QueryPlan` built here
(and re-exports these names, which were defined there first).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache

from ..store.text_search import cjk_grams, composed, is_cjk
from ..textcache import holds_texts

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)

STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    did does ever also get got like really would could should much many""".split()
)


# ASCII text is split by bytes.translate, several times quicker than the regex (and than
# str.translate) and the same words: every ASCII character that is not a letter or a digit becomes
# a space (_TOKEN's runs), and for _WORD's runs (\w+) every one but "_"
_TOKEN_BYTES = bytes(c if c < 128 and chr(c).isalnum() else 32 for c in range(256))
_WORD_BYTES = bytes(c if c < 128 and (chr(c).isalnum() or c == 95) else 32 for c in range(256))


def ascii_tokens(lower: str) -> list[str]:
    """The runs of letters and digits of a lower-cased ASCII text (``_TOKEN``'s)."""
    return ascii_spaced(lower).split()


def ascii_spaced(lower: str) -> str:
    """A lower-cased ASCII text with every character that is not a letter or a digit made a
    space: a word ``w`` of :func:`ascii_tokens` is there as ``" w "`` once the text is padded
    with a space at each end (a test that makes no word objects)."""
    return lower.encode().translate(_TOKEN_BYTES).decode()


def words(lower: str) -> list[str]:
    """The runs of word characters (``\\w+``) of a lower-cased text (:func:`composed`: a
    combining mark typed apart does not split a word)."""
    if lower.isascii():
        return lower.encode().translate(_WORD_BYTES).decode().split()
    return _WORD.findall(composed(lower))


def _tokens(lower: str) -> list[str]:
    """The runs of letters and digits of a lower-cased text (``_TOKEN``), :func:`composed`."""
    return ascii_tokens(lower) if lower.isascii() else _TOKEN.findall(composed(lower))


def keywords(text: str) -> list[str]:
    """Lower-cased content words of ``text`` in order, without stopwords or repeats; a run of
    Chinese, Japanese or Korean characters gives its bigrams, as the keyword index holds it
    (:func:`~tiered_memory.store.text_search.cjk_grams`), and a lone such character is a word."""
    seen: dict[str, None] = {}
    lower = text.lower()
    tokens = _tokens(lower)
    if not lower.isascii():
        tokens = [g for tok in tokens for g in cjk_grams(tok)]
    for tok in tokens:
        if tok not in STOPWORDS and (len(tok) > 1 or tok.isdigit() or is_cjk(tok)):
            seen.setdefault(tok, None)
    return list(seen)


#: the most keywords a query is searched by, its first: every store ORs them in one expression,
#: and a document pasted as a query (each two characters of a CJK run a term: 30,000 of them)
#: nests too deep for PostgreSQL's tsquery and costs seconds in either store. A question has tens.
MAX_QUERY_TERMS = 1000


def query_terms(text: str) -> list[str]:
    """The keywords a query is searched by: its first :data:`MAX_QUERY_TERMS` :func:`keywords`."""
    return keywords(text)[:MAX_QUERY_TERMS]


# ---- query analysis ----------------------------------------------------------
_MONTHS: dict[str, int] = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
_MONTHS.update({m.lower(): i for i, m in enumerate(calendar.month_abbr) if m})
_MONTHS["sept"] = 9
_MON = (r"(january|february|march|april|may|june|july|august|september|october|november|"
        r"december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?")
_DAY_MON_YEAR = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MON + r",?\s+((?:19|20)\d\d)\b", re.I)
_MON_DAY_YEAR = re.compile(r"\b" + _MON + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+((?:19|20)\d\d)\b", re.I)
_MON_YEAR = re.compile(r"\b" + _MON + r",?\s+((?:19|20)\d\d)\b", re.I)
_YEAR = re.compile(r"\b((?:19|20)\d\d)\b")
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday"
# a time expression: one of these whole words (a maximal run of word characters), a year, or
# "this/that <part of the day or year>" (has_time_expression reads the words once, not the regex)
_TIME_WORDS = frozenset(
    "yesterday today tonight tomorrow recently lately ago last next since weekend day days week weeks month "
    "months year years".split()) | frozenset(_MONTHS) | frozenset(_WEEKDAYS.split())
_YEAR_DIGITS = re.compile(r"(?:19|20)\d\d")  # _YEAR without its word ends: 3x quicker to rule a text out
_THIS_THAT_WORDS = frozenset(("this", "that"))
_TIME_OR_THIS_THAT = _TIME_WORDS | _THIS_THAT_WORDS
_WORD = re.compile(r"\w+")
_THIS_THAT = re.compile(r"\b(?:this|that) (?:morning|afternoon|evening|night|week|month|year|summer|winter|spring|"
                        r"fall)\b")
_TEMPORAL_QUESTION = re.compile(
    r"^\W*(?:when\b|what (?:date|day|time|year|month|week)\b|how long\b|"
    r"(?:in |on |during )?(?:which|what) (?:year|month|day|week|date)\b)", re.I)
_NAME = re.compile(r"\b[A-Z][\w'’-]*")
# a question whose answer is a list gathered over time: "how many times", "what kinds of",
# "what books has ... read", "where has Mel camped" (a present perfect over a named subject)
_LISTING_CUE = re.compile(
    r"\b(?:how many|in what ways|what (?:kinds|types|sorts) of|what are some|both|ever|names)\b", re.I)
_PLURAL_ASKED = re.compile(
    r"\b(?:what|which)\s+(?:[\w+-]+\s+){0,2}?[\w+-]*[^\Ws]s\s+(?:has|have|does|do|did|are|were)\b", re.I)
_PERFECT = re.compile(r"\b(?:has|have)\s+[A-Z][\w'’-]*(?:\s+and\s+[A-Z][\w'’-]*)?\s+(?:ever\s+)?[a-z]+")
_POINT_IN_TIME = re.compile(r"^\W*(?:when|how long)\b", re.I)
# the kind of answer a question asks for (answer-type matching; recall/answers.py reads the turns)
NUMBER, PLACE, PERSON, NAME = "number", "place", "person", "name"
KINDS = (NUMBER, PLACE, PERSON, NAME)

_ASKS_NUMBER = re.compile(
    r"^\W*(?:how (?:many|much|long|old|often|far)\b|what (?:age|number|percentage|score)\b)", re.I)
_ASKS_PLACE = re.compile(
    r"^\W*where\b|\b(?:which|what) (?:city|country|state|place|town|location|restaurant|park)\b", re.I)
_ASKS_PERSON = re.compile(r"^\W*(?:who|whom|whose)\b", re.I)
_ASKS_NAME = re.compile(
    r"\bname of\b|\bcalled\b|^\W*(?:what|which) (?:book|movie|song|band|game|artist|show|novel|album|series)s?\b",
    re.I)


@dataclass(frozen=True, kw_only=True)
class QueryPlan:
    """What recall reads from a query, without an LLM.

    ``terms`` are the keywords (content words, stopwords dropped; the first
    :data:`MAX_QUERY_TERMS`) each backend ORs in its own syntax, ``names``
    the proper names it mentions, ``dates`` the ``(start, end)`` epoch ranges of the
    dates it names, ``temporal`` whether it asks *when*, ``listing`` whether it asks for
    several things (:func:`is_listing_question`), ``answer`` the kind of answer it asks for
    (:func:`answer_kind`).
    """

    text: str
    terms: tuple[str, ...]
    names: frozenset[str] = frozenset()
    dates: tuple[tuple[float, float], ...] = ()
    temporal: bool = False
    listing: bool = False
    answer: str | None = None


def proper_names(text: str) -> frozenset[str]:
    """Capitalised words that are not stopwords (``"What did Caroline's dog do?"`` ->
    ``{"Caroline"}``); possessive ``'s`` removed."""
    out = set()
    for word in _NAME.findall(text):
        word = re.sub(r"['’]s$", "", word).strip("'’-")
        if len(word) > 1 and word.lower() not in STOPWORDS and word.lower() not in _MONTHS \
                and word.lower() not in _WEEKDAYS.split():
            out.add(word)
    return frozenset(out)


def _utc(year: int, month: int, day: int) -> float:
    return datetime(year, month, day, tzinfo=timezone.utc).timestamp()


def date_ranges(text: str) -> tuple[tuple[float, float], ...]:
    """The dates ``text`` names, each as an epoch ``(start, end)`` range (UTC).

    ``"7 May 2023"`` / ``"May 7, 2023"`` is that day, ``"May 2023"`` the month,
    ``"2023"`` the year. Impossible dates are skipped. A date is matched once, by
    its most precise form.
    """
    out: list[tuple[float, float]] = []
    rest = text
    for rx, kind in ((_DAY_MON_YEAR, "dmy"), (_MON_DAY_YEAR, "mdy"), (_MON_YEAR, "my"), (_YEAR, "y")):
        for m in rx.finditer(rest):
            try:
                if kind == "dmy":
                    start = _utc(int(m[3]), _MONTHS[m[2].lower()], int(m[1]))
                    end = start + 86400
                elif kind == "mdy":
                    start = _utc(int(m[3]), _MONTHS[m[1].lower()], int(m[2]))
                    end = start + 86400
                elif kind == "my":
                    year, month = int(m[2]), _MONTHS[m[1].lower()]
                    start = _utc(year, month, 1)
                    end = _utc(year + (month == 12), month % 12 + 1, 1)
                else:
                    start, end = _utc(int(m[1]), 1, 1), _utc(int(m[1]) + 1, 1, 1)
            except (ValueError, KeyError):
                continue  # e.g. 31 February: a less precise pattern may still read it
            out.append((start, end))
            rest = rest[: m.start()] + " " * (m.end() - m.start()) + rest[m.end():]
    return tuple(out)


def answer_kind(question: str) -> str | None:
    """The kind of answer ``question`` asks for (one of :data:`KINDS`), or None: ``"How many
    kids ...?"`` -> ``"number"``, ``"Where did ...?"`` -> ``"place"``, ``"Who ...?"`` ->
    ``"person"``, ``"What is the name of ...?"`` / ``"What book ...?"`` -> ``"name"``."""
    for kind, asks in ((NUMBER, _ASKS_NUMBER), (PLACE, _ASKS_PLACE), (PERSON, _ASKS_PERSON), (NAME, _ASKS_NAME)):
        if asks.search(question):
            return kind
    return None


def is_temporal_question(text: str) -> bool:
    """Does the query ask *when* (``when``, ``what year``, ``how long``, ``in which month``)?"""
    return bool(_TEMPORAL_QUESTION.search(text))


def is_listing_question(text: str) -> bool:
    """Does the query ask for several things, told over time (``"What books has Mel
    read?"``, ``"How many times did Jon go hiking?"``, ``"What kinds of art does Caroline
    make?"``, ``"Where has Mel camped?"``)? Such answers are spread over sessions; a *when*
    or *how long* question asks for one point in time, so it never is one."""
    if _POINT_IN_TIME.search(text):
        return False
    return bool(_LISTING_CUE.search(text) or _PLURAL_ASKED.search(text) or _PERFECT.search(text))


@holds_texts
@lru_cache(maxsize=16384)  # the same turns come back query after query
def has_time_expression(text: str) -> bool:
    """Does ``text`` place something in time (``yesterday``, ``last week``, ``May``, ``2022``)?"""
    lower = text.lower()
    found = _TIME_OR_THIS_THAT.intersection(words(lower))
    if found - _THIS_THAT_WORDS or (_YEAR_DIGITS.search(lower) and _YEAR.search(lower)):  # a year as a word
        return True
    return bool(found) and bool(_THIS_THAT.search(lower))


_BRACKETED = re.compile(r"\[[^\]]*\]")
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")  # after a sentence's end mark, or a line break


def question_share(text: str) -> float:
    """The share of ``text``'s sentences that are questions (end with ``?``), bracketed
    notes such as ``[shares a photo]`` left out; 0.0 for a text without sentences."""
    # no question mark, no question: most turns have none, and this test costs a fifth of a
    # look in the cache (a search asks it of every candidate)
    return _question_share(text) if "?" in text else 0.0


@holds_texts
@lru_cache(maxsize=16384)
def _question_share(text: str) -> float:
    sentences = [p.strip() for p in SENTENCE_BREAK.split(_BRACKETED.sub(" ", text)) if p.strip()]
    if not sentences:
        return 0.0
    return sum(1 for p in sentences if p.endswith("?")) / len(sentences)


# Words that react and name nothing: laughter, surprise, assent, thanks, praise. A message of
# these (and stopwords) hands on no topic; what it reacts to is the message before it.
REACTION_WORDS = frozenset(
    """lol lmao lmfao rofl haha hahaha hehe heh omg omfg wow whoa woah nice cool yeah yea yes yep yup
    ya yah ok okay kk sure aww aw ikr true damn dang hmm hm thx thanks thank ty np love awesome amazing
    great wait really real way oh ah ahh ooh uh um nope nah lovely congrats cute sweet right exactly
    totally agreed fair gosh yikes ugh welcome sounds fun good glad wonderful perfect""".split())
_LAUGHTER = re.compile(r"(?:[ha]h?a|he|hi|ja|je|lo)+h?$")  # "hahah", "hehe", "lolol"
_SPEAKER_LEAD = re.compile(r"^\s*[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2}\s*:\s")
_HELD = re.compile(r"(\w)\1+")  # "yesss", "sooo": a letter held for effect


def _reacts(word: str) -> bool:
    if word in REACTION_WORDS:
        return True
    if _LAUGHTER.match(word):
        return True
    if _HELD.search(word) is None:
        return False
    once, twice = _HELD.sub(r"\1", word), _HELD.sub(r"\1\1", word)
    return once in REACTION_WORDS or once in STOPWORDS or twice in REACTION_WORDS


def is_reaction(text: str) -> bool:
    """Whether a message only reacts ("lol", "omg yes", "so cool!!", "yesss", an emoji) and
    names nothing: every content word (as :func:`keywords` reads them, a leading ``"Name: "``
    left out) is one of :data:`REACTION_WORDS` or laughter, and nothing is in brackets (a
    shared photo's caption is content). "Paris!", "new job!" and "I went to Rome" are not
    reactions. Cheap: a search asks it of the turns it fetches, and short texts are cached."""
    return len(text) <= 80 and "[" not in text and _short_reaction(text)


@holds_texts
@lru_cache(maxsize=65536)
def _short_reaction(text: str) -> bool:
    if ":" in text:
        text = _SPEAKER_LEAD.sub("", text, count=1)
    for w in _tokens(text.lower()):
        if w in REACTION_WORDS or w in STOPWORDS or (len(w) == 1 and not w.isdigit()):
            continue
        if not _reacts(w):
            return False
    return True


def plan_query(text: str) -> QueryPlan:
    """Analyse a query: keyword expression, names, dates, whether it asks *when*, whether it
    asks for several things, and the kind of answer it asks for."""
    return QueryPlan(text=text, terms=tuple(query_terms(text)), names=proper_names(text),
                     dates=date_ranges(text), temporal=is_temporal_question(text),
                     listing=is_listing_question(text), answer=answer_kind(text))
