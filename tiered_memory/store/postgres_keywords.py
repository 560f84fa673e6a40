"""PostgreSQL's keyword column and query, with diacritics folded as SQLite folds them, and a
user's turns matched by it (:func:`turn_matches`, and how such a match is prepared).

Keyword search folds diacritics as SQLite's FTS5 does (``unicode61``), so ``cafe`` finds
"Café" and ``café`` finds "Cafe" on either engine. Not through the ``unaccent`` extension:
CREATE EXTENSION needs a privilege the app's role may lack, and ``unaccent()`` is not
IMMUTABLE (its rules file can change), so no generated column may call it. Instead the
store's schema holds ``fold_diacritics()``: an IMMUTABLE SQL function over the built-in
``translate()`` with a fixed map, the letters FTS5 folds
(:func:`~.text_search.diacritic_fold`). The stored ``tsvector`` and the query both go
through it, in the database, so they agree whatever map a later version of this code builds.

A run of Chinese, Japanese or Korean characters is indexed as its bigrams, as on SQLite
(:func:`~.text_search.cjk_grams`): ``cjk_bigrams()``, an IMMUTABLE SQL function of the schema,
spaces them out before the parser reads the text (which reads such a run as one word); the
query's words come as bigrams already (:func:`~.text_search.tsquery_any`).
"""

from __future__ import annotations

from typing import Any

from .text_search import CJK, diacritic_fold

TEXT_SEARCH_CONFIG = "english"


def tsv_column(source: str) -> str:
    """The generated keyword column of a table over ``source`` (an SQL expression of the row)."""
    return (f"tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}',"
            f" cjk_bigrams(fold_diacritics({source})))) STORED")


def tsquery(param: str) -> str:
    """The ``tsquery`` of a :func:`~.text_search.tsquery_any` text passed as ``param``."""
    return f"to_tsquery('{TEXT_SEARCH_CONFIG}', fold_diacritics({param}))"


def turn_matches(fenced: bool, session: str) -> str:
    """The ranked keyword matches of one user's turns as SQL (named parameters ``text``, ``user``,
    ``k``; ``session`` is the optional session condition). A user with few rows is ``fenced``:
    matched row by row from the b-tree on ``user_id`` (the ``OFFSET 0`` subquery keeps the planner
    from reaching for the GIN index, which would return every user's matches first), which reads
    the user's rows whatever the plan, so it may run prepared. A large user goes through the GIN
    index, and must run with ``prepare=False`` (:func:`match_prepare`): once psycopg prepared it,
    PostgreSQL kept a generic plan made for the average user's few rows, which read every turn of
    the large user instead of the word's few (a rare word among a user's 50,000 turns: 26.7 ms a
    ``keyword_search`` prepared, 11.6 planned with its values, about half of it the bounded count
    of the user's rows; ``candidates`` 28.8 -> 11.0; a common word within noise either way; one
    run on a busy machine, bench/item_plans.py ``turn_keyword_rounds``)."""
    source = ("(SELECT id, seq, session_id, tsv FROM messages WHERE user_id = %(user)s"
              " OFFSET 0) AS m" if fenced else "messages m")
    return (f"SELECT m.id, ts_rank(m.tsv, q) AS s, m.seq FROM {source}, {tsquery('%(text)s')} AS q"
            f" WHERE m.tsv @@ q{'' if fenced else ' AND m.user_id = %(user)s'}{session}"
            " ORDER BY s DESC, m.seq DESC LIMIT %(k)s")


def match_prepare(fenced: bool) -> bool | None:
    """psycopg's ``prepare`` for a statement holding :func:`turn_matches` (or the layers' match
    of a user): None (prepared after five runs) for a fenced match, False (planned with its
    values every time) for a large user's."""
    return None if fenced else False


def refold(table: str, source: str) -> str:
    """A migration step rebuilding ``table``'s keyword column (and its GIN index) over
    :func:`tsv_column`: PostgreSQL rewrites the table once; no row changes."""
    return (f"ALTER TABLE {table} DROP COLUMN tsv; ALTER TABLE {table} ADD COLUMN {tsv_column(source)};"
            f" CREATE INDEX {table}_tsv ON {table} USING GIN (tsv);")


def fold_turn_keywords(conn: Any) -> None:
    """Create ``fold_diacritics()`` (and :func:`create_bigrams`) and fold the turns' keywords
    with it. A database not in UTF8 gets a function that folds nothing: its encoding may lack
    letters of the map."""
    utf8 = _utf8(conn)
    letters, bases = diacritic_fold() if utf8 else ("", "")  # letters and marks only: no quote
    conn.execute("CREATE OR REPLACE FUNCTION fold_diacritics(t TEXT) RETURNS TEXT"
                 f" LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ SELECT translate(t, '{letters}', '{bases}') $$")
    create_bigrams(conn, utf8)
    conn.execute(refold("messages", "content"))


def create_bigrams(conn: Any, utf8: bool) -> None:
    """Create ``cjk_bigrams()``: ``t`` with each run of CJK characters written as its
    bigrams, a space around each ("去北京 ok" -> "去北 北京 ok"; a lone one stays). A database
    not in UTF8 gets one that changes nothing."""
    body = "SELECT t"
    if utf8:
        run = f"[{CJK}]+"
        # each character beside the next (lead), in one pass: substr(p, i, 2) at each i walked
        # the run's multibyte text from its start, so a run of 199,000 took minutes to index
        body = (f"SELECT CASE WHEN t !~ '{run}' THEN t ELSE (SELECT string_agg(CASE WHEN p ~ '^{run}$'"
                " AND length(p) > 1 THEN (SELECT string_agg(c || next, ' ' ORDER BY k) FROM (SELECT c, k,"
                " lead(c) OVER (ORDER BY k) AS next FROM regexp_split_to_table(p, '') WITH ORDINALITY AS s(c, k))"
                " AS g WHERE next IS NOT NULL) ELSE p END, ' ' ORDER BY n)"
                f" FROM regexp_matches(t, '{run}|[^{CJK}]+', 'g') WITH ORDINALITY AS r(m, n),"
                " LATERAL (SELECT m[1] AS p) AS q) END")
    conn.execute("CREATE OR REPLACE FUNCTION cjk_bigrams(t TEXT) RETURNS TEXT"
                 f" LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ {body} $$")


def bigram_turn_keywords(conn: Any) -> None:
    """The migration to CJK bigrams: :func:`create_bigrams`, and the turns' keyword column
    generated again through it."""
    create_bigrams(conn, _utf8(conn))
    conn.execute(refold("messages", "content"))


def _utf8(conn: Any) -> bool:
    """Whether the database is in UTF8 (else its encoding may lack the letters the functions name)."""
    return bool(conn.execute("SELECT current_setting('server_encoding')").fetchone()[0] == "UTF8")
