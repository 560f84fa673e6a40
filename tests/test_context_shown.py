"""build_context's ``shown``: the stored messages the caller already shows the model (a
framework's short-term queue, an agent's state). They are left out before the budget is fitted:
out of the relevant past turns, whose room then goes to other memories, and out of the recent
buffer, which becomes the session's turns before them. They are not reported as dropped."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tiered_memory import InvalidInputError, StaticEmbedder, TieredMemory
from tiered_memory.context.assembly import best_kept, turn_candidates, what_is_said
from tiered_memory.types import MemoryHit

pytestmark = pytest.mark.record_stores("sqlite", "postgres")

TOPICS = ["tides", "volcanoes", "rainbows", "glaciers", "comets", "owls", "bees", "jazz", "chess", "bread"]


def _conversation(memory: TieredMemory) -> list[str]:
    """Forty turns about tides, stored as they were put; their ids, oldest first."""
    rows = [m for n, topic in enumerate(TOPICS * 4) for m in (
        {"role": "user", "content": f"Q{n}: tell me about tides and {topic}, at length please."},
        {"role": "assistant", "content": f"A{n}: tides and {topic} have a long history and many details."})]
    return memory.add_many(rows, session_id="now", user_id="u1")


def _ids(ctx: Any) -> set[str]:
    return {i.id for s in ctx.sections for i in s.items}


def test_shown_turns_leave_their_room_to_other_turns(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    ids = _conversation(memory)
    queue = ids[-60:]  # the caller's short-term queue, longer than the core's recent buffer (20 messages)
    plain = memory.build_context("tides", user_id="u1", session_id="now", max_tokens=600)
    ctx = memory.build_context("tides", user_id="u1", session_id="now", max_tokens=600, shown=queue)
    assert not _ids(ctx) & set(queue) and not {i.id for i in ctx.recent} & set(queue)
    assert _ids(plain) & set(queue)  # without it, the queue's turns take room in the memory
    assert _ids(ctx) - _ids(plain)  # which goes to other turns
    assert not {d.id for d in ctx.dropped} & set(queue)  # the model sees them: nothing is lost
    # the recent buffer is the turns just before the queue, and the room the queue's turns took
    # goes to other turns: the memory and the recent turns fill the budget about as much
    assert [i.id for i in ctx.recent][-1] == ids[-61]
    assert ctx.tokens >= 0.9 * plain.tokens


async def test_the_async_twin_takes_shown_too(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    ids = _conversation(memory)
    ctx = await memory.abuild_context("tides", user_id="u1", session_id="now", max_tokens=600, shown=set(ids))
    assert not ctx.recent and not _ids(ctx) & set(ids)


def test_shown_ids_of_another_user_are_an_unknown_id_to_this_one(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    _conversation(memory)
    theirs = memory.add_many([{"role": "user", "content": "tides and comets, at length please."}],
                             session_id="now", user_id="u2")
    unknown = memory.build_context("tides", user_id="u1", session_id="now", max_tokens=600, shown=["nope"])
    other = memory.build_context("tides", user_id="u1", session_id="now", max_tokens=600, shown=theirs)
    assert other == unknown and _ids(other)


@pytest.mark.parametrize("shown", ["m1", b"m1", [1], [None], 5, {"m1": 1}.items()])
def test_bad_shown_is_refused(make_memory: Callable[..., TieredMemory], shown: object) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    with pytest.raises(InvalidInputError, match="shown"):
        memory.build_context("tides", user_id="u1", session_id="now", shown=shown)  # type: ignore[arg-type]


@pytest.mark.parametrize("room, pool, left_out, asked", [
    (500, 150, 0, 40),     # nothing left out: as before
    (500, 150, 8, 56),     # two more candidates for each turn left out: it, and a twin, may be among the hits
    (500, 150, 16, 72),
    (500, 150, 20, 75),    # never beyond half the pool: a bigger pool changes the scores of the turns kept
    (500, 150, 500, 75),   # a long queue does not make every search huge
    (500, 300, 500, 80),   # at most as many again
    (3000, 150, 10, 75),   # the pool's half asked already: no more
])
def test_turn_candidates_with_turns_left_out(room: int, pool: int, left_out: int, asked: int) -> None:
    assert turn_candidates(room, pool, left_out) == asked


def _hit(n: int, spread: bool = False) -> MemoryHit:
    why = {"spread": "the best turn of a session not yet among the hits"} if spread else {}
    return MemoryHit(id=f"m{n}", text=f"turn {n}", score=1.0 / (n + 1), layer="turn", session_id="s",
                     timestamp=float(n), explanation=why)


@pytest.mark.parametrize("hits, wanted, kept", [
    ([0, 1, 2], 5, [0, 1, 2]),              # fewer than wanted: all, in order
    ([0, 1, 2, 3], 2, [0, 1]),              # the best, in order
    ([0, 1, 2, 3, "4s", "5s"], 4, [0, 1, "4s", "5s"]),  # the sessions spread to are kept; the others trimmed
    (["0s", "1s", "2s"], 2, ["0s", "1s"]),  # all spread: the first
    ([0, 1], 0, []),
])
def test_best_kept(hits: list[int | str], wanted: int, kept: list[int | str]) -> None:
    def made(n: int | str) -> MemoryHit:
        return _hit(int(str(n).rstrip("s")), spread=str(n).endswith("s"))
    assert best_kept([made(h) for h in hits], wanted) == [made(h) for h in kept]


def _recalled(memory: TieredMemory, shown: list[str], *, include_recent: bool = True) -> list[str]:
    ctx = memory.build_context("when is my flight to Lisbon?", user_id="u1", session_id="now", max_tokens=600,
                               shown=shown, include_recent=include_recent)
    return [i.text for s in ctx.sections for i in s.items]


@pytest.mark.record_stores("sqlite")  # the duplicates' SQL is one for both stores (store.base.duplicates_sql)
def test_a_twin_of_a_shown_message_is_not_recalled(make_memory: Callable[..., TieredMemory]) -> None:
    """A turn stored twice (the same text by another call: the later one a duplicate of the first)
    came back as its twin when the model was shown the other; now a twin of a shown message is not
    recalled when it says the same words. A near-duplicate that says something else (another date,
    stored in the same batch) is still recalled: the model sees only the other one."""
    memory = make_memory(embedder=StaticEmbedder())
    said = "My flight to Lisbon leaves on May 3 at noon."
    old, changed, *_ = memory.add_many(
        [{"role": "user", "content": said}, {"role": "user", "content": "My flight to Lisbon leaves on May 4 at noon."},
         *({"role": "user", "content": f"Lunch idea {n}: soup with {food}."}
           for n, food in enumerate(["leeks", "beans", "corn"]))], session_id="last-week", user_id="u1")
    [again] = memory.add_many([{"role": "user", "content": said.upper()}], session_id="now", user_id="u1")
    twins = memory.store.duplicates("u1", originals=[old])  # type: ignore[attr-defined]
    assert set(twins) == {changed, again}  # the store holds both as duplicates of the first
    # nothing shown (and no recent turns, where its twin would be: test_a_twin_of_a_recent_turn_...)
    assert said in _recalled(memory, [], include_recent=False)  # the first is recalled
    assert said not in _recalled(memory, [again])  # its twin is shown: not recalled again
    assert said.upper() not in _recalled(memory, [old], include_recent=False)  # nor the other way round
    assert said in _recalled(memory, [changed], include_recent=False)  # May 4 is shown: May 3 is still news


@pytest.mark.record_stores("sqlite")
def test_a_twin_of_a_shown_message_whose_original_is_neither_shown_nor_found_is_not_recalled(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The shown message and a found one both stored again after an original that the search did
    not hand on (it is among the recent turns): the twin was looked up through the original's id,
    read only for the shown and found turns, so the found one was recalled beside the shown one.
    The same text as a shown turn is decided on the text now."""
    memory = make_memory(embedder=StaticEmbedder())
    said = "My flight to Lisbon leaves on May 3 at noon."
    [first] = memory.add_many([{"role": "user", "content": said}], session_id="now", user_id="u1")
    memory.add_many([{"role": "user", "content": f"Lunch idea {n}: soup with {food}."}
                     for n, food in enumerate(["leeks", "beans", "corn"])], session_id="last-week", user_id="u1")
    [shown] = memory.add_many([{"role": "user", "content": said}], session_id="trip", user_id="u1")
    [other] = memory.add_many([{"role": "user", "content": f"  {said.lower()}"}], session_id="plans", user_id="u1")
    assert set(memory.store.duplicates("u1", originals=[first])) == {shown, other}  # type: ignore[attr-defined]
    # a past turn of another session (no recent turns, where the first, which says it too, would be)
    assert said.lower() in [t.strip() for t in _recalled(memory, [], include_recent=False)]
    assert [t for t in _recalled(memory, [shown]) if "lisbon" in t.casefold()] == []  # shown: its twin is not recalled


