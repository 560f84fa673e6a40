"""A LangChain retriever over the core's hybrid recall."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, field_validator

from tiered_memory import MemoryHit, TieredMemory
from tiered_memory.aio import call_in_thread
from tiered_memory.errors import InvalidInputError, TypedArgumentsModel, typed_arguments
from tiered_memory.quoting import defuse_tokens
from tiered_memory.validation import check_count, check_id, check_optional_id, check_unit

from .messages import LC_KEY

__all__ = ["TieredMemoryRetriever", "hit_to_document"]

# what a call may override, and the names LangChain's vector-store retrievers use for them
_OVERRIDES = {"k", "user_id", "session_id", "filters", "score_threshold"}
_ALIASES = {"top_k": "k", "filter": "filters"}
# a Document's metadata keys that are no field the search filters on (see document_filters)
_DOCUMENT_ONLY = frozenset({"id", "score", "similarity", "layer", "timestamp", "metadata"})
DEFAULT_K = 4
# VectorStoreRetriever's search types that mean something here ("mmr" is refused, see check_search_type)
SEARCH_TYPES = ("similarity", "similarity_score_threshold")


def resolve_overrides(given: dict[str, Any], where: str) -> dict[str, Any]:
    """``given`` with LangChain's names (``top_k``, ``filter``) mapped to ours and ``k``
    checked (pure). Unknown names and a name given twice are refused."""
    out: dict[str, Any] = {}
    for name, value in given.items():
        key = _ALIASES.get(name, name)
        if key not in _OVERRIDES:
            raise TypeError(f"{where}: unexpected arguments [{name!r}]; use one of "
                            f"{sorted(_OVERRIDES | set(_ALIASES))}")
        if key in out:
            raise InvalidInputError(f"{where}: {key!r} given twice (as {name!r} too); pass it once")
        out[key] = value
    if "k" in out:
        check_count(out["k"], "k", minimum=1)
    if out.get("score_threshold") is not None:
        check_unit(out["score_threshold"], "score_threshold")
    return out


def check_search_type(search_type: object) -> str:
    """``search_type`` if it is one of :data:`SEARCH_TYPES` (pure). ``"mmr"`` is refused with why:
    MMR re-ranks by cosine alone, which would throw away what recall's fused score weighs
    (keywords, neighbouring turns, names, dates, recency)."""
    if search_type == "mmr":
        raise InvalidInputError(
            "search_type='mmr' is not supported here: maximal marginal relevance re-ranks by the cosine "
            "to the query alone, which would discard what recall's fused score weighs (keywords, "
            "neighbouring turns, names, dates, recency); recall already gives its last hits to sessions "
            "not yet among them. Use search_type='similarity' or 'similarity_score_threshold'")
    if not isinstance(search_type, str) or search_type not in SEARCH_TYPES:
        raise InvalidInputError(f"search_type of {search_type!r} not allowed. Valid values are: {SEARCH_TYPES}")
    return search_type


def require_threshold(search_type: str, settings: Mapping[str, Any]) -> None:
    """As on ``VectorStoreRetriever``: ``similarity_score_threshold`` needs a ``score_threshold`` (pure)."""
    if search_type == "similarity_score_threshold" and settings.get("score_threshold") is None:
        raise InvalidInputError("search_type='similarity_score_threshold' needs a score_threshold (a number "
                                "within [0, 1]) in search_kwargs, e.g. search_kwargs={'score_threshold': 0.5}")


def similarity(hit: MemoryHit) -> float | None:
    """The cosine of ``hit`` to the query (its relevance in LangChain's sense), or None when the
    search found it by keywords alone (pure)."""
    vector = hit.explanation.get("signals", {}).get("vector")
    return float(vector["value"]) if isinstance(vector, Mapping) and "value" in vector else None


def above_threshold(hits: Sequence[MemoryHit], threshold: float | None) -> list[MemoryHit]:
    """The ``hits`` whose cosine to the query is at least ``threshold``, in their order (pure): as
    ``similarity_search_with_relevance_scores`` keeps of its k best. The fused score is no 0-1
    relevance, so the threshold is on the cosine; a hit found by keywords alone has none and goes."""
    if threshold is None:
        return list(hits)
    return [h for h in hits if (s := similarity(h)) is not None and s >= threshold]


def document_filters(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with a filter on a Document's own metadata resolved (pure): a LangChain filter
    names the keys a ``Document`` shows, so ``filter={"session_id": ...}`` scopes the search to that
    session, as ``session_id=`` does, and a key the search cannot filter on (``id``, ``layer``,
    ``score``, ``timestamp``, ``metadata``) is refused; it would otherwise be read as a key of the
    message's metadata and match nothing. Other keys are the search's (message metadata, ``role``,
    ``since``/``until``)."""
    filters = settings.get("filters")
    if not isinstance(filters, Mapping):
        return settings  # None, or not a mapping: the search refuses that itself
    own = sorted(k for k in filters if k in _DOCUMENT_ONLY)
    if own:
        raise InvalidInputError(
            f"filter keys {own} are a Document's own metadata, which the search cannot filter on: filter on "
            "'session_id', 'role', 'since'/'until' (epoch seconds) or a key of the message's metadata")
    if "session_id" not in filters:
        return settings
    rest = {k: v for k, v in filters.items() if k != "session_id"}
    session = check_id(filters["session_id"], "filter session_id")  # None would mean every session
    if settings.get("session_id") is not None and settings["session_id"] != session:
        raise InvalidInputError(
            f"session_id {settings['session_id']!r} and filter session_id {session!r} ask for two "
            "different sessions; give one")
    return {**settings, "session_id": session, "filters": rest or None}


def _search_kwargs(given: Any) -> dict[str, Any]:
    """``search_kwargs`` with our names, checked (pure): a mapping (or ``None``), which may not name
    the user."""
    if given is not None and not isinstance(given, Mapping):
        raise InvalidInputError(f"search_kwargs must be a dict such as {{'k': 4}}, got {type(given).__name__}")
    out = resolve_overrides(dict(given or {}), "search_kwargs")
    if "user_id" in out:
        raise InvalidInputError("search_kwargs cannot set user_id; pass user_id= itself")
    return out


def hit_to_document(hit: MemoryHit) -> Document:
    """A ``Document`` of one hit: the text, and its score, layer, role, session and time
    as metadata (the message's own metadata under ``"metadata"``); ``"similarity"`` is its
    cosine to the query (:func:`similarity`, ``None`` for a hit found by keywords alone), what
    ``similarity_score_threshold`` compares, where ``"score"`` is recall's fused score. A document's text goes
    into a prompt (a chain's context, a retriever tool's result), so it spells no chat-template
    turn marker (:func:`~tiered_memory.quoting.defuse_tokens`; ``get_messages`` gives the text as stored)."""
    own = {k: v for k, v in hit.metadata.items() if k != LC_KEY}
    return Document(
        id=hit.id,
        page_content=defuse_tokens(hit.text),
        metadata={"id": hit.id, "score": hit.score, "similarity": similarity(hit), "layer": hit.layer,
                  "role": hit.role, "session_id": hit.session_id, "timestamp": hit.timestamp, "metadata": own},
    )


class TieredMemoryRetriever(TypedArgumentsModel, BaseRetriever):
    """Recall a user's memories as ``Document``\\ s, best first.

    Args:
        memory: the shared :class:`~tiered_memory.TieredMemory`.
        user_id: whose memories to search.
        k: how many documents to return.
        session_id: search only this session.
        filters: metadata / ``role`` / ``since`` / ``until`` filters of
            :meth:`TieredMemory.search`.

    ``invoke(query, k=..., user_id=..., session_id=..., filters=...)`` overrides
    any of these for one call. As on LangChain's vector-store retrievers,
    ``search_kwargs={"k": 2, "filter": {...}}`` and ``top_k`` (for ``k``) / ``filter``
    (for ``filters``) are accepted too; as there, a filter names a Document's metadata keys:
    ``{"session_id": "s1"}`` searches that session, and ``id``, ``layer``, ``score``,
    ``timestamp`` (use ``since``/``until``) are refused. ``search_kwargs`` is read at each call, so changing
    it later, or configuring it (``configurable_fields(search_kwargs=...)``), takes effect;
    a setting given by name (``k=3``) wins over the same one in ``search_kwargs``, and ``k``
    is 4 when neither gives it. A ``k`` that is not an int >= 1 raises
    :class:`~tiered_memory.errors.InvalidInputError` wherever it is given; an argument the
    retriever does not know (a misspelt ``fliters=``) is refused at construction, and so is an
    empty or non-string ``user_id`` / ``session_id``: every refusal at construction is an
    :class:`~tiered_memory.errors.InvalidArgumentsError`, which is pydantic's ``ValidationError`` too. A blank query returns no documents
    (there is nothing to recall for) instead of failing the chain; a query that is not a
    string raises :class:`~tiered_memory.errors.InvalidInputError`.

    ``search_type`` takes ``VectorStoreRetriever``'s values where they mean something here:
    ``"similarity"`` (the default: recall's hybrid ranking) and ``"similarity_score_threshold"``,
    which needs ``score_threshold`` (within [0, 1]) in ``search_kwargs`` and keeps, of the k best,
    the documents whose cosine to the query reaches it (the fused ``score`` is no 0-1 relevance;
    a turn found by keywords alone has no cosine and is left out). A ``score_threshold`` given with
    ``"similarity"``, or per call, is honoured the same way. ``"mmr"`` raises
    :class:`~tiered_memory.errors.InvalidInputError` saying why (:func:`check_search_type`).

    Example:
        >>> retriever = TieredMemoryRetriever(memory=memory, user_id="u1", k=3)  # doctest: +SKIP
        >>> retriever.invoke("where do I live?")[0].page_content  # doctest: +SKIP
        'I live in Lisbon'
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    memory: TieredMemory
    user_id: str
    k: int | None = None  # None: search_kwargs' k, else DEFAULT_K
    session_id: str | None = None
    filters: dict[str, Any] | None = None
    search_type: str = "similarity"
    search_kwargs: dict[str, Any] = {}

    def __init__(self, **data: Any) -> None:
        # checked before pydantic, so a bad k is the same typed error as at invoke
        # (None is "not given": LangChain rebuilds a configured retriever from every field)
        with typed_arguments(type(self).__name__):
            named = {n: v for n in list(data) if n in (_OVERRIDES | set(_ALIASES)) - {"user_id", "score_threshold"}
                     if (v := data.pop(n)) is not None}
            named = resolve_overrides(named, "TieredMemoryRetriever")
            search_type = check_search_type(data.get("search_type", "similarity"))  # before mmr's fetch_k is refused
            require_threshold(search_type, _search_kwargs(data.get("search_kwargs")))
            super().__init__(**data, **named)

    def settings(self, **overrides: Any) -> dict[str, Any]:
        """What one call searches with: the call's ``overrides``, else the settings given by
        name, else ``search_kwargs`` as it is now, else the defaults."""
        out: dict[str, Any] = {"k": DEFAULT_K, "session_id": None, "filters": None}
        out.update(_search_kwargs(self.search_kwargs))
        out.update({n: getattr(self, n) for n in ("k", "session_id", "filters") if getattr(self, n) is not None})
        out["user_id"] = self.user_id
        out.update({n: v for n, v in resolve_overrides(overrides, "invoke").items() if v is not None})
        require_threshold(check_search_type(self.search_type), out)
        return document_filters(out)

    @field_validator("user_id")
    @classmethod
    def _check_user(cls, value: str) -> str:
        return check_id(value, "user_id")

    @field_validator("session_id")
    @classmethod
    def _check_session(cls, value: str | None) -> str | None:
        return check_optional_id(value, "session_id")

    def _search(self, query: str, **overrides: Any) -> list[Document]:
        settings = self.settings(**overrides)  # checked even when there is nothing to search for
        threshold = settings.pop("score_threshold", None)
        if isinstance(query, str) and not query.strip():
            return []  # nothing to recall for, as in the other adapters (a chain's empty input)
        hits = self.memory.search(query, **settings)
        return [hit_to_document(h) for h in above_threshold(hits, threshold)]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any,
    ) -> list[Document]:
        return self._search(query, **kwargs)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any,
    ) -> list[Document]:
        return await call_in_thread(self.memory, self._search, query, **kwargs)
