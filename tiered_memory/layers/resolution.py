"""Fact resolution rules: what a new fact candidate does to the facts already known (pure).

:func:`decide_resolution` answers ``add``, ``update`` (merge into an existing fact),
``invalidate`` (a contradiction) or ``noop``, from an LLM :class:`Judgement` when one is
valid and leaves the candidate's slot one valid fact, else from the rules: the slot a fact
names (``key``, from the extractive rules or :func:`~tiered_memory.slots.stated_slot`)
decides first, cosine similarity only between facts of no other slot. :class:`~tiered_memory.layers.semantic.SemanticMemory`
writes what it decides, and :func:`one_in_slot` for a fact an edit or a judge's rewrite moves
into a slot; ``consolidate``'s merge plan uses :func:`other_slots` too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping, Sequence

from pydantic import BaseModel, Field, field_validator

from ..llm.base import ModelCount
from ..records import Fact, FactCandidate
from ..recall.coverage import fact_stems
from ..slots import stated_slot, stated_value, text_slot
from ..validation import MAX_FACT_CHARS, not_blank

Action = Literal["add", "update", "invalidate", "noop"]


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """What to do with a candidate: ``target_id`` is the existing fact acted on."""

    action: Action
    target_id: str | None = None
    text: str | None = None
    reason: str = ""
    method: str = "rules"

class Judgement(BaseModel):
    """The LLM's resolution of a candidate against numbered existing facts."""

    action: Literal["add", "update", "invalidate", "noop"]
    target: ModelCount | None = Field(default=None, description="number of the existing fact, if any")
    text: str | None = Field(default=None, max_length=MAX_FACT_CHARS, pattern=r"\S",
                             description="merged text, for update")

    @field_validator("text")
    @classmethod
    def _text_not_blank(cls, text: str | None) -> str | None:
        return None if text is None else not_blank(text)

def _norm(text: str) -> str:
    return " ".join(text.lower().replace(".", " ").split())

def slot_of(fact: Fact) -> tuple[str | None, int]:
    """A fact's slot and polarity: its stored ``key``, else the slot its words name (pure). Every
    write of a fact's text stores it so (:func:`slotted`), and the layer migration did for the
    facts stored before; the words are read again here for a fact no such write made: one a
    store's other writer stored (an older version sharing a PostgreSQL database), one handed to
    the rules by a caller, one in words a later version's rules read as a slot."""
    if fact.key is not None:
        return fact.key, fact.polarity
    return stated_slot(fact.text) or (None, fact.polarity)


def slotted(fact: Fact) -> Fact:
    """``fact`` as it is stored: without a key, in the slot its words name (:func:`slot_of`), so
    that the slot's facts, read by key, include it (pure). A judge's rewrite of a fact of no
    slot into "User lives in Paris" is then the fact of ``residence`` the next residence replaces."""
    slot = stated_slot(fact.text) if fact.key is None else None
    return fact if slot is None else replace(fact, key=slot[0], polarity=slot[1])

def rewritten_slot(old: Fact, text: str, candidate: FactCandidate | None = None) -> tuple[str | None, int]:
    """The slot (key, polarity) of ``old`` once its text is ``text`` (pure): its own while its
    text stays; the ``candidate``'s when it takes the candidate's words (the slot the rules or
    the caller that made them read in them, else the one they name); else the slot the new
    words name, or none. Never the old slot for new words: a judge's rewrite of the fact of
    ``residence`` into "User works at Acme" kept ``residence``, and the next residence ended it."""
    if text == old.text:
        return old.key, old.polarity
    if candidate is not None and text == candidate.text and candidate.key is not None:
        return candidate.key, candidate.polarity
    return text_slot(text)