@pytest.mark.record_stores("sqlite")
def test_without_recent_turns_the_budget_goes_to_the_sections(make_memory: Callable[..., TieredMemory]) -> None:
    """``include_recent=False`` (a caller that shows memory_text() alone): no recent turns, whose
    room (BudgetConfig.buffer_share) the model would never see; the session's turns not shown are
    past turns to recall, and the sections fill the budget."""
    memory = make_memory(embedder=StaticEmbedder())
    ids = _conversation(memory)
    plain = memory.build_context("tides and bread", user_id="u1", session_id="now", max_tokens=600)
    ctx = memory.build_context("tides and bread", user_id="u1", session_id="now", max_tokens=600,
                               include_recent=False)
    assert plain.recent and not ctx.recent and not ctx.recent_messages
    newest = {ids[-2]}  # Q39, about bread: in the recent turns, so never recalled
    assert newest <= {i.id for i in plain.recent} and not newest & _ids(plain)
    assert newest <= _ids(ctx)  # without recent turns it is a past turn like any other, and recalled
    assert sum(s.tokens for s in ctx.sections) > 1.3 * sum(s.tokens for s in plain.sections)
    assert memory.count_tokens(ctx.memory_text()) <= 600
    with pytest.raises(InvalidInputError, match="include_recent"):
        memory.build_context("tides", user_id="u1", session_id="now", include_recent="no")  # type: ignore[arg-type]


