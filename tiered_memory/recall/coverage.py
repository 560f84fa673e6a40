"""How much of a query a turn, its exchange, or its session covers: pure keyword signals
computed on the candidate pool, no I/O.

BM25 scores a turn alone. Conversations spread an answer over messages (a question and
its reply, a thought sent as three short messages) and over a session, so recall also
reads the query's terms against larger keys built from the pool:

- a turn's **exchange** (the turn plus the one before it; the earlier turn's terms count
  :data:`PREVIOUS_SHARE`), the keyword side of indexing a memory under several keys;
- its **session** (every candidate turn of the session together), so a session that
  covers the query's terms across turns lifts them (a session-level keyword score).

Terms are weighted by their rarity in the pool (``log(1 + N / (1 + df))``), so the name
that starts every turn of a person counts little and the rare word much. Words are
compared by a light stem (:func:`stem`) so ``painted`` meets ``painting``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

from ..textcache import holds_texts
from .query import STOPWORDS, ascii_spaced, ascii_tokens, keywords

PREVIOUS_SHARE = 0.5
_SUFFIXES = ("ings", "ing", "edly", "ed", "ies", "es", "ly", "s")


@holds_texts
@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light suffix strip (``painting`` / ``painted`` / ``paints`` -> ``paint``); words of
    four letters or fewer, and stems that would fall below three letters, stay whole."""
    if len(word) <= 4:
        return word
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out = word[: -len(suffix)]
            return out + "y" if suffix == "ies" else out
    return word


_VOWELS = frozenset("aeiouy")


@holds_texts
@lru_cache(maxsize=65536)
def fact_stem(word: str) -> str:
    """The stem fact matching compares (:func:`fact_stems`): fuller than :func:`stem`, so a
    verb's forms meet. ``lives`` / ``lived`` / ``living`` / ``live`` -> ``live``, ``dances`` /
    ``dancing`` -> ``danc`` (a final ``e`` goes, but after one syllable that ends in a
    consonant, which ``-ing`` / ``-ed`` give back: ``hoping`` -> ``hope``, ``hopping`` -> ``hop``,
    and ``cute`` is not ``cut``), ``studies`` / ``studied`` -> ``study``, ``running`` -> ``run``,
    ``used`` / ``using`` -> ``use``, ``tied`` / ``tying`` -> ``tie``; an irregular verb's forms
    (:data:`IRREGULAR_VERBS`: ``wrote`` / ``written``) its base's. Words of three letters or
    fewer stay whole, no stem falls below three letters, ``-ss`` / ``-us`` / ``-is`` keep their
    ``s`` (``glass``, ``bonus``, ``tennis``), ``-eed`` its ``ed`` (``need``), and ``-ly`` goes only
    where four letters stay that end in neither ``i`` nor a double letter (``lately``, not
    ``early``, ``apply``, ``family``, ``supply``)."""
    kept = _KEPT.get(word)
    return _by_rules(word) if kept is None else kept


def _by_rules(word: str) -> str:
    """:func:`fact_stem` by the suffix rules alone."""
    if len(word) <= 3:
        return word
    out = _strip(word)
    return out[:-1] if out.endswith("e") and len(out) > 3 and not _one_syllable(out[:-1]) else out


def _one_syllable(root: str) -> bool:
    """Whether ``root`` is one syllable that ends in a vowel and a consonant other than w, x or
    y (``hop``, ``plan``, ``writ``, ``quit``: a ``u`` after ``q`` is no vowel): the root whose
    final ``e`` tells two words apart (``hope`` / ``hop``) and which doubles its consonant before
    ``-ing`` / ``-ed`` when it has no ``e`` (``hopping``)."""
    vowels = [c in _VOWELS and not (c == "u" and i and root[i - 1] == "q") for i, c in enumerate(root)]
    return (len(root) >= 3 and root[-1] not in "wxy" and not vowels[-1] and vowels[-2] and not vowels[-3]
            and not any(vowels[:-2]))


def _strip(word: str) -> str:
    """``word`` less its suffix (the final ``e`` is :func:`fact_stem`'s)."""
    for suffix in ("ings", "ing"):
        if word.endswith(suffix):
            rest = word[: -len(suffix)]
            if len(rest) == 2 and rest[1] == "y" and rest[0] not in _VOWELS:
                return rest[0] + "ie"  # tying, lying, dying
            root = _verb_root(rest)
            if root is not None:
                return root
    if word.endswith(("ies", "ied")):  # studies -> study, tries -> try; ties -> tie
        rest = word[:-3]
        return rest + "y" if len(rest) >= 3 or (len(rest) == 2 and not _VOWELS.intersection(rest)) else word[:-1]
    for suffix in ("edly", "ed"):
        if word.endswith(suffix) and not word.endswith("e" + suffix):  # need, speed: no -ed
            root = _verb_root(word[: -len(suffix)])
            if root is not None:
                return root
    if word.endswith("ly") and len(word) >= 6 and word[-3] != "i" and word[-3] != word[-4]:
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]  # boxes -> boxe -> box: fact_stem drops the e
    return word


