"""PostgreSQL's keyword column and query, with diacritics folded as SQLite folds them.

Keyword search folds diacritics as SQLite's FTS5 does (``unicode61``), so ``cafe`` finds
"Café" and ``café`` finds "Cafe" on either engine. Not through the ``unaccent`` extension:
CREATE EXTENSION needs a privilege the app's role may lack, and ``unaccent()`` is not
IMMUTABLE (its rules file can change), so no generated column may call it. Instead the
store's schema holds ``fold_diacritics()``: an IMMUTABLE SQL function over the built-in
``translate()`` with a fixed map, the letters FTS5 folds
(:func:`~.text_search.diacritic_fold`). The stored ``tsvector`` and the query both go
through it, in the database, so they agree whatever map a later version of this code builds.
"""

from __future__ import annotations

from typing import Any

from .text_search import diacritic_fold

TEXT_SEARCH_CONFIG = "english"


def tsv_column(source: str) -> str:
    """The generated keyword column of a table over ``source`` (an SQL expression of the row)."""
    return (f"tsv TSVECTOR GENERATED ALWAYS AS (to_tsvector('{TEXT_SEARCH_CONFIG}', fold_diacritics({source})))"
            " STORED")


def tsquery(param: str) -> str:
    """The ``tsquery`` of a :func:`~.text_search.tsquery_any` text passed as ``param``."""
    return f"to_tsquery('{TEXT_SEARCH_CONFIG}', fold_diacritics({param}))"


def refold(table: str, source: str) -> str:
    """A migration step rebuilding ``table``'s keyword column (and its GIN index) over
    :func:`tsv_column`: PostgreSQL rewrites the table once; no row changes."""
    return (f"ALTER TABLE {table} DROP COLUMN tsv; ALTER TABLE {table} ADD COLUMN {tsv_column(source)};"
            f" CREATE INDEX {table}_tsv ON {table} USING GIN (tsv);")


def fold_turn_keywords(conn: Any) -> None:
    """Create ``fold_diacritics()`` and fold the turns' keywords with it. A database not in
    UTF8 gets a function that folds nothing: its encoding may lack letters of the map."""
    utf8 = conn.execute("SELECT current_setting('server_encoding')").fetchone()[0] == "UTF8"
    letters, bases = diacritic_fold() if utf8 else ("", "")  # letters and marks only: no quote
    conn.execute("CREATE OR REPLACE FUNCTION fold_diacritics(t TEXT) RETURNS TEXT"
                 f" LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$ SELECT translate(t, '{letters}', '{bases}') $$")
    conn.execute(refold("messages", "content"))