@pytest.mark.record_stores("sqlite")
def test_a_twin_of_a_recent_turn_is_not_recalled(make_memory: Callable[..., TieredMemory]) -> None:
    """The user said again, in this session, what they said last week (or a re-import stored it again):
    the recent turns held it, not ``shown``, and the past twin was recalled beside it, a duplicate the
    model reads twice. The recent turns count as shown for twins now, by the same rule (the same words
    in the same role): a near-duplicate (another date) and the same words in another role still tell
    the model something, and another user's recent turns never hide this user's."""
    memory = make_memory(embedder=StaticEmbedder())
    said = "My flight to Lisbon leaves on May 3 at noon."
    changed = "My flight to Lisbon leaves on May 4 at noon."
    lunch = [{"role": "user", "content": f"Lunch idea {n}: soup with {food}."}
             for n, food in enumerate(["leeks", "beans", "corn"])]
    memory.add_many([{"role": "user", "content": said}, *lunch], session_id="last-week", user_id="u1")
    memory.add_many([{"role": "user", "content": said}, *lunch], session_id="last-week", user_id="u2")
    memory.add_many([{"role": "user", "content": changed}, {"role": "assistant", "content": said}],
                    session_id="a-month-ago", user_id="u1")
    assert said in _recalled(memory, [])  # nothing in this session yet: recalled
    [again] = memory.add_many([{"role": "user", "content": f"  {said.upper()}"}], session_id="now", user_id="u1")
    ctx = memory.build_context("when is my flight to Lisbon?", user_id="u1", session_id="now", max_tokens=600)
    assert [i.id for i in ctx.recent] == [again]
    recalled = [(i.role, i.text) for s in ctx.sections for i in s.items]
    assert ("user", said) not in recalled  # the recent turn says it: not recalled again
    assert ("user", changed) in recalled and ("assistant", said) in recalled  # what differs still is
    # u2 said it last week too; u1's recent turn hides nothing of u2's, and u2's none of u1's
    theirs = memory.build_context("when is my flight to Lisbon?", user_id="u2", session_id="now", max_tokens=600)
    assert ("user", said) in [(i.role, i.text) for s in theirs.sections for i in s.items]
    memory.add_many([{"role": "user", "content": said}], session_id="then", user_id="u2")
    ctx = memory.build_context("when is my flight to Lisbon?", user_id="u1", session_id="then", max_tokens=600)
    assert ("user", said) in [(i.role, i.text) for s in ctx.sections for i in s.items]


