"""Configuration objects. Frozen; build new ones with ``dataclasses.replace``."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields, is_dataclass

from .errors import ConfigurationError
from .validation import MAX_COUNT


@dataclass(frozen=True, kw_only=True)
class BufferConfig:
    """The per-session buffer of recent turns."""

    max_messages: int = 20
    max_tokens: int = 2000


@dataclass(frozen=True, kw_only=True)
class RetrievalConfig:
    """How recall fuses its signals.

    Turn recall (``TieredMemory.search``) scores each candidate turn, by default
    (``turn_fusion="learned"``), with a weight table over named signals of the candidate
    pool (:mod:`tiered_memory.recall.fusion`; ``fusion_weights`` replaces the table), fitted
    on three LoCoMo dev conversations and their real-chat rewrite and checked on two held
    out (``bench/README.md``). A turn's *base* score, which it passes to the turn after it
    and which picks the turns whose neighbours are fetched, is its cosine similarity plus
    ``keyword_score_weight`` x its max-normalised BM25 score plus ``date_boost`` near a
    named date. With ``turn_fusion="hand"`` the score is the base plus the boosts below
    (:mod:`tiered_memory.recall.scoring`), each tuned alone. A question that asks for several
    things told over time (``"What books has Mel read?"``) gives ``listing_spread`` of its
    ``k`` places (the last two of ten) to the best turns of sessions not yet among its hits;
    ``spread`` does that for every query (0 by default). A message that only reacts
    ("lol", "omg yes") hands on no topic: a reply is read beside the message before the
    reactions between them, and with ``reactions_last`` reactions rank after every turn
    that says something.
    ``vector_weight``, ``keyword_weight``, ``recency_weight`` and ``rrf_k`` weight the
    reciprocal-rank fusion used by the episode, fact and item layers.
    """

    vector_weight: float = 1.0
    keyword_weight: float = 1.0
    recency_weight: float = 0.2
    rrf_k: int = 60
    candidates: int = 150  # vector and keyword candidates fetched per query (bench/README: 200 found no more)
    chunk_candidates: int = 20  # chunk vectors of long messages fetched per query (0: chunks unused)
    id_scope_max: int = 20_000  # up to this many turns, pass the user's ids to the vector index (0: filter)
    # from this many of the user's vectors held in memory, the keyword query runs in a worker
    # thread beside their exact scan (a smaller scan is shorter than the thread hop; 0: always)
    keyword_beside_from: int = 10_000
    recency_half_life_days: float = 30.0
    keyword_score_weight: float = 0.5
    neighbor_weight: float = 0.3  # x the previous turn's base score
    reply_weight: float = 0.3  # + this x the previous turn's share of questions, on neighbor_weight
    question_penalty: float = 0.15  # x the turn's share of question sentences, subtracted
    neighbor_expand: int = 30  # best candidates whose session neighbours are fetched
    # of those, the best whose session turns within neighbor_wide_window join the pool: in a long
    # history the answer is often a short reply a few turns after the best match (bench/README)
    neighbor_wide: int = 10
    neighbor_wide_window: int = 3
    speaker_boost: float = 0.1  # the query names the turn's speaker
    time_boost: float = 0.1  # a "when" query and a turn with a time expression
    date_boost: float = 0.2  # the query names a date and the turn is dated near it
    date_before_days: float = 7.0
    date_after_days: float = 30.0
    session_weight: float = 0.1  # x the session's share of the best turns
    session_top: int = 20
    session_best_weight: float = 0.0  # x the session's best turn score / the best of all
    exchange_weight: float = 0.0  # x the query terms' coverage by the turn and the one before it
    session_coverage_weight: float = 0.3  # x the query terms' coverage by the session's candidates
    recency_boost: float = 0.0  # x recency (1 now, 0.5 after a half-life)
    length_weight: float = 0.0  # x log(length / the candidates' median length), subtracted
    # shares of k given to the best turns of sessions not yet among the hits (recall/spread.py):
    # for every query, and for a question that asks for several things ("what books has ... read")
    spread: float = 0.0
    listing_spread: float = 0.2
    # a turn that only reacts ("lol", "omg yes": recall/query.py is_reaction) comes after every
    # turn that says something; False: reactions rank by their score like any turn
    reactions_last: bool = True
    # "learned": a turn's score is a fitted weight table over named signals
    # (tiered_memory.recall.fusion; the weights above then set only the base score, the date
    # window, the session top and recency); "hand": the hand-weighted sum of the weights above
    turn_fusion: str = "learned"
    fusion_weights: dict[str, float] | None = None  # signal -> weight; None: the shipped table


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """Token budget of :meth:`TieredMemory.build_context`.

    ``shares`` splits the memory budget (what is left after the recent buffer)
    between sections: ``session`` (working memory), ``facts``, ``episodes`` (past
    sessions), ``turns`` (relevant past turns) and ``items`` (store items, with
    ``include_items=True``; 0.2 when not named here; any other section not named has none).
    Shares are relative weights, normalised over the sections that have something to show, so by default
    session, facts and episodes weigh 0.3, 0.2 and 0.4, and relevant turns 1.5 beside
    them (turns 0.3, then 1.0, episodes 0.3 and facts 0.4, until December: each time the
    turn ranking improved, at 500 tokens the extractive facts and episodes reached less
    evidence per token than relevant turns alone; ``bench/README.md``, and
    ``python -m bench.context_shares`` measures a split). What a section
    leaves unused flows to the others by priority (session, facts, episodes, turns);
    items are dropped whole, lowest priority first.

    ``fact_relevance``: a fact other than a constraint enters the context only when its cosine
    to the query is at least this share of the best past turn's (0 shows every fact, ranked).
    Facts cost their tokens in every context; before December they were shown ranked but
    unchecked, and at 500 tokens the extractive ones (a few "User likes ..." per session) took
    a fifth of the budget for almost no evidence (``bench/README.md``).
    """

    max_tokens: int = 3000
    buffer_share: float = 0.4
    fact_relevance: float = 0.7
    shares: dict[str, float] = field(
        default_factory=lambda: {"session": 0.3, "facts": 0.2, "episodes": 0.4, "turns": 1.5}
    )


@dataclass(frozen=True, kw_only=True)
class LLMConfig:
    """How the core calls the LLM (episodes, facts, resolution).

    With ``strict`` a failing LLM raises ``LLMError``/``LLMOutputError``; otherwise the
    layer falls back to the extractive path and says so in the record's metadata.
    Turns are always stored before any LLM work, so a failure never loses them.
    """

    timeout_s: float = 60.0
    max_tokens: int = 800
    retries: int = 1
    strict: bool = False


@dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
    """Episodic memory. ``compress_after_turns``: when a session holds more turns than
    this beyond the buffer, the evicted part is compressed into an episode by a
    background worker (never inside ``add``); ``None`` waits for ``end_session``."""

    compress_after_turns: int | None = None
    recency_weight: float = 0.2
    recency_half_life_days: float = 30.0
    candidates: int = 40


@dataclass(frozen=True, kw_only=True)
class FactConfig:
    """Semantic memory: fact resolution thresholds (cosine similarity)."""

    same_similarity: float = 0.95
    merge_similarity: float = 0.85
    related_similarity: float = 0.6
    related_k: int = 5
    candidates: int = 40


@dataclass(frozen=True, kw_only=True)
class WorkingConfig:
    """Working memory per session."""

    capacity: int = 50
    decay_per_hour: float = 0.05
    # the whole scratchpad, as stored (JSON, UTF-8): each read and write of one key loads and
    # rewrites all of it; a write past it is refused (ContentTooLargeError), never an entry dropped
    scratchpad_max_bytes: int = 1_000_000


@dataclass(frozen=True, kw_only=True)
class ConsolidationConfig:
    """What :meth:`TieredMemory.consolidate` does."""

    merge_similarity: float = 0.92
    promote_access_count: int = 3
    compress_after_days: float = 30.0
    delete_raw: bool = False
    session_idle_hours: float = 24.0
    prune_below: float = 0.05
    prune_min_age_days: float = 30.0
    prune_fact_half_life_days: float = 180.0


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """Everything tunable about a :class:`TieredMemory`."""

    buffer: BufferConfig = field(default_factory=BufferConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    episodes: EpisodeConfig = field(default_factory=EpisodeConfig)
    facts: FactConfig = field(default_factory=FactConfig)
    working: WorkingConfig = field(default_factory=WorkingConfig)
    consolidation: ConsolidationConfig = field(default_factory=ConsolidationConfig)
    dedup_threshold: float = 0.95
    max_content_chars: int = 200_000
    max_metadata_bytes: int = 64_000
    # small batches pad less: chat turns vary in length, and on a CPU padding costs more
    # than batching saves (MiniLM, 1 thread: 8 -> +36% per-session ingest vs 64)
    embed_batch_size: int = 8
    # reads note accesses in memory; a background thread writes them in batches
    access_flush_size: int = 512
    access_flush_seconds: float = 30.0
    # add_many and import_jsonl write and index this many messages per transaction
    write_chunk: int = 2000


# fields that must be at least 1: a zero would hold, fetch or write nothing (a working memory of
# capacity 0 evicts what it was just told to remember)
AT_LEAST_ONE = frozenset({"BufferConfig.max_messages", "BufferConfig.max_tokens", "RetrievalConfig.rrf_k",
                          "RetrievalConfig.candidates", "BudgetConfig.max_tokens", "LLMConfig.max_tokens",
                          "EpisodeConfig.candidates", "FactConfig.related_k", "FactConfig.candidates",
                          "WorkingConfig.capacity", "WorkingConfig.scratchpad_max_bytes",
                          "MemoryConfig.max_content_chars", "MemoryConfig.max_metadata_bytes",
                          "MemoryConfig.embed_batch_size", "MemoryConfig.access_flush_size", "MemoryConfig.write_chunk",
                          "EpisodeConfig.compress_after_turns",
                          "RetrievalConfig.neighbor_wide_window"})
# shares of a whole: above 1 means nothing (decay_per_hour is the part of an item's importance lost per hour)
AT_MOST_ONE = frozenset({"WorkingConfig.decay_per_hour"})
SIGNED = frozenset({"RetrievalConfig.fusion_weights"})  # a learned table may weigh a signal below zero
#: the sections of a context that ``BudgetConfig.shares`` may name (:mod:`.context.assembly`)
BUDGET_SECTIONS = ("session", "facts", "episodes", "turns", "items")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def config_problems(config: object, where: str = "") -> list[str]:
    """What is wrong with a config (pure; [] when nothing): every number finite and not
    negative (at least 1 where :data:`AT_LEAST_ONE` says so), an int where an int is meant
    (at most :data:`~tiered_memory.validation.MAX_COUNT`),
    every flag a bool, every table of weights finite numbers; nested configs too. Strings
    (``turn_fusion``) are checked where they are used."""
    problems: list[str] = []
    for f in fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        shown = where + f.name
        kind = str(f.type).split(" |")[0]  # "int", "float", "bool", "dict[str, float]", "BufferConfig", ...
        floor = 1 if f"{type(config).__name__}.{f.name}" in AT_LEAST_ONE else 0
        if kind.endswith("Config") and type(value).__name__ != kind:
            problems.append(f"{shown} must be a {kind}, got {type(value).__name__}")
        elif is_dataclass(value):
            problems += config_problems(value, shown + ".")
        elif value is None and "None" in str(f.type):
            continue
        elif kind == "bool" and not isinstance(value, bool):
            problems.append(f"{shown} must be True or False, got {value!r}")
        elif kind in ("int", "float"):
            if not _number(value) or (kind == "int" and not isinstance(value, int)):
                problems.append(f"{shown} must be {'an int' if kind == 'int' else 'a number'}, got {value!r}")
            elif not math.isfinite(value) or value < floor or (kind == "int" and value > MAX_COUNT):
                problems.append(f"{shown} must be finite and at least {floor}"
                                f"{f' (at most {MAX_COUNT:,})' if kind == 'int' else ''}, got {value!r}")
            elif value > 1 and f"{type(config).__name__}.{f.name}" in AT_MOST_ONE:
                problems.append(f"{shown} must be at most 1 (a share of the whole), got {value!r}")
        elif kind.startswith("dict"):
            signed = f"{type(config).__name__}.{f.name}" in SIGNED
            for key, weight in (value.items() if isinstance(value, dict) else [("", value)]):
                if not _number(weight) or not math.isfinite(weight) or (weight < 0 and not signed):
                    problems.append(f"{shown}[{key!r}] must be a finite number{'' if signed else ' >= 0'}, "
                                    f"got {weight!r}")
            if f"{type(config).__name__}.{f.name}" == "BudgetConfig.shares" and isinstance(value, dict):
                problems += [f"{shown} has no section {key!r}; the sections are {', '.join(BUDGET_SECTIONS)}"
                             for key in value if key not in BUDGET_SECTIONS]
    return problems


def check_config(config: object) -> MemoryConfig:
    """A copy of ``config`` if it is a :class:`MemoryConfig` without :func:`config_problems`; else
    ConfigurationError listing every problem (a zero capacity or a NaN weight fails when the
    memory opens, not at some later call). A copy: the frozen dataclasses hold tables (dicts) the
    caller keeps, whose later changes would skip these checks."""
    if not isinstance(config, MemoryConfig):
        raise ConfigurationError(f"config must be a MemoryConfig, got {type(config).__name__}")
    problems = config_problems(config)
    if problems:
        raise ConfigurationError("; ".join(problems))
    try:
        return copy.deepcopy(config)
    except Exception as e:  # a str field (turn_fusion) holding an object that cannot be copied
        raise ConfigurationError(f"config cannot be copied: {type(e).__name__}: {e}") from e