def says_all_of(new: str, old: str) -> bool:
    """Whether ``new`` says everything ``old`` does: each content word of ``old`` is in ``new``
    (pure). Content words are :func:`~tiered_memory.recall.coverage.fact_stems`': lower-cased
    runs of letters and digits, stemmed ("drinks" / "drink", "lives" / "live"), less the recall stop words
    (articles, pronouns, "is" / "has", prepositions, "each", "not" / "no"...), one-letter
    words ("'s") and "user", whom every fact is about. Numbers and names count."""
    return fact_stems(old) - {"user"} <= fact_stems(new)

def turns_saying(text: str, turns: Mapping[str, str]) -> tuple[str, ...]:
    """The ids of ``turns`` (id to text, in order) that say all ``text`` says (:func:`says_all_of`),
    in that order: the turns a fact cites where nobody said which (pure). None when ``text``
    says nothing of its own (only stop words and "user": "OK"), which every turn would."""
    if not fact_stems(text) - {"user"}:
        return ()
    return tuple(i for i, said in turns.items() if says_all_of(said, text))

def other_slots(a: str | None, b: str | None) -> bool:
    """Keys of two slots ("rel:sister", "rel:brother"): facts about two things, however alike (pure)."""
    return a is not None and b is not None and a != b

def decide_resolution(
    candidate: FactCandidate, related: Sequence[tuple[Fact, float]], *, same: float, merge: float,
    judgement: Judgement | None = None,
) -> Resolution:
    """Resolve ``candidate`` against ``related`` (valid facts with cosine similarity), pure.

    A valid LLM ``judgement`` wins, but for one that would store the candidate as a new fact
    (``add``, or ``invalidate`` of another fact) beside a valid fact of its slot: a slot holds one
    valid fact, so the slot's rule decides that one (its reason says the judge was overruled).
    A judgement that names a missing fact is ignored. Rules:
    same slot (:func:`slot_of`: the ``key``, else the slot a fact's words name) with another
    value or polarity invalidates; the same value, in whatever
    words the rules read (:func:`~tiered_memory.slots.stated_value`: "User moved to
    Lisbon" after "User lives in Lisbon"), is a no-op, and said more fully ("Lisbon" -> "Lisbon,
    Portugal") updates; against the facts of no other slot, same
    text, or similarity >= ``same`` where the known fact says all the candidate does, is a no-op
    (the candidate's turns then join its sources), similarity >= ``merge`` updates two facts of no
    slot if the candidate says all the old one does (:func:`says_all_of`); else add. No threshold
    tells a refinement ("User plays the piano every evening") from another fact ("User has a cat
    named Rex" after a dog named Rex: 0.89 with MiniLM, 0.82 with the static embedder; both
    0.86-0.93), and an update that does not repeat the old fact loses it. A fact of a slot is changed only by its slot's rules: an update keeps the
    fact's slot, so a fact of no slot rewriting it ("User works in Paris" over "User lives in
    Paris", 0.90 with MiniLM) would lose it and leave the next residence to end the new text,
    and a slot's words rewriting a fact of no slot would stand outside the slot they name.
    """
    ranked = sorted((r for r in related if r[0].valid), key=lambda r: -r[1])
    if judgement is not None:
        target = None
        if judgement.target is not None and 1 <= judgement.target <= len(ranked):
            target = ranked[judgement.target - 1][0]
        adds = judgement.action == "add" or (judgement.action == "invalidate" and target is not None)
        if adds and _occupied(candidate, ranked, but=target):  # a second valid fact in the slot: its rule's
            ruled = decide_resolution(candidate, ranked, same=same, merge=merge)
            return replace(ruled, reason=f"{ruled.reason}; the judge said {judgement.action}, but a slot "
                                         "holds one valid fact")
        if judgement.action == "add":
            return Resolution(action="add", reason="llm judged it new", method="llm")
        if target is not None:
            text = judgement.text if judgement.action == "update" and judgement.text else None
            return Resolution(action=judgement.action, target_id=target.id,
                              text=text or (candidate.text if judgement.action == "update" else None),
                              reason=f"llm judged {judgement.action}", method="llm")
    for f, _ in ranked:
        key, polarity = slot_of(f)
        if candidate.key and key == candidate.key:
            old, new = _norm(f.text), _norm(candidate.text)
            said = stated_value(f.text), stated_value(candidate.text)
            if said[0] is not None and said[1] is not None:  # "User moved to Lisbon": the value, in any words
                old, new = said[0], said[1]
            if polarity == candidate.polarity and old == new:
                return Resolution(action="noop", target_id=f.id, reason="same fact in the same slot")
            # "Lisbon" -> "Lisbon, Portugal"
            if polarity == candidate.polarity and new[len(old):len(old) + 1] in (",", " ") and new.startswith(old):
                return Resolution(action="update", target_id=f.id, text=candidate.text,
                                  reason=f"says the fact in slot {candidate.key!r} more fully")
            return Resolution(action="invalidate", target_id=f.id,
                              reason=f"contradicts the fact in slot {candidate.key!r}")
    ranked = [r for r in ranked if not other_slots(candidate.key, slot_of(r[0])[0])]
    if not ranked:
        return Resolution(action="add", reason="no related fact")
    best, sim = ranked[0]
    # as alike as that, and nothing the known fact does not say ("User's flight is on May 4" is
    # 0.96-0.97 from "... on May 3"): the new fact is not lost as known
    if _norm(best.text) == _norm(candidate.text) or (sim >= same and says_all_of(best.text, candidate.text)):
        return Resolution(action="noop", target_id=best.id, reason=f"already known (similarity {sim:.2f})")
    if sim >= merge and best.type == candidate.type and best.polarity == candidate.polarity \
            and slot_of(best)[0] is None and candidate.key is None and says_all_of(candidate.text, best.text):
        return Resolution(action="update", target_id=best.id, text=candidate.text,
                          reason=f"refines a similar fact (similarity {sim:.2f})")
    return Resolution(action="add", reason=f"nearest fact is different (similarity {sim:.2f})")