TWIN_QUERY = "tides and the moon"


def _last_week(memory: TieredMemory) -> list[dict[str, str]]:
    """Sixty short user turns about tides, each saying something else, stored last week."""
    rows = [{"role": "user", "content": f"Tides note {n}: the {topic} tide rose {n} cm under the moon."}
            for n, topic in enumerate(TOPICS * 6)]
    memory.add_many(rows, session_id="last-week", user_id="u1")
    return rows


def _said_again(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Eight of them said again today, with an exclamation mark: twins (the same words), each with a
    vector of its own, so a search finds both."""
    return [{**r, "content": r["content"].replace(".", "!")} for r in rows[:: len(rows) // 8][:8]]


def _twins(again: list[dict[str, str]]) -> set[str]:
    return {r["content"] for r in again} | {r["content"].replace("!", ".") for r in again}


def _turns(ctx: Any) -> list[str]:
    turns = ctx.section("turns")
    return [] if turns is None else [i.text for i in turns.items]


@pytest.mark.record_stores("sqlite")
def test_twins_of_recent_turns_leave_their_candidates_to_other_turns(make_memory: Callable[..., TieredMemory]) -> None:
    """The recent buffer repeats eight turns of last week word for word: those twins are left out
    of the recalled turns after the search, and the search was asked for no more candidates, so the
    context recalled fewer turns than the room and the candidate count allow, while sixty relevant
    turns were there. The search is asked for as many more as could be left out now."""
    memory = make_memory(embedder=StaticEmbedder())
    rows = _last_week(memory)
    # without twins: a session whose eight recent turns, as long, say something else
    memory.add_many([{"role": "user", "content": f"Lunch plan {n}: the {food} soup simmered {n} min in a pot."}
                     for n, food in enumerate(["leek", "bean", "corn", "kale", "pea", "okra", "yam", "fig"])],
                    session_id="other", user_id="u1")
    plain = memory.build_context(TWIN_QUERY, user_id="u1", session_id="other", max_tokens=1800)
    assert len(_turns(plain)) >= turn_candidates(1800, memory.config.retrieval.candidates) - 5  # the room holds them
    again = _said_again(rows)
    memory.add_many(again, session_id="now", user_id="u1")
    ctx = memory.build_context(TWIN_QUERY, user_id="u1", session_id="now", max_tokens=1800)
    assert sorted(i.text for i in ctx.recent) == sorted(r["content"] for r in again)
    assert abs(sum(i.tokens for i in ctx.recent) - sum(i.tokens for i in plain.recent)) <= 8
    recalled = _turns(ctx)
    assert not set(recalled) & _twins(again)  # the recent turns say them: not recalled
    assert len(recalled) == len(_turns(plain))  # their room goes to other turns, as many as without the twins
    both = [t for t in recalled if t in _turns(plain)]
    assert both == [t for t in _turns(plain) if t in recalled]  # in the order they had


@pytest.mark.record_stores("sqlite")
def test_twins_of_shown_messages_leave_their_candidates_to_other_turns(
        make_memory: Callable[..., TieredMemory]) -> None:
    """The same through ``shown`` (the LangChain middleware's path: no recent section, the thread's
    stored turns shown): the shown turns and their twins of last week are left out, and as many
    other turns recalled as without them."""
    memory = make_memory(embedder=StaticEmbedder())
    rows = _last_week(memory)
    plain = _turns(memory.build_context(TWIN_QUERY, user_id="u1", session_id="new", max_tokens=1500,
                                        include_recent=False))
    assert len(plain) == turn_candidates(1500, memory.config.retrieval.candidates)
    ids = memory.add_many(_said_again(rows), session_id="now", user_id="u1")
    ctx = memory.build_context(TWIN_QUERY, user_id="u1", session_id="now", max_tokens=1500, include_recent=False,
                               shown=ids)
    recalled = _turns(ctx)
    assert not set(recalled) & _twins(_said_again(rows))
    assert len(recalled) == len(plain)
    assert [t for t in recalled if t in plain] == [t for t in plain if t in recalled]


@pytest.mark.record_stores("sqlite")
def test_turns_saying_a_shown_text_leave_their_candidates_to_other_turns(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A caller whose messages are not stored (LlamaIndex's ``Memory`` queue) passes their texts
    (``shown_texts``): the past turns saying one of them (in any role; case, spacing and punctuation
    aside) were recalled, and the caller then had to leave them out, their room lost. They are left
    out before fitting now, the search asked for more, so as many other turns are recalled as
    without them, and none is reported as dropped (the model sees it)."""
    memory = make_memory(embedder=StaticEmbedder())
    rows = _last_week(memory)
    told = _said_again(rows)  # in the caller's queue, never stored
    memory.add_many([{"role": "assistant", "content": told[0]["content"]}], session_id="older", user_id="u1")
    plain = _turns(memory.build_context(TWIN_QUERY, user_id="u1", session_id="new", max_tokens=1500,
                                        include_recent=False))
    assert set(plain) & _twins(told)  # recalled when the caller does not say it shows them
    ctx = memory.build_context(TWIN_QUERY, user_id="u1", session_id="new", max_tokens=1500, include_recent=False,
                               shown_texts=[f" {r['content'].upper()} " for r in told])
    recalled = _turns(ctx)
    assert not set(recalled) & _twins(told)  # the assistant's copy too
    assert len(recalled) == len(plain)
    assert [t for t in recalled if t in plain] == [t for t in plain if t in recalled]
    left_out = {m.id for s in ("last-week", "older") for m in memory.get_messages(s, user_id="u1")
                if m.content in _twins(told)}
    assert len(left_out) == 9 and not left_out & {d.id for d in ctx.dropped}


@pytest.mark.parametrize("a, b, same", [
    ("What IS my dog's name?", "  what is my dog's name", True),
    ("👍", " 👍\n", True),
    ("👍", "?", False),  # no words: itself, not any other text of no words
    ("a b", "ab", False),
])
def test_what_is_said(a: str, b: str, same: bool) -> None:
    assert (what_is_said(a) == what_is_said(b)) is same


@pytest.mark.record_stores("sqlite")
def test_bad_shown_texts_are_refused(make_memory: Callable[..., TieredMemory]) -> None:
    memory = make_memory(embedder=StaticEmbedder())
    for texts in ["hello", b"hello", [1], [None], 5]:  # a lone text would be its characters
        with pytest.raises(InvalidInputError, match="shown_texts"):
            memory.build_context("tides", user_id="u1", session_id="now", shown_texts=texts)  # type: ignore[arg-type]


@pytest.mark.record_stores("sqlite")
def test_a_recent_turn_saying_a_shown_text_is_chosen_with_its_turn_and_leaves_its_room(
        make_memory: Callable[..., TieredMemory]) -> None:
    """A question asked again in this conversation (the caller's queue holds it, not stored): the recent turns
    are chosen with the stored question, so its answer stays, then the question is left out of them, its
    room going to the sections; not reported as dropped."""
    memory = make_memory(embedder=StaticEmbedder())
    memory.add_many([{"role": "user", "content": f"Note {n}: tides are pulled by the Moon, said the guide."}
                     for n in range(10, 22)], session_id="notes", user_id="u1")
    asked = "How high do the tides rise in the bay at the new moon, and how far out do they go at the full moon?"
    ids = memory.add_many([{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi."},
                           {"role": "user", "content": asked}, {"role": "assistant", "content": "Four metres."}],
                          session_id="now", user_id="u1")
    plain = memory.build_context("tides", user_id="u1", session_id="now", max_tokens=300)
    ctx = memory.build_context("tides", user_id="u1", session_id="now", max_tokens=300, shown_texts=[asked])
    assert [i.id for i in plain.recent] == ids
    assert [i.id for i in ctx.recent] == [ids[0], ids[1], ids[3]]  # the answer kept, the turn before too
    assert [m.id for m in ctx.recent_messages] == [ids[0], ids[1], ids[3]]
    assert len(_ids(ctx)) > len(_ids(plain))  # the question's room holds more notes
    assert ids[2] not in _ids(ctx) and ids[2] not in {d.id for d in ctx.dropped}
