"""LoCoMo data and metrics for :mod:`bench.locomo`: parsing the file and scoring answers.

Everything here is a pure function or a plain record (tested in ``tests/test_retrieval.py``);
the runners, the baseline and the command line stay in :mod:`bench.locomo`.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (1, 2, 3, 5, 10)  # search(k=10): deeper k would only repeat recall@10

_EVIDENCE = re.compile(r"^D:?(\d+):(\d+)$")


# ---- data (pure) -------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    timestamp: float


@dataclass(frozen=True, kw_only=True)
class Question:
    conversation: str
    question: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class EvidenceReport:
    """What :func:`parse_evidence` made of one question's raw evidence list."""

    ids: tuple[str, ...]
    repaired: tuple[str, ...] = ()  # malformed but readable: 'D8:6; D9:17', 'D:11:26'
    unparseable: tuple[str, ...] = ()  # e.g. 'D'
    missing: tuple[str, ...] = ()  # well formed, but no such turn


@dataclass(kw_only=True)
class Conversation:
    id: str
    speakers: tuple[str, ...]
    turns: list[Turn]
    questions: list[Question]
    evidence_issues: Counter[str] = field(default_factory=Counter)
    evidence_examples: list[str] = field(default_factory=list)


def parse_evidence(raw: Iterable[Any], known: set[str] | frozenset[str]) -> EvidenceReport:
    """Normalise a question's evidence dialogue ids, defensively.

    Each entry may hold several ids (``'D8:6; D9:17'``), a stray colon (``'D:11:26'``),
    junk (``'D'``) or an id that names no turn; valid ids are kept (deduplicated, in order)
    and the rest reported.
    """
    ids: dict[str, None] = {}
    repaired, unparseable, missing = [], [], []
    for entry in raw if isinstance(raw, (list, tuple)) else [raw]:
        text = str(entry).strip()
        pieces = [p for p in re.split(r"[;,\s]+", text) if p]
        if not pieces:
            unparseable.append(text)
            continue
        for piece in pieces:
            m = _EVIDENCE.match(piece)
            if not m:
                unparseable.append(piece)
                continue
            norm = f"D{int(m[1])}:{int(m[2])}"
            if norm != text:
                repaired.append(text)
            if norm not in known:
                missing.append(norm)
                continue
            ids.setdefault(norm, None)
    return EvidenceReport(ids=tuple(ids), repaired=tuple(dict.fromkeys(repaired)),
                          unparseable=tuple(unparseable), missing=tuple(missing))


def parse_session_date(text: str) -> float:
    """``'1:56 pm on 8 May, 2023'`` -> epoch seconds (UTC)."""
    cleaned = re.sub(r"\s+", " ", text.strip())
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y"):
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise ValueError(f"unrecognised session date {text!r}")


def turn_text(speaker: str, text: str, caption: str | None = None) -> str:
    """The stored text of a turn: the speaker's name kept, a shared photo's caption appended."""
    out = f"{speaker}: {text.strip()}"
    if caption:
        out += f" [shares a photo: {caption.strip()}]"
    return out