def _occupied(candidate: FactCandidate, ranked: Sequence[tuple[Fact, float]], *, but: Fact | None) -> bool:
    """Whether a valid fact of ``ranked`` other than ``but`` is in ``candidate``'s slot (pure)."""
    return candidate.key is not None and any(
        slot_of(f)[0] == candidate.key for f, _ in ranked if but is None or f.id != but.id)


def one_in_slot(moved: Fact, rivals: Sequence[Fact], at: float, *, same: float, merge: float,
                by: str) -> list[tuple[Fact, Fact, float, str]]:
    """What becomes of the other valid facts of a slot (``rivals``) once ``moved`` is in it with
    its words (an edit or a judge's rewrite, ``by``, gave it new text in the slot), as
    (invalidated fact, the fact superseding it, invalid from, reason) (pure). Each rival is
    resolved as a new fact of ``moved``'s words said at ``at`` would resolve it
    (:func:`decide_resolution`'s slot rules) and, since ``moved`` is not dropped, invalidated
    from ``at``, superseded by it: another value, the same value in other words (a no-op for
    a new fact: here the rival is the duplicate) or said less fully (an update). A rival said
    after ``at`` that ``moved`` contradicts stays, and ``moved`` is history, superseded by it,
    as a statement older than the fact it contradicts is. Either way the slot keeps one valid fact.
    """
    said = FactCandidate(type=moved.type, text=moved.text, confidence=moved.confidence, key=moved.key,
                         polarity=moved.polarity)
    plan: list[tuple[Fact, Fact, float, str]] = []
    for rival in rivals:
        res = decide_resolution(said, [(rival, 1.0)], same=same, merge=merge)
        if res.action == "invalidate" and at < rival.valid_from:
            return [*plan, (moved, rival, rival.valid_from,
                            f"{by} of fact {moved.id} said before fact {rival.id}, which stays ({res.reason})")]
        plan.append((rival, moved, at, f"replaced by {by} of fact {moved.id} ({res.reason})"))
    return plan
