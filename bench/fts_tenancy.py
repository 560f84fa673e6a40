"""What a user's keyword query costs as the store around them grows, for three ways of
keeping users apart in one SQLite FTS5 table.

One user holds 3,000 LoCoMo-style turns among ``--rows`` rows of 50 other users; 200
LoCoMo questions are asked as the library asks them (content words OR-ed, best 200):

- ``user column``: the library's index today: ``content`` and ``user_id`` columns, the
  user's id AND-ed as a phrase of its column, ranked by ``bm25``;
- the same without ranking (the match alone, best 200 by rowid, then every match);
- ``tagged tokens``: one ``content`` column whose every word carries a per-user tag glued
  in front (consonants only, so the porter stemmer treats the word as it would alone):
  a user's posting lists hold only their rows (the prototype of what the store now does);
- ``library store``: the same rows through ``SQLiteRecordStore.insert_messages`` and the
  same questions through its ``keyword_search`` (best 200), whatever scheme the checked-out
  code uses, so a run on two commits compares them.

Prints p50 / p95 per variant and store size (no assertions: a measurement)::

    python -m bench.fts_tenancy --rows 24000 900000
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sqlite3
import tempfile
import time
from pathlib import Path

from bench.locomo_data import load_conversations, percentile
from bench.scale import corpus
from bench.spine import DATA
from tiered_memory.recall.query import keywords
from tiered_memory.store.sqlite import SQLiteRecordStore
from tiered_memory.types import StoredMessage

_WORD = re.compile(r"[^\W_]+")
_CONSONANTS = "bcdfghjklmnpqrstvwxz"
USER_ROWS = 3000


def tag(user: str) -> str:
    """A per-user prefix of 8 consonants (no vowel, no digit: the stemmer's measure of the
    word after it is unchanged)."""
    n = int.from_bytes(hashlib.blake2b(user.encode(), digest_size=8).digest(), "big")
    out = []
    for _ in range(8):
        n, r = divmod(n, len(_CONSONANTS))
        out.append(_CONSONANTS[r])
    return "".join(out)


def owner(i: int, rows: int) -> str:
    return "me" if i % (rows // USER_ROWS) == 0 else f"other{i % 50}"


def build(path: Path, texts: list[str]) -> sqlite3.Connection:
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA cache_size=-32768")
    c.execute("CREATE VIRTUAL TABLE by_column USING fts5(content, user_id, tokenize='porter unicode61')")
    c.execute("CREATE VIRTUAL TABLE by_tag USING fts5(content, tokenize='porter unicode61')")
    n = len(texts)
    c.execute("BEGIN")
    c.executemany("INSERT INTO by_column(content, user_id) VALUES (?, ?)",
                  [(x, owner(i, n)) for i, x in enumerate(texts)])
    c.executemany("INSERT INTO by_tag(content) VALUES (?)",
                  [(" ".join(tag(owner(i, n)) + w for w in _WORD.findall(x.lower())),) for i, x in enumerate(texts)])
    c.execute("COMMIT")
    for table in ("by_column", "by_tag"):
        c.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
    return c


def library_store(path: Path, texts: list[str]) -> SQLiteRecordStore:
    store = SQLiteRecordStore(path)
    n = len(texts)
    for start in range(0, n, 5000):
        store.insert_messages([StoredMessage(id=f"m{i}", user_id=owner(i, n), session_id="s", role="user",
                                             content=texts[i], timestamp=float(i))
                               for i in range(start, min(n, start + 5000))])
    return store


def or_terms(words: list[str], prefix: str = "") -> str:
    return " OR ".join('"' + prefix + w + '"' for w in words)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[24000, 300000], help="rows in the store")
    p.add_argument("--queries", type=int, default=200)
    args = p.parse_args(argv)
    convs = load_conversations(DATA)
    turns = [t.text for c in convs for t in c.turns]
    questions = [keywords(q.question) for c in convs for q in c.questions][: args.queries]
    questions = [q for q in questions if q]
    variants = {
        "user column, bm25": ("SELECT rowid FROM by_column WHERE by_column MATCH ? ORDER BY bm25(by_column, 1.0, 0.0) "
                              "LIMIT 200", lambda w: f'user_id : "me" AND content : ({or_terms(w)})'),
        "user column, no rank, 200": ("SELECT rowid FROM by_column WHERE by_column MATCH ? LIMIT 200",
                                      lambda w: f'user_id : "me" AND content : ({or_terms(w)})'),
        "user column, no rank, all": ("SELECT rowid FROM by_column WHERE by_column MATCH ?",
                                      lambda w: f'user_id : "me" AND content : ({or_terms(w)})'),
        "tagged tokens, bm25": ("SELECT rowid FROM by_tag WHERE by_tag MATCH ? ORDER BY bm25(by_tag) LIMIT 200",
                                lambda w: or_terms(w, tag("me"))),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for rows in args.rows:
            t = time.perf_counter()
            c = build(Path(tmp) / f"fts{rows}.sqlite3", corpus(turns, rows, seed=4))
            print(f"{rows:,} rows ({USER_ROWS:,} of the user), built in {time.perf_counter() - t:.0f} s", flush=True)
            for name, (sql, match) in variants.items():
                ms = []
                for words in questions:
                    t = time.perf_counter()
                    c.execute(sql, (match(words),)).fetchall()
                    ms.append((time.perf_counter() - t) * 1000)
                print(f"  {name:<28} p50 {percentile(ms, 50):6.2f} ms   p95 {percentile(ms, 95):6.2f} ms", flush=True)
            c.close()
            t = time.perf_counter()
            store = library_store(Path(tmp) / f"lib{rows}.sqlite3", corpus(turns, rows, seed=4))
            print(f"  (library store built in {time.perf_counter() - t:.0f} s)", flush=True)
            ms = []
            for words in questions:
                t = time.perf_counter()
                store.keyword_search("me", words, k=200)
                ms.append((time.perf_counter() - t) * 1000)
            print(f"  {'library store, keyword_search':<28} p50 {percentile(ms, 50):6.2f} ms   "
                  f"p95 {percentile(ms, 95):6.2f} ms", flush=True)
            store.close()


if __name__ == "__main__":
    main()