def _verb_root(rest: str) -> str | None:
    """What ``-ed`` / ``-ing`` leaves: ``rest`` undoubled (``runn`` -> ``run``), or with the ``e``
    of a one-syllable root restored (``hop`` -> ``hope``, ``us`` -> ``use``); None when it is no
    root (``th`` of ``thing``, ``go`` of ``going``, ``sh`` of ``shed``, ``str`` of ``string``)."""
    if len(rest) >= 3 and _VOWELS.intersection(rest):
        last = rest[-1]
        if len(rest) >= 4 and last == rest[-2] and last not in _VOWELS and last not in "lsfz":
            return rest[:-1]
        return rest + "e" if _one_syllable(rest) else rest
    if len(rest) == 2 and rest[1] not in _VOWELS and _VOWELS.intersection(rest):
        return rest + "e"  # using, used, aged, iced
    return None


#: irregular verbs chat uses, each line a base and its forms that the suffix rules do not bring
#: to it (``saw`` is here though it is a tool; ``left``, ``lay``, ``rose``, ``bit``, ``shot``,
#: ``stuck``, ``thought``, ``ground`` and ``wound`` are not: each is as often another word, or a
#: noun whose plural would stay apart: ``shots``, ``thoughts``). Fact matching leaves out the stop
#: words (``was``, ``has``, ``did``) and every form of be, have, do and get (:func:`fact_stems`).
IRREGULAR_VERBS = """be am is are was were been being
have has had having
do does did done doing
go goes going went gone
get got gotten
say said
make made
see saw seen
come came
become became
take took taken
give gave given
find found
tell told
know knew known
feel felt
meet met
run ran
sit sat
win won
buy bought
bring brought
teach taught
catch caught
fight fought
seek sought
hear heard
hold held
sell sold
stand stood
understand understood
pay paid
lose lost
keep kept
sleep slept
send sent
spend spent
lend lent
build built
mean meant
lead led
feed fed
begin began begun
drink drank drunk
sing sang sung
swim swam swum
grow grew grown
throw threw thrown
fly flew flown
draw drew drawn
wear wore worn
drive drove driven
ride rode ridden
write wrote written
eat ate eaten
fall fell fallen
forget forgot forgotten
choose chose chosen
break broke broken
wake woke woken
speak spoke spoken
freeze froze frozen
hide hid hidden
shake shook shaken
steal stole stolen
hang hung
dig dug
agree agreed
disagree disagreed
free freed
guarantee guaranteed"""

# the stems the rules do not give: each irregular form its base's; "news" and "evening(s)" are no
# forms of "new" and "even", and "buses" has no e ("cases" has: "case")
_KEPT: dict[str, str] = {"news": "news", "evening": "evening", "evenings": "evening", "buses": "bus"}
for _base, *_forms in (line.split() for line in IRREGULAR_VERBS.splitlines()):
    _KEPT.update(dict.fromkeys(_forms, _by_rules(_base)))


# one-character words that are not digits, which :func:`~.query.keywords` leaves out (an ASCII
# text's words are ASCII, so these are all of them there)
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")


def content_words(text: str) -> Iterable[str]:
    """The content words of ``text``, unstemmed: those of :func:`~.query.keywords`. An ASCII
    text takes set operations instead of a loop over its words (a few times quicker; at
    30,000 memories most texts a search meets are no longer in the caches below)."""
    lower = text.lower()
    return keywords(text) if not lower.isascii() else set(ascii_tokens(lower)) - STOPWORDS - _LETTERS


@holds_texts
@lru_cache(maxsize=16384)  # the same turns come back query after query
def stems(text: str) -> frozenset[str]:
    """The stemmed content words of ``text`` (:func:`content_words`, by :func:`stem`)."""
    return frozenset(map(stem, content_words(text)))


@holds_texts
@lru_cache(maxsize=16384)
def fact_stems(text: str) -> frozenset[str]:
    """The content words of ``text`` (:func:`content_words`) by :func:`fact_stem`: what fact
    matching (:func:`~tiered_memory.layers.resolution.says_all_of`) compares, so the user's
    "I live in Berlin" says the fact "User lives in Berlin". Recall keeps :func:`stem`: this
    stemming, measured on LoCoMo, lost recall (bench/README.md, 7 December). The forms of the
    verbs that are stop words (be, have, do, get: "getting", "done") are left out with them."""
    return frozenset(map(fact_stem, content_words(text))) - _STOP_VERBS