def load_conversations(path: str | os.PathLike[str]) -> list[Conversation]:
    """Read a LoCoMo-format file into :class:`Conversation` objects."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = []
    for sample in data:
        conv = sample["conversation"]
        turns: list[Turn] = []
        sessions = sorted(
            (int(m[1]) for key in conv if (m := re.fullmatch(r"session_(\d+)", key))
             and isinstance(conv[key], list)))
        for s in sessions:
            stamp = parse_session_date(conv[f"session_{s}_date_time"])
            for t in conv[f"session_{s}"]:
                turns.append(Turn(dia_id=t["dia_id"], session=s, speaker=t["speaker"],
                                  text=turn_text(t["speaker"], t["text"], t.get("blip_caption")),
                                  timestamp=stamp))
        known = frozenset(t.dia_id for t in turns)
        c = Conversation(id=sample["sample_id"],
                         speakers=(conv.get("speaker_a", ""), conv.get("speaker_b", "")),
                         turns=turns, questions=[])
        for qa in sample.get("qa", []):
            if qa.get("category") not in CATEGORIES or not qa.get("evidence"):
                continue
            rep = parse_evidence(qa["evidence"], known)
            for kind in ("repaired", "unparseable", "missing"):
                for bad in getattr(rep, kind):
                    c.evidence_issues[kind] += 1
                    c.evidence_examples.append(f"{c.id}: {kind} {bad!r}")
            if not rep.ids:
                c.evidence_issues["question_without_valid_evidence"] += 1
                continue
            c.questions.append(Question(conversation=c.id, question=qa["question"],
                                        category=int(qa["category"]), evidence=rep.ids))
        out.append(c)
    return out


def session_of(dia_id: str) -> str:
    return dia_id.split(":", 1)[0]


def first_of_each_session(ranked: Sequence[str]) -> list[str]:
    """The first dialogue id of each session in ``ranked`` (best first), in rank order."""
    firsts: dict[str, str] = {}
    for dia_id in ranked:
        firsts.setdefault(session_of(dia_id), dia_id)
    return list(firsts.values())


def recall_at(retrieved: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """Share of ``evidence`` among the first ``k`` of ``retrieved``."""
    if not evidence:
        return 0.0
    top = set(retrieved[:k])
    return sum(1 for e in set(evidence) if e in top) / len(set(evidence))


def hit_at(retrieved: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """1.0 if any evidence is among the first ``k``."""
    return 1.0 if set(retrieved[:k]) & set(evidence) else 0.0


def session_recall_at(retrieved: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """Share of the evidence's sessions that some of the first ``k`` turns come from."""
    want = {session_of(e) for e in evidence}
    got = {session_of(r) for r in retrieved[:k]}
    return len(want & got) / len(want) if want else 0.0


def within_budget(sizes: Sequence[int], budget: int) -> int:
    """How many leading hits fit in ``budget`` tokens."""
    used = n = 0
    for size in sizes:
        if used + size > budget:
            break
        used += size
        n += 1
    return n


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    rank = max(1, min(len(s), int(-(-p * len(s) // 100))))
    return s[rank - 1]


@dataclass(kw_only=True)
class Answer:
    question: Question
    retrieved: list[str]
    tokens: int
    seconds: float
    hit_tokens: list[int] = field(default_factory=list)
    # sessions ranked by a session search, each as the dialogue id of a turn of it (best first)
    sessions: list[str] | None = None
    session_seconds: float = 0.0


def summarize(answers: Sequence[Answer], ks: Sequence[int] = KS) -> dict[str, Any]:
    """Turn/session recall, hit rate, tokens and latency, overall and per category."""

    def block(items: Sequence[Answer]) -> dict[str, Any]:
        if not items:
            return {"count": 0}
        out: dict[str, Any] = {"count": len(items)}
        for k in ks:
            out[f"recall@{k}"] = statistics.fmean(recall_at(a.retrieved, a.question.evidence, k) for a in items)
            out[f"hit@{k}"] = statistics.fmean(hit_at(a.retrieved, a.question.evidence, k) for a in items)
            out[f"session_recall@{k}"] = statistics.fmean(
                session_recall_at(a.retrieved, a.question.evidence, k) for a in items)
        ranked = [a for a in items if a.sessions is not None]
        if ranked:
            for k in ks:
                out[f"session_search_recall@{k}"] = statistics.fmean(
                    session_recall_at(a.sessions or [], a.question.evidence, k) for a in ranked)
            ms = [a.session_seconds * 1000 for a in ranked]
            out["session_search_ms_p50"] = percentile(ms, 50)
            out["session_search_ms_p95"] = percentile(ms, 95)
        out["tokens@10"] = statistics.fmean(a.tokens for a in items)
        ms = [a.seconds * 1000 for a in items]
        out["latency_ms_p50"] = percentile(ms, 50)
        out["latency_ms_p95"] = percentile(ms, 95)
        return out

    result = {"overall": block(answers)}
    for cat, name in CATEGORIES.items():
        result[f"cat{cat}_{name}"] = block([a for a in answers if a.question.category == cat])
    return result
