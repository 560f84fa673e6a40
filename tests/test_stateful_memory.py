"""The public facade against a model, property-based: a hypothesis state machine.

A few users (look-alike ids) and sessions; the machine adds messages (unicode, combining
marks, bidi and escape characters, text past the 1,200-character chunk size, caller-chosen
ids that collide), forgets messages, clears sessions, forgets users, ends sessions (the
extractive path), consolidates (old timestamps get turns archived), adds, edits and
deletes facts, deletes episodes, writes working memory and scratchpads, closes and
reopens the folder, rebuilds the index, re-imports its own export (a no-op) and moves
the whole memory to a fresh folder by ``export_jsonl`` / ``import_jsonl``. A plain Python
model holds what should be stored (facts and episodes the extractive rules make are read
back once, when they are made, and held to from then on). After every step each
acknowledged message reads back identically (``get_messages``, ``sessions``, ``stats``),
forgotten ones appear in no read, and each user's reads (search, search_sessions,
build_context, facts, episodes, working memory, export) show only that user's records.
Bad input (the machine tries some every run) raises a typed error and changes nothing
any read can see.

The embedded default on real components: SQLite, Chroma and the static embedder.
``TM_STATEFUL_EXAMPLES`` / ``TM_STATEFUL_STEPS`` run a longer campaign locally
(``TM_STATEFUL_EXAMPLES=300 pytest tests/test_stateful_memory.py``).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule, run_state_machine_as_test

from stateful_model import (BLANK, CONTENT, COUNTS, FACTS, METADATA, NUMBERS, SESSIONS, TEXTS, TIMESTAMP, USERS,
                            MemoryModel, Turn, epoch)
from tiered_memory import TieredMemory
from tiered_memory.errors import NotFoundError

STEPS = int(os.environ.get("TM_STATEFUL_STEPS", "25"))
EXAMPLES = int(os.environ.get("TM_STATEFUL_EXAMPLES", "20"))


class MemoryMachine(MemoryModel):
    """The steps that change the memory, each checked as it is taken and by the model's reads."""

    # ---- messages ------------------------------------------------------------
    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS), batch=st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": CONTENT},
        optional={"metadata": METADATA, "timestamp": TIMESTAMP, "id": st.sampled_from(["m1", "m2", "m3"])}),
        min_size=1, max_size=4))
    def add_many(self, user: str, session: str, batch: list[dict[str, Any]]) -> None:
        chosen = [b["id"] for b in batch if "id" in b]
        mine = self.stored(user)
        clash = len(set(chosen)) < len(chosen) or any(
            (i in mine and (mine[i][0], mine[i][1].role, mine[i][1].content) != (session, b["role"], b["content"]))
            or (i not in mine and self.owner(i) is not None) for b in batch if (i := b.get("id")))
        if clash:  # a repeated id, an id holding another message, or another user's id
            self.refused(lambda: self.memory.add_many(batch, session_id=session, user_id=user))
            return
        ids = self.memory.add_many(batch, session_id=session, user_id=user)
        assert len(ids) == len(batch) and all(b.get("id", i) == i for b, i in zip(batch, ids))
        for b, i in zip(batch, ids):
            if i not in mine:  # a chosen id stored already (live or archived) is a retry: skipped
                ts = epoch(b.get("timestamp"))
                self.turns.setdefault((user, session), []).append(
                    Turn(id=i, role=b["role"], content=b["content"], metadata=b.get("metadata") or {}, timestamp=ts))
                self.gone.discard(i)
        self.last_batch = (user, session, batch, ids)

    @initialize(contents=st.lists(CONTENT, min_size=len(USERS) * 2, max_size=len(USERS) * 2),
                stamps=st.lists(TIMESTAMP, min_size=len(USERS) * 2, max_size=len(USERS) * 2))
    def some_history(self, contents: list[str], stamps: list[Any]) -> None:
        """Two turns per user to start from, so that most steps have something to act on."""
        for n, user in enumerate(USERS):
            batch = [{"role": r, "content": c, "timestamp": t}
                     for r, c, t in zip(["user", "assistant"], contents[2 * n:2 * n + 2], stamps[2 * n:2 * n + 2])]
            self.add_many(user, SESSIONS[n % len(SESSIONS)], batch)

    @precondition(lambda self: self.last_batch is not None)
    @rule()
    def retry_last_batch(self) -> None:
        assert self.last_batch is not None
        user, session, batch, ids = self.last_batch
        if not all("id" in b for b in batch) or any(i not in self.stored(user) for i in ids):
            return  # only a batch of chosen ids, all still stored, is a pure retry
        before = self.observed()
        assert self.memory.add_many(batch, session_id=session, user_id=user) == ids
        assert self.observed() == before, "a retry stored something again"

    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS), content=CONTENT)
    def add_one(self, user: str, session: str, content: str) -> None:
        i = self.memory.add("user", content, session_id=session, user_id=user)
        self.turns.setdefault((user, session), []).append(Turn(id=i, role="user", content=content, metadata={},
                                                               timestamp=None))

    @precondition(lambda self: any(self.stored(u) for u in USERS))
    @rule(user=st.sampled_from(USERS), data=st.data())
    def forget(self, user: str, data: st.DataObject) -> None:
        mine = sorted(self.stored(user))
        if not mine:
            return
        i = data.draw(st.sampled_from(mine))
        self.memory.forget(i, user_id=user)
        session = self.stored(user)[i][0]
        self.turns[(user, session)] = [t for t in self.turns.get((user, session), []) if t.id != i]
        self.archived[user].pop(i, None)
        self.gone.add(i)
        self.covered.discard(i)

    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS))
    def clear_session(self, user: str, session: str) -> None:
        dropped = [t.id for t in self.turns.pop((user, session), [])]
        dropped += [i for i, (s, _) in self.archived[user].items() if s == session]
        assert self.memory.clear_session(session, user_id=user) == len(dropped)
        self.archived[user] = {i: v for i, v in self.archived[user].items() if v[0] != session}
        self.gone.update(dropped)
        self.covered.difference_update(dropped)
        self.working.pop((user, session), None)
        self.pads.pop((user, session), None)

    @rule(user=st.sampled_from(USERS))
    def forget_user(self, user: str) -> None:
        mine = self.stored(user)
        assert self.memory.forget_user(user) == len(mine), "forget_user's count of messages removed"
        self.archived[user] = {}
        self.gone.update(mine)
        self.covered.difference_update(mine)
        self.gone.update(self.facts[user] | set(self.episodes[user]))
        self.turns = {k: v for k, v in self.turns.items() if k[0] != user}
        self.facts[user], self.episodes[user] = set(), {}
        self.working = {k: v for k, v in self.working.items() if k[0] != user}
        self.pads = {k: v for k, v in self.pads.items() if k[0] != user}

    # ---- episodes and facts --------------------------------------------------
    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS))
    def end_session(self, user: str, session: str) -> None:
        uncovered = [t.id for t in self.turns.get((user, session), []) if t.id not in self.covered]
        mine = {e for e, s in self.episodes[user].items() if s == session}
        if not uncovered and not mine:
            self.refused(lambda: self.memory.end_session(session, user_id=user), NotFoundError)
            return
        episode = self.memory.end_session(session, user_id=user)
        assert episode.user_id == user and episode.session_id == session
        if not uncovered:  # idempotent: nothing new to cover, the session's latest episode
            assert episode.id in mine
            return
        assert episode.source_ids == uncovered and episode.metadata["method"] == "extractive"
        self.covered.update(uncovered)
        self.episodes[user][episode.id] = session
        self.cites[episode.id] = episode.source_ids
        self.facts[user] |= {f.id for f in self.memory.facts(user, include_invalid=True)}  # extracted ones

    @rule(user=st.sampled_from(USERS), text=st.sampled_from(FACTS), kind=st.sampled_from(["fact", "preference"]),
          confidence=st.floats(0.0, 1.0))
    def add_fact(self, user: str, text: str, kind: str, confidence: float) -> None:
        fact = self.memory.add_fact(text, user_id=user, type=kind, confidence=confidence)
        assert fact.user_id == user
        assert fact in self.memory.facts(user, include_invalid=True)
        self.facts[user].add(fact.id)

    @precondition(lambda self: any(self.facts.values()))
    @rule(user=st.sampled_from(USERS), text=st.sampled_from(FACTS), data=st.data())
    def update_fact(self, user: str, text: str, data: st.DataObject) -> None:
        valid = sorted(f.id for f in self.memory.facts(user))
        if valid:
            fact = self.memory.update_fact(data.draw(st.sampled_from(valid)), user_id=user, text=text)
            assert fact.text == text and fact in self.memory.facts(user, include_invalid=True)

    @precondition(lambda self: any(self.facts.values()))
    @rule(user=st.sampled_from(USERS), data=st.data())
    def delete_fact(self, user: str, data: st.DataObject) -> None:
        if self.facts[user]:
            fact_id = data.draw(st.sampled_from(sorted(self.facts[user])))
            self.memory.delete_fact(fact_id, user_id=user)
            self.facts[user].discard(fact_id)
            self.gone.add(fact_id)
            assert self.memory.fact_history(user, fact_id)[-1].action == "delete"

    @precondition(lambda self: any(self.episodes.values()))
    @rule(user=st.sampled_from(USERS), data=st.data())
    def delete_episode(self, user: str, data: st.DataObject) -> None:
        if self.episodes[user]:
            episode_id = data.draw(st.sampled_from(sorted(self.episodes[user])))
            self.memory.delete_episode(episode_id, user_id=user)
            session = self.episodes[user].pop(episode_id)
            self.gone.add(episode_id)
            # the session's turns stay covered up to the last live one a remaining episode cites
            cited = {i for e, s in self.episodes[user].items() if s == session for i in self.cites[e]}
            live = [t.id for t in self.turns.get((user, session), [])]
            last = max((n for n, i in enumerate(live) if i in cited), default=-1)
            self.covered.difference_update(live[last + 1:])

    @rule(user=st.sampled_from(USERS))
    def consolidate(self, user: str) -> None:
        """Idle sessions get episodes, old episodes' turns move to the archive, near-duplicate
        facts merge, stale facts and working items are pruned: read back, then held to the model."""
        report = self.memory.consolidate(user)
        episodes = self.memory.episodes(user)
        assert {e.id for e in episodes} >= set(self.episodes[user]), "consolidate deleted an episode"
        for e in episodes:
            if e.id not in self.episodes[user]:
                assert e.source_ids == [t.id for t in self.turns[(user, e.session_id)] if t.id not in self.covered]
                self.covered.update(e.source_ids)
                self.episodes[user][e.id] = e.session_id
                self.cites[e.id] = e.source_ids
        moved = 0
        for (u, s), ts in list(self.turns.items()):
            if u == user:
                held = {m.id for m in self.memory.get_messages(s, user_id=u)}
                assert all(t.id in self.covered for t in ts if t.id not in held), "archived a turn no episode covers"
                self.archived[u].update({t.id: (s, t) for t in ts if t.id not in held})
                moved += sum(t.id not in held for t in ts)
                self.turns[(u, s)] = [t for t in ts if t.id in held]
        assert report.archived_messages == moved
        facts = {f.id for f in self.memory.facts(user, include_invalid=True)}
        assert not facts & self.gone, "a deleted fact came back"
        self.gone |= self.facts[user] - facts  # merged or pruned
        self.facts[user] = facts
        for (u, s), items in self.working.items():
            if u == user:
                left = {i.id for i in self.memory.working_memory(s, user_id=u).items_raw()}
                assert left <= items
                self.gone |= items - left
                items &= left

    # ---- working memory ------------------------------------------------------
    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS), text=CONTENT.filter(lambda t: len(t) < 1000),
          importance=st.floats(0.0, 1.0))
    def remember(self, user: str, session: str, text: str, importance: float) -> None:
        wm = self.memory.working_memory(session, user_id=user)
        item = wm.remember(text, importance=importance, type="goal")
        assert item in wm.items_raw()
        self.working.setdefault((user, session), set()).add(item.id)

    @precondition(lambda self: any(self.working.values()))
    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS), data=st.data())
    def forget_working_item(self, user: str, session: str, data: st.DataObject) -> None:
        items = sorted(self.working.get((user, session), set()))
        if items:
            item_id = data.draw(st.sampled_from(items))
            assert self.memory.working_memory(session, user_id=user).forget(item_id) is True
            self.working[(user, session)].discard(item_id)
            self.gone.add(item_id)

    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS), key=st.sampled_from(["step", "plan", "é"]),
          value=st.one_of(st.none(), st.integers(-10, 10), st.sampled_from(TEXTS[:8]), st.lists(st.booleans())))
    def scratchpad(self, user: str, session: str, key: str, value: Any) -> None:
        pad = self.memory.working_memory(session, user_id=user).scratchpad
        pad[key] = value
        self.pads.setdefault((user, session), {})[key] = value

    # ---- lifecycle -----------------------------------------------------------
    @rule()
    def reopen(self) -> None:
        before = self.observed()
        self.memory.close()
        self.memory = TieredMemory(self.folder, embedder=self.embedder)
        assert self.observed() == before, "closing and reopening changed what the reads show"

    @rule()
    def rebuild_index(self) -> None:
        before = self.observed()
        self.memory.rebuild_index()
        after = self.observed()
        # which turns share a vector is not promised: a rebuild embeds the store in one batch, whose
        # near-identical texts (dedup_threshold) are deduplicated, where add_many compares one call's
        before["stats"], after["stats"] = (replace(seen["stats"], indexed=0, duplicates=0, vectors=0)
                                           for seen in (before, after))
        assert after == before, "rebuilding the derived index changed what the reads show"

    @rule()
    def reimport_is_a_no_op(self) -> None:
        dump = self.root / f"{self.name}-{next(self.moves)}.jsonl"
        before = self.observed()
        self.memory.export_jsonl(dump)
        report = self.memory.import_jsonl(dump)
        assert not (report.imported or report.facts_imported or report.episodes_imported or report.working_imported)
        assert self.observed() == before, "importing a memory's own export into it changed it"

    @rule()
    def move_by_export(self) -> None:
        dump = self.root / f"{self.name}-{next(self.moves)}.jsonl"
        before = self.observed()
        self.memory.export_jsonl(dump)
        fresh = TieredMemory(dump.with_suffix(""), embedder=self.embedder)
        report = fresh.import_jsonl(dump)
        assert not report.invalid and report.skipped_existing == 0
        self.memory.close()
        self.memory, self.folder = fresh, dump.with_suffix("")
        after = self.observed()
        # a message's seq is where it sits in its store: the order holds, the numbers do not
        unseq: Callable[[dict[str, Any]], Any] = lambda seen: {
            u: (v[0], {s: [replace(m, seq=0) for m in ms] for s, ms in v[1].items()}, *v[2:])
            for u, v in seen.items() if u != "stats"}
        assert unseq(after) == unseq(before), "the moved memory reads differently"
        assert (after["stats"].messages, after["stats"].sessions, after["stats"].users) == \
            (before["stats"].messages, before["stats"].sessions, before["stats"].users)

    # ---- refused input -------------------------------------------------------
    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS), bad=st.sampled_from([
        ("content", b) for b in BLANK] + [("content", "a\x00b"), ("content", "\ud800"), ("role", "System"),
                                          ("timestamp", math.nan), ("timestamp", math.inf), ("timestamp", 1.7e12),
                                          ("timestamp", True), ("metadata", {1: "x"}), ("id", "ep:1")]))
    def add_refused(self, user: str, session: str, bad: tuple[str, Any]) -> None:
        batch = [{"role": "user", "content": "a good message first"}, {"role": "user", "content": "ok", bad[0]: bad[1]}]
        self.refused(lambda: self.memory.add_many(batch, session_id=session, user_id=user))

    @rule(user=st.sampled_from(USERS), other=st.sampled_from(USERS), data=st.data())
    def touch_what_is_not_yours(self, user: str, other: str, data: st.DataObject) -> None:
        """Another user's (or a forgotten) message, fact or episode id: NotFoundError, nothing changes."""
        theirs = sorted({*self.stored(other), *self.facts[other], *self.episodes[other]} if other != user else set())
        target = data.draw(st.sampled_from([*theirs, *sorted(self.gone), "no-such-id"]))
        assert target not in self.stored(user) and target not in self.facts[user] and target not in self.episodes[user]
        call = data.draw(st.sampled_from([
            lambda: self.memory.forget(target, user_id=user),
            lambda: self.memory.delete_fact(target, user_id=user),
            lambda: self.memory.update_fact(target, user_id=user, text="User likes nothing"),
            lambda: self.memory.delete_episode(target, user_id=user)]))
        self.refused(call, NotFoundError)

    @rule(user=st.sampled_from(USERS), number=st.sampled_from(NUMBERS), count=st.sampled_from(COUNTS),
          which=st.integers(0, 6))
    def bad_numbers(self, user: str, number: Any, count: Any, which: int) -> None:
        m, facts = self.memory, sorted(self.facts[user])
        calls: list[Callable[[], Any]] = [
            lambda: m.add_fact("User likes green tea", user_id=user, confidence=number),
            lambda: m.working_memory("s1", user_id=user).remember("note", importance=number),
            lambda: m.search("tea", user_id=user, k=count),
            lambda: m.build_context("tea", user_id=user, session_id="s1", max_tokens=count),
            lambda: m.search_sessions("tea", user_id=user, turns=count),
            lambda: m.get_messages("s1", user_id=user, limit=count if count != 0 else -1),
            lambda: m.update_fact(facts[0] if facts else "no-such-id", user_id=user, confidence=number),
        ]
        self.refused(calls[which])

    @precondition(lambda self: any(self.working.values()))
    @rule(user=st.sampled_from(USERS), other=st.sampled_from(SESSIONS), data=st.data())
    def forget_other_sessions_item(self, user: str, other: str, data: st.DataObject) -> None:
        """A working item of another session (or user): False, and nothing changes (documented)."""
        items = sorted(i for (u, s), ids in self.working.items() if (u, s) != (user, other) for i in ids)
        if items:
            before = self.observed()
            assert self.memory.working_memory(other, user_id=user).forget(data.draw(st.sampled_from(items))) is False
            assert self.observed() == before


def test_the_facade_behaves_like_its_model(tmp_path: Path) -> None:
    MemoryMachine.root = tmp_path
    run_state_machine_as_test(MemoryMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
        derandomize="TM_STATEFUL_EXAMPLES" not in os.environ,  # CI: the same cases every run
        database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                              HealthCheck.data_too_large]))