# "got" and "did" are stop words, "getting" and "done" not: stemmed, the first forms' stems
_STOP_VERBS = frozenset(map(fact_stem, ("be", "have", "do", "get")))


FORMS_UP_TO = 64  # query terms; measured: at 80 terms a look per term costs as much as stemming the text


class TermsHeld:
    """Which of a query's stemmed terms a text holds: ``stems(text) & terms``, without
    splitting the text into words or stemming them. A word stems to ``t`` only if it is ``t``,
    ``t`` with one of the suffixes :func:`stem` strips, or (``t`` ending in ``y``) ``t`` less
    its ``y`` with ``ies``: each such form that does stem to ``t`` is looked for as a whole word
    in the text, and only when the text holds the start they all share. A text that is not
    ASCII takes :func:`stems`, and so does every text for a query of over :data:`FORMS_UP_TO`
    terms (a long message as a query), for which one look per term costs more than stemming.
    (A search meets hundreds of texts, most for the first time.)"""

    def __init__(self, terms: Iterable[str]) -> None:
        self.terms = frozenset(terms)
        self._forms: list[tuple[str, str, list[str]]] = []  # (term, the start its forms share, " form "s)
        for t in sorted(self.terms) if len(self.terms) <= FORMS_UP_TO else ():
            ies = (t[:-1] + "ies",) if t.endswith("y") else ()
            words = [w for w in (t, *(t + x for x in _SUFFIXES if x != "ies"), *ies)
                     if stem(w) == t and w not in STOPWORDS and w not in _LETTERS]
            if words:
                self._forms.append((t, t[:-1] if t.endswith("y") else t, [f" {w} " for w in words]))

    def __call__(self, text: str) -> frozenset[str]:
        lower = text.lower()
        if not lower.isascii() or len(self.terms) > FORMS_UP_TO:
            return stems(text) & self.terms
        spaced = ""
        held = []
        for term, start, forms in self._forms:
            if start in lower:
                spaced = spaced or f" {ascii_spaced(lower)} "
                for f in forms:  # a loop, not any(): a search makes hundreds of these tests
                    if f in spaced:
                        held.append(term)
                        break
        return frozenset(held)


def term_weights(query_terms: Sequence[str], texts: Sequence[str],
                 held: Sequence[frozenset[str]] | None = None) -> dict[str, float]:
    """Each stemmed query term's weight: ``log(1 + N / (1 + df))`` over ``texts``. ``held``:
    each text's terms (:class:`TermsHeld` of the query's stemmed terms), when the caller has them."""
    wanted = sorted({stem(t) for t in query_terms})  # in order: the weights are summed in it, whatever the hash seed
    if held is None:
        held = list(map(TermsHeld(wanted), texts))
    df = dict.fromkeys(wanted, 0)
    for found in held:
        for s in found:
            df[s] += 1
    n = len(texts)
    return {t: math.log(1.0 + n / (1.0 + d)) for t, d in df.items()}


def coverage(own: frozenset[str], weights: Mapping[str, float], extra: frozenset[str] = frozenset(),
             extra_share: float = PREVIOUS_SHARE) -> float:
    """Weighted share of the query's terms in ``own`` (1.0 each) or only in ``extra``
    (``extra_share`` each); 0.0 when the query has no terms."""
    total = sum(weights.values())
    if total <= 0:
        return 0.0
    got = sum(w for t, w in weights.items() if t in own)
    got += extra_share * sum(w for t, w in weights.items() if t in extra and t not in own)
    return got / total


def exchange_coverage(texts: Mapping[str, str], previous: Mapping[str, str],
                      weights: Mapping[str, float]) -> dict[str, float]:
    """Per turn id: the coverage of the turn with the turn before it (when in ``texts``)."""
    out = {}
    for i, text in texts.items():
        prev = previous.get(i)
        extra = stems(texts[prev]) if prev is not None and prev in texts else frozenset()
        out[i] = coverage(stems(text), weights, extra)
    return out


def session_coverage(texts: Mapping[str, str], sessions: Mapping[str, str],
                     weights: Mapping[str, float]) -> dict[str, float]:
    """Per session: the coverage of all its turns in ``texts`` together."""
    bags: dict[str, set[str]] = {}
    for i, text in texts.items():
        bags.setdefault(sessions[i], set()).update(stems(text))
    return {s: coverage(frozenset(bag), weights) for s, bag in bags.items()}

