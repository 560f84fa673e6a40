"""Table tests of the LoCoMo benchmark's parsing and scoring (``bench/locomo.py``): the
evidence ids it repairs or refuses, session dates, the recall measures and the summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the bench/ scripts live at the root
from bench.locomo import (  # noqa: E402
    Answer,
    Question,
    load_conversations,
    parse_evidence,
    parse_session_date,
    percentile,
    recall_at,
    hit_at,
    session_recall_at,
    summarize,
    turn_text,
)

from time_support import utc  # noqa: E402

KNOWN = frozenset({"D1:3", "D8:6", "D9:17", "D11:26", "D2:1"})


@pytest.mark.parametrize("raw, ids, repaired, unparseable, missing", [
    (["D1:3"], ("D1:3",), (), (), ()),
    (["D8:6; D9:17"], ("D8:6", "D9:17"), ("D8:6; D9:17",), (), ()),
    (["D:11:26"], ("D11:26",), ("D:11:26",), (), ()),
    (["D"], (), (), ("D",), ()),
    (["D10:19", "D1:3"], ("D1:3",), (), (), ("D10:19",)),
    (["D1:3", "D1:3", "D2:01"], ("D1:3", "D2:1"), ("D2:01",), (), ()),
    ("D2:1", ("D2:1",), (), (), ()),
    ([""], (), (), ("",), ()),
])
def test_parse_evidence(raw, ids, repaired, unparseable, missing):
    rep = parse_evidence(raw, KNOWN)
    assert (rep.ids, rep.repaired, rep.unparseable, rep.missing) == (ids, repaired, unparseable, missing)


def test_parse_session_date_and_turn_text():
    assert parse_session_date("1:56 pm on 8 May, 2023") == utc(2023, 5, 8) + 13 * 3600 + 56 * 60
    assert parse_session_date(" 10:37 am on 27 June,  2023") == utc(2023, 6, 27) + 10 * 3600 + 37 * 60
    with pytest.raises(ValueError):
        parse_session_date("yesterday")
    assert turn_text("Mel", " hi ", "a dog") == "Mel: hi [shares a photo: a dog]"
    assert turn_text("Mel", "hi") == "Mel: hi"


@pytest.mark.parametrize("retrieved, evidence, k, r, h, s", [
    (["D1:1", "D1:2", "D2:1"], ["D1:2"], 2, 1.0, 1.0, 1.0),
    (["D1:1", "D1:2", "D2:1"], ["D1:2", "D2:1"], 2, 0.5, 1.0, 0.5),
    (["D1:1", "D1:2", "D2:1"], ["D1:2", "D2:1"], 3, 1.0, 1.0, 1.0),
    (["D1:1"], ["D3:4"], 10, 0.0, 0.0, 0.0),
    (["D3:1"], ["D3:4"], 10, 0.0, 0.0, 1.0),
    ([], ["D3:4"], 10, 0.0, 0.0, 0.0),
])
def test_recall_hit_session(retrieved, evidence, k, r, h, s):
    assert recall_at(retrieved, evidence, k) == r
    assert hit_at(retrieved, evidence, k) == h
    assert session_recall_at(retrieved, evidence, k) == s


@pytest.mark.parametrize("values, p, expected", [
    ([], 50, 0.0), ([5.0], 95, 5.0), ([1, 2, 3, 4], 50, 2), (list(range(1, 101)), 95, 95),
])
def test_percentile(values, p, expected):
    assert percentile(values, p) == expected


def test_load_conversations_counts_malformed_evidence(tmp_path):
    sample = {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I moved to Oslo."},
                          {"speaker": "Bo", "dia_id": "D1:2", "text": "Nice!", "blip_caption": "a fjord"}],
            "session_2_date_time": "2:00 pm on 9 May, 2023",  # a date without a session
        },
        "qa": [
            {"question": "Where did Ann move?", "answer": "Oslo", "evidence": ["D1:1; D1:2"], "category": 4},
            {"question": "?", "answer": "-", "evidence": ["D"], "category": 1},
            {"question": "adv", "adversarial_answer": "-", "evidence": ["D1:1"], "category": 5},
            {"question": "none", "answer": "-", "evidence": [], "category": 2},
        ],
    }
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]))
    [conv] = load_conversations(path)
    assert [t.text for t in conv.turns] == ["Ann: I moved to Oslo.", "Bo: Nice! [shares a photo: a fjord]"]
    assert [q.evidence for q in conv.questions] == [("D1:1", "D1:2")]
    assert conv.evidence_issues == {"repaired": 1, "unparseable": 1, "question_without_valid_evidence": 1}


def test_summarize_reports_per_category_counts():
    q1 = Question(conversation="c", question="a", category=1, evidence=("D1:1", "D2:1"))
    q4 = Question(conversation="c", question="b", category=4, evidence=("D1:2",))
    answers = [Answer(question=q1, retrieved=["D1:1"], tokens=10, seconds=0.01),
               Answer(question=q4, retrieved=["D1:1", "D1:2"], tokens=20, seconds=0.03)]
    s = summarize(answers, ks=(1, 2))
    assert s["overall"]["count"] == 2 and s["overall"]["recall@2"] == pytest.approx(0.75)
    assert s["cat1_multi-hop"]["recall@1"] == 0.5 and s["cat4_single-hop"]["hit@1"] == 0.0
    assert s["cat2_temporal"] == {"count": 0}
    assert s["overall"]["tokens@10"] == 15


def test_summarize_reports_the_session_search_when_answers_carry_one():
    q1 = Question(conversation="c", question="a", category=1, evidence=("D1:1", "D2:1", "D3:4"))
    q4 = Question(conversation="c", question="b", category=4, evidence=("D5:2",))
    answers = [Answer(question=q1, retrieved=["D1:1", "D1:2"], tokens=10, seconds=0.01,
                      sessions=["D1:2", "D3:1", "D2:9"], session_seconds=0.02),
               Answer(question=q4, retrieved=["D5:2"], tokens=20, seconds=0.03, sessions=[], session_seconds=0.04)]
    s = summarize(answers, ks=(1, 2))
    # q1: sessions D1, D3 among the first two (2 of 3); q4: no session returned
    assert s["overall"]["session_search_recall@2"] == pytest.approx((2 / 3 + 0.0) / 2)
    assert s["cat1_multi-hop"]["session_search_recall@1"] == pytest.approx(1 / 3)
    assert s["overall"]["session_recall@2"] == pytest.approx((1 / 3 + 1.0) / 2)  # the turn list's, unchanged
    assert s["overall"]["session_search_ms_p95"] == pytest.approx(40.0)
    without = summarize([Answer(question=q4, retrieved=["D5:2"], tokens=20, seconds=0.03)], ks=(1,))
    assert "session_search_recall@1" not in without["overall"]


def test_first_of_each_session_keeps_rank_order():
    from bench.locomo_data import first_of_each_session

    assert first_of_each_session(["D3:4", "D1:2", "D3:1", "D2:7", "D1:9"]) == ["D3:4", "D1:2", "D2:7"]
    assert first_of_each_session([]) == []


def test_scale_recall_distractors_are_distinct_pairs_in_dated_sessions():
    from bench.locomo_data import Turn
    from bench.scale_recall import SESSION_TURNS, distractors

    others = [Turn(dia_id=f"D1:{i}", session=1, speaker=f"P{i % 2}", text=f"turn {i}", timestamp=0.0)
              for i in range(12)]
    sessions = distractors(others, 45, start=1000.0, end=5000.0, seed=3)
    texts = [m["content"] for s in sessions for m in s]
    assert len(texts) == 45 == len(set(texts))  # distinct: none is a near-duplicate the library folds
    assert all(len(t.split(" turn ")) == 2 for t in texts)  # each a pair of the others' turns
    assert [len(s) for s in sessions] == [SESSION_TURNS, SESSION_TURNS, 5]
    firsts = [s[0]["timestamp"] for s in sessions]
    assert firsts == [1000.0, 3000.0, 5000.0]  # spread over the conversation's own dates
    assert all(m["metadata"]["speaker"] in {"P0", "P1"} for s in sessions for m in s)
    assert distractors(others, 45, start=1000.0, end=5000.0, seed=3) == sessions  # deterministic
