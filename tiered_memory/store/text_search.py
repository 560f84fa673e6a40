"""Keyword queries in each engine's own syntax, from the plain terms recall passes (pure),
and SQLite's same-text lookup for the near-duplicate check (given the store's ``query``).

Recall hands the stores a list of keywords; no query syntax crosses the protocol, so a
stored or typed word can never be read as an operator by either engine.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Any, Callable, Sequence

from ..textcache import holds_texts

_NON_WORD = re.compile(r"[^\w]+", re.UNICODE)


#: Letters to Python that SQLite's ``unicode61`` tables (Unicode 6.1) still hold to be marks,
#: so FTS5 splits a word at them: New Tai Lue vowel signs and tone marks, two Vedic signs (a
#: character class body). Found by trying every character Python reads as part of a word
#: (tests/test_isolation_paths.py does it again on the SQLite in use).
FTS5_SPLITTING_LETTERS = "\u19b0-\u19c0\u19c8\u19c9\u1cf2\u1cf3"

#: A word as FTS5's ``unicode61`` tokenizer reads one: letters and digits; ``_``, the
#: :data:`FTS5_SPLITTING_LETTERS` and every other character separate words. A word FTS5 split
#: again would leave its second piece without its user's tag, and that piece may be another
#: user's tag and word ("x" + a vowel sign + "2qsecret"): one user's rows would then crowd
#: another's out of their keyword matches.
_WORD = re.compile(f"[^\\W_{FTS5_SPLITTING_LETTERS}]+")


def user_tag(number: int) -> str:
    """The text glued in front of each of a user's words in the keyword index (pure):
    the user's number in the store, then ``q``. Digits then one letter is prefix-free, so
    ``tag + word`` names one user's word and never another user's (``1q`` + ``2qa`` can not
    be read as ``12q`` + ``a``: a tag's digits end at its first letter), and FTS5 keeps it
    one token (its porter stemmer reads the digits as consonants)."""
    return f"{number}q"


#: Tokens of the bare tag that lead every row's keywords. FTS5's ``bm25`` has no length
#: parameter to set; a constant added to every row's length softens its length
#: normalisation, as the three tokens of the benchmark's user ids did while the index had
#: a ``user_id`` column (they counted in the row's length). Without them recall@10 moved
#: +0.0004 on LoCoMo and -0.0030 on the real-chat set (short, split messages); with them
#: +0.0004 and +0.0006. The bare tag is never a query term: a word is never empty.
LENGTH_PAD = 3


def composed(text: str) -> str:
    """``text`` in Unicode NFC (pure): an accent typed as a letter and a combining mark (``e`` +
    U+0301, as macOS keyboards often send it) becomes the one letter (``é``). A mark is not a
    word character, so left apart it would split ``naïve`` into ``nai`` and ``ve``; composed, the
    word is whole and each engine folds it as it folds the precomposed letter. An ``i`` with a
    combining dot above, which no letter composes and which is what Python lower-cases Turkish
    ``İ`` to (``"İstanbul".lower()``), is read as ``i``: FTS5 drops that dot too, as the
    index folds ``İ`` itself. Only the keyword index and the keyword query see the composed
    form: stored text is never changed."""
    return text if text.isascii() else unicodedata.normalize("NFC", text).replace("i\u0307", "i")


#: Characters of the scripts written without spaces between words (Han, kana, and Hangul,
#: whose particles are glued to the word): a run of them is one "word" to FTS5 and to
#: PostgreSQL's parser, so ``北京`` would never match a turn saying ``我要去北京出差``. The
#: keyword index and the query read such a run as its overlapping character bigrams instead
#: (:func:`cjk_grams`), as Lucene's CJK analyzer does.
CJK = ("\u1100-\u11ff\u3005-\u3007\u3040-\u30ff\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
       "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003ffff")
_CJK_RUN = re.compile(f"([{CJK}]+)")


def is_cjk(text: str) -> bool:
    """Whether ``text`` is all :data:`CJK` characters (a lone one is a word of its own)."""
    return _CJK_RUN.fullmatch(text) is not None


def cjk_grams(word: str) -> list[str]:
    """``word`` (a run of word characters) with each run of :data:`CJK` characters in it read
    as its overlapping bigrams, a lone one as itself (pure): ``"去北京"`` -> ``["去北",
    "北京"]``, ``"東京2024"`` -> ``["東京", "2024"]``; any other word stays whole. The
    bigrams of a run follow each other, so a run asked as one phrase of its bigrams matches
    where it is written, and each bigram alone where part of it is."""
    if word.isascii() or _CJK_RUN.search(word) is None:
        return [word]
    out: list[str] = []
    for n, part in enumerate(_CJK_RUN.split(word)):
        if n % 2 == 0:  # between runs (re.split's even pieces)
            if part:
                out.append(part)
        elif len(part) == 1:
            out.append(part)
        else:
            out.extend(part[i:i + 2] for i in range(len(part) - 1))
    return out


def fts5_text(text: str) -> str:
    """``text`` as the FTS5 tables of facts, key points and items indexed it between their
    migration to CJK bigrams (``sqlite_layers.bigrams``) and the next, to per-user keywords
    (``sqlite_layers.tagged_index``) (pure): each run of :data:`CJK` characters written as
    its overlapping bigrams between spaces (a lone one as itself), as :func:`cjk_grams` reads a
    turn's; everything else as it is. ``"去北京 ok"`` -> ``" 去北 北京  ok"``.

    Only those migrations call it now, on a store that has not run them yet: its output for a
    stored text must never change."""
    if text.isascii() or _CJK_RUN.search(text) is None:
        return text
    return _CJK_RUN.sub(lambda m: " " + " ".join(cjk_grams(m.group(0))) + " ", text)


def index_words(text: str) -> list[str]:
    """The words of ``text`` as the keyword index and a keyword phrase read them (pure): the
    runs of word characters of :func:`composed` ``text`` (:data:`_WORD`), CJK runs as their
    bigrams (:func:`cjk_grams`)."""
    words = _WORD.findall(composed(text))
    return words if text.isascii() else [g for w in words for g in cjk_grams(w)]


def keyword_text(tag: str, text: str) -> str:
    """What the keyword index holds of ``text``: :data:`LENGTH_PAD` bare tags, then each of
    its words (:func:`index_words`) with the user's ``tag`` in front (pure). Case and diacritics
    are left to FTS5, which folds document and query alike."""
    words = index_words(text)
    pad = " ".join([tag] * LENGTH_PAD)
    return f"{pad} {tag}{(' ' + tag).join(words)}" if words else pad


def tagged_phrases(tag: str, terms: Sequence[str]) -> list[str]:
    """Each term as an FTS5 phrase of its tagged words (``"7qnew 7qyork"``), once (pure).
    Only word characters remain, so a term can never be read as an FTS5 operator; a term
    without a word makes no phrase."""
    terms = [terms] if isinstance(terms, str) else terms  # one term, not its characters
    out: dict[str, None] = {}
    for t in terms:
        words = index_words(t)
        if words:
            out['"' + " ".join(tag + w for w in words) + '"'] = None
    return list(out)


def tagged_any(tag: str, terms: Sequence[str]) -> str | None:
    """An FTS5 expression OR-ing the terms' :func:`tagged_phrases`, as the tables of facts, key
    points and items are asked (pure); ``None`` when no term holds a word. A term of CJK
    characters only is a prefix query (``"7q猫"*``): a lone character finds the user's bigrams
    it starts, and only the user's (a tag is prefix-free)."""
    terms = [terms] if isinstance(terms, str) else terms
    out: dict[str, None] = {}
    for t in terms:
        for phrase in tagged_phrases(tag, [t]):
            out[phrase + ("*" if is_cjk(t) else "")] = None
    return " OR ".join(out) if out else None


def tsquery_any(terms: Sequence[str]) -> str | None:
    """A ``to_tsquery`` expression OR-ing the terms' words (``a | b``), each :func:`composed`; a
    word holding a CJK run as the phrase of its bigrams (``去北 <-> 北京``), as the keyword
    column holds it. Only word characters survive, so the result is always valid tsquery syntax."""
    terms = [terms] if isinstance(terms, str) else terms
    words: list[str] = []
    for t in terms:
        for w in _NON_WORD.split(composed(t)):
            if not w:
                continue
            grams = cjk_grams(w)  # one or more
            w = grams[0] if len(grams) == 1 else "(" + " <-> ".join(grams) + ")"
            if w not in words:
                words.append(w)
    return " | ".join(words) if words else None


def diacritic_fold() -> tuple[str, str]:
    """The letters FTS5's ``unicode61`` tokenizer folds (its default ``remove_diacritics=1``)
    as the two strings of PostgreSQL's ``translate()`` (pure): the letters, then the marks
    alone; and each letter's base. A letter is folded when it is one ASCII letter plus one
    combining mark (``é``, ``Ü``, ``ş``, ``Å``: 375 of them); not ``ø``, ``ß`` or ``æ`` (no
    mark to remove), Vietnamese ``ệ`` (two marks), or Greek and Cyrillic letters, as in
    FTS5. ``translate`` deletes the marks (the second string is shorter), as FTS5 drops
    them from decomposed text (``e`` + U+0301). Canonical decompositions never change
    between Unicode versions, so neither does this map."""
    letters: list[str] = []
    bases: list[str] = []
    marks: dict[str, None] = {}
    for code in range(0xC0, 0x2200):  # the last such letter is U+212B, the angstrom sign
        parts = unicodedata.normalize("NFD", chr(code))
        if len(parts) == 2 and parts[0].isascii() and parts[0].isalpha() and unicodedata.category(parts[1]) == "Mn":
            letters.append(chr(code))
            bases.append(parts[0])
            marks[parts[1]] = None
    return "".join(letters) + "".join(marks), "".join(bases)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def text_key(text: str) -> str:
    """``lower(trim(text))`` as SQLite computes it (ASCII case, spaces at the ends) (pure)."""
    text = text.strip(" ")
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


def text_hash(text: str) -> int:
    """A signed 64-bit hash of :func:`text_key` (pure): what SQLite's ``same_text`` index holds."""
    return _key_hash(text_key(text))


def _key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big", signed=True)


def same_text_sqlite(query: Callable[[str, Sequence[Any]], list[tuple[Any, ...]]], user_id: str,
                     texts: Sequence[str]) -> dict[str, str]:
    """SQLite's ``same_text``: one range of the ``messages_user_text_hash`` index per 500
    hashes; the rows found are then compared whole (two texts may share a hash)."""
    keys = {t: text_key(t) for t in texts}
    hashes = sorted({_key_hash(k) for k in set(keys.values())})
    found: dict[str, str] = {}
    for start in range(0, len(hashes), 500):
        part = hashes[start:start + 500]
        for mid, key in query(
                "SELECT id, lower(trim(content)) FROM messages INDEXED BY messages_user_text_hash WHERE user_id=?"
                f" AND text_hash IN ({','.join('?' * len(part))}) AND indexed=1"
                " AND duplicate_of IS NULL ORDER BY rowid", [user_id, *part]):
            found.setdefault(key, mid)
    return {t: found[k] for t, k in keys.items() if k in found}


#: Below this many rows of one user, keyword search reads that user's rows through the
#: b-tree on ``user_id`` and matches each; at or above it, through the GIN index on the
#: ``tsvector``. The GIN index holds every user's rows, so for a common term it returns
#: the matches of the whole store and only then drops other users' (measured: a
#: 100-memory user's search cost ~275 ms of record-store time in a 1,000,000-memory
#: store, bench/README.md). A user's own rows are cheap to match until there are many.
USER_SCAN_ROWS = 20_000


def scan_user_rows(rows: int, threshold: int = USER_SCAN_ROWS) -> bool:
    """Whether a keyword search should start from the user's ``rows`` rows (pure): true
    below ``threshold``. ``rows`` may be counted only up to ``threshold`` (a bounded count)."""
    return rows < threshold


#: A keyword search leaves out the terms found in more than this share of the store's
#: rows when rarer ones remain: such a term's posting list is most of the work (a query of
#: a 30,000-memory user matched a median 13,700 of 50,000 rows, a third of its terms were
#: in over 10% of them; keyword search 22 -> 5 ms), and BM25 weighs it little (FTS5's idf
#: of a term in 10% of the rows is a third of a rare term's; from half of them, nothing).
#: The query's words still score every candidate (``recall/coverage.py``). Forced on the
#: small dev stores too, recall@10 moved -0.003 on LoCoMo and +0.007 on the real-chat set.
COMMON_SHARE = 0.1
SELECTIVE_FROM_ROWS = 1000  # a store, or a user, below this many rows keeps every term: posting lists are
# short (the user column bounds the walk to the user's rows), and a few rows' share says little


def selective_terms(terms: Sequence[str], df: dict[str, int], rows: int, share: float = COMMON_SHARE) -> list[str]:
    """``terms`` without those in more than ``share`` of ``rows`` (``df``: rows per term),
    unless that leaves none; then all of them (pure). A store below
    :data:`SELECTIVE_FROM_ROWS` keeps all."""
    if rows < SELECTIVE_FROM_ROWS:
        return list(terms)
    kept = [t for t in terms if df.get(t, 0) <= share * rows]
    return kept or list(terms)


class TermCounts:
    """How many rows of an FTS5 table hold each term, counted once per term and counted
    again once the table has grown by a quarter (``count(term)`` runs the engine's own
    match of the term, so stemming and tokenizing agree with the search)."""

    def __init__(self, count: Callable[[str], int]) -> None:
        self._count = count
        self._seen: dict[str, tuple[int, int]] = {}  # term -> (rows holding it, table rows then)
        holds_texts(self)  # a term is a user's word

    def cache_clear(self) -> None:
        self._seen = {}

    def of(self, terms: Sequence[str], rows: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in terms:
            found = self._seen.get(t)
            if found is None or rows > found[1] * 1.25 + 100:
                if len(self._seen) > 50_000:
                    self._seen.clear()
                found = self._seen[t] = (self._count(t), rows)
            out[t] = found[0]
        return out
