"""Long messages are found by their parts: chunk vectors point back to the message, and
every path that writes or removes vectors (forget, clear_session, rebuild, repair,
export/import) keeps the chunks in step with the record store. Real store, real embedder."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from tiered_memory import StaticEmbedder, TieredMemory
from tiered_memory.recall.chunking import (
    CHUNK_LAYER, CHUNK_OVER, MAX_CHUNKS, best_chunks, best_span_by_terms, chunk_id, chunk_spans, message_of,
    pooled_vector, vector_ids,
)
from tiered_memory.recall.search import matching_part, merge_parts
from tiered_memory.testing import CountingEmbedder
from tiered_memory.vector.base import VectorItem

TOPICS = [
    "The sourdough starter needs feeding twice a day with equal weights of flour and water.",
    "A cast iron pan should be dried on the stove and oiled lightly before it is put away.",
    "Tomatoes keep their flavour better on the counter than in the fridge.",
    "Proofing dough in a warm oven with only the light on speeds up the rise.",
    "Stock made from roasted bones is darker and richer than stock from raw ones.",
    "Salt the pasta water until it tastes like a mild broth.",
    "A sharp knife is safer than a dull one because it does not slip.",
    "Resting meat after cooking lets the juices settle back into the fibres.",
]
ANSWER = "By the way, the spare key to the garden shed is hidden under the blue flowerpot by the gate."


def long_answer(middle: str = ANSWER, paragraphs: int = 6) -> str:
    """About 4,500 characters of cooking advice with ``middle`` in the middle."""
    para = " ".join(TOPICS)
    body = [para] * paragraphs
    body.insert(paragraphs // 2, middle)
    return "\n\n".join(body)


# ---- pure ---------------------------------------------------------------------
@pytest.mark.parametrize("text, chunked", [
    ("short", False),
    ("x" * CHUNK_OVER, False),
    ("word " * (CHUNK_OVER // 5 + 1), True),
    (long_answer(), True),
])
def test_chunk_spans_cover_long_texts_only(text, chunked):
    spans = chunk_spans(text)
    assert bool(spans) is chunked
    if spans:
        assert spans[0][0] == 0 and spans[-1][1] == len(text)
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            assert s1 < s2 <= e1 < e2  # in order, overlapping or touching, never a gap
        assert len(spans) <= MAX_CHUNKS


def test_chunk_spans_never_exceed_max_chunks_and_cut_at_words():
    text = "lorem ipsum dolor sit amet " * 4000  # 108,000 characters
    spans = chunk_spans(text)
    assert len(spans) <= MAX_CHUNKS and spans[-1][1] == len(text)
    assert all(text[s - 1] == " " for s, _ in spans[1:])


def test_the_answer_sits_whole_in_some_chunk():
    text = long_answer()
    assert any(ANSWER in text[s:e] for s, e in chunk_spans(text))


@pytest.mark.parametrize("vector_id, expected", [
    ("m1", ("m1", None)),
    (chunk_id("m1", 3), ("m1", 3)),
    ("a#3", ("a#3", None)),  # a user's id with '#' is a whole message
    ("fact:9", ("fact:9", None)),
])
def test_message_of(vector_id, expected):
    assert message_of(vector_id) == expected


def test_vector_ids_name_every_possible_chunk():
    ids = vector_ids(["m"])
    assert ids[0] == "m" and len(ids) == 1 + MAX_CHUNKS and chunk_id("m", MAX_CHUNKS - 1) in ids


@pytest.mark.parametrize("hits, expected", [
    ([], {}),
    ([(chunk_id("a", 2), 0.7), (chunk_id("a", 0), 0.5), (chunk_id("b", 1), 0.4)], {"a": (2, 0.7), "b": (1, 0.4)}),
    ([("plain", 0.9)], {}),
])
def test_best_chunks(hits, expected):
    assert best_chunks(hits) == expected


@pytest.mark.parametrize("vec, parts, expected", [
    ([("a", 0.5), ("b", 0.4)], {}, [("a", 0.5), ("b", 0.4)]),
    ([("a", 0.5), ("b", 0.4)], {"b": (1, 0.8)}, [("b", 0.8), ("a", 0.5)]),
    ([("a", 0.5)], {"a": (0, 0.3)}, [("a", 0.5)]),  # the whole vector was better
    ([], {"c": (4, 0.6)}, [("c", 0.6)]),  # found by its chunk only
])
def test_merge_parts(vec, parts, expected):
    assert merge_parts(vec, parts) == expected


S = 0.5 ** 0.5


@pytest.mark.parametrize("vectors, spans, expected", [
    ([[1, 0]], [(0, 700)], [1, 0]),
    ([[1, 0], [0, 1]], [(0, 700), (550, 1250)], [S, S]),  # equal lengths: the plain mean
    ([[1, 0], [0, 1]], [(0, 700), (550, 2650)], [0.3162278, 0.9486833]),  # 700 : 2100
    ([[1, 0], [-1, 0]], [(0, 700), (550, 1250)], [0, 0]),  # a zero sum stays zero, never NaN
])
def test_pooled_vector_is_the_unit_length_weighted_mean(vectors, spans, expected):
    got = pooled_vector(np.asarray(vectors, dtype=np.float32), spans)
    assert got.dtype == np.float32 and got.tolist() == pytest.approx(expected, abs=1e-6)


def test_matching_part_by_vector_then_by_terms():
    text = long_answer()
    spans = chunk_spans(text)
    assert matching_part("short text", None, ["key"]) is None
    by_vector = matching_part(text, (1, 0.5), [])
    assert by_vector is not None and by_vector["index"] == 1 and by_vector["count"] == len(spans)
    n = best_span_by_terms(text, ["flowerpot"])
    assert n is not None and "flowerpot" in text[slice(*spans[n])]
    by_terms = matching_part(text, None, ["flowerpot"])
    assert by_terms is not None and "flowerpot" in by_terms["text"]
    assert best_span_by_terms(text, ["nowhere"]) is None


# ---- real store, real embedder ---------------------------------------------------
CHAT = [
    {"role": "user", "content": "Can you give me some general kitchen tips?"},
    {"role": "assistant", "content": long_answer()},
    {"role": "user", "content": "I booked the train to Lisbon for the conference."},
    {"role": "user", "content": "My neighbour waters the plants on Tuesdays."},
]
QUERY = "where is the spare key to the garden shed hidden?"


def chunk_vectors(memory: TieredMemory, message_id: str) -> set[str]:
    return {i for i in memory.index.ids() if message_of(i) == (message_id, message_of(i)[1])
            and message_of(i)[1] is not None}


def test_a_long_message_is_found_by_the_part_that_answers(memory):
    ids = memory.add_many(CHAT, user_id="u", session_id="s1")
    assert chunk_vectors(memory, ids[1])  # indexed by its chunks too
    hits = memory.search(QUERY, user_id="u", k=3)
    assert hits[0].id == ids[1] and hits[0].text == CHAT[1]["content"]  # the message, whole
    part = hits[0].explanation["part"]
    assert "flowerpot" in part["text"] and hits[0].text[part["start"]:part["end"]] == part["text"]
    assert memory.search(QUERY, user_id="someone else", k=3) == []


def test_build_context_hands_over_the_matching_part_within_a_small_budget(memory):
    ids = memory.add_many(CHAT, user_id="u", session_id="s1")
    context = memory.build_context(QUERY, user_id="u", session_id="s2", max_tokens=500)
    turns = [i for s in context.sections if s.name == "turns" for i in s.items]
    long_items = [i for i in turns if i.id == ids[1]]
    assert long_items and "flowerpot" in long_items[0].text and len(long_items[0].text) < len(CHAT[1]["content"])
    assert long_items[0].label and "long message" in long_items[0].label
    assert "flowerpot" in context.memory_text()


def test_forget_and_clear_session_delete_the_chunks(memory):
    ids = memory.add_many(CHAT, user_id="u", session_id="s1")
    memory.add_many([{"role": "assistant", "content": long_answer("The boat is moored at pier nine.")}],
                    user_id="u", session_id="s2")
    memory.forget(ids[1], user_id="u")
    assert not chunk_vectors(memory, ids[1]) and ids[1] not in memory.index.ids()
    assert all(h.id != ids[1] for h in memory.search(QUERY, user_id="u", k=5))
    memory.clear_session("s2", user_id="u")
    assert not any(message_of(i)[1] is not None for i in memory.index.ids())


def test_forget_user_deletes_the_chunks(memory):
    memory.add_many(CHAT, user_id="u", session_id="s1")
    memory.add_many(CHAT, user_id="v", session_id="s1")
    memory.forget_user("u")
    assert all(h.metadata is not None for h in memory.search(QUERY, user_id="v", k=1))
    assert memory.search(QUERY, user_id="u", k=3) == []
    assert memory.index.count(user_id="u") == 0 and memory.index.count(user_id="v") > len(CHAT)


def test_rebuild_index_re_chunks(memory):
    ids = memory.add_many(CHAT, user_id="u", session_id="s1")
    before = chunk_vectors(memory, ids[1])
    memory.rebuild_index()
    assert chunk_vectors(memory, ids[1]) == before
    assert memory.search(QUERY, user_id="u", k=1)[0].id == ids[1]


def stored_vectors(memory: TieredMemory, ids: list[str]) -> dict[str, np.ndarray]:
    memory.flush()  # the vectors written behind
    got = memory.index.collection.get(ids=ids, include=["embeddings"])  # straight from Chroma
    return {i: np.asarray(v, dtype=np.float32) for i, v in zip(got["ids"], got["embeddings"])}


def test_a_long_message_goes_through_the_embedder_once(make_memory):
    text = long_answer(paragraphs=14)
    spans = chunk_spans(text)
    counting = CountingEmbedder(StaticEmbedder())
    memory = make_memory(embedder=counting)
    memory.add("user", "a short one first", session_id="s", user_id="u")
    counting.characters.clear()
    memory.add("assistant", text, session_id="s", user_id="u")
    # its chunks, overlaps included, and not the whole text a second time
    assert sum(counting.characters) == sum(e - s for s, e in spans) < 1.3 * len(text)


def test_a_long_messages_vector_is_pooled_from_its_chunks_the_same_on_every_path(memory):
    ids = memory.add_many(CHAT, user_id="u", session_id="s1")
    spans = chunk_spans(CHAT[1]["content"])
    chunks = [chunk_id(ids[1], n) for n in range(len(spans))]
    written = stored_vectors(memory, [ids[1], *chunks])
    pooled = pooled_vector(np.stack([written[c] for c in chunks]), spans)
    assert written[ids[1]].tolist() == pytest.approx(pooled.tolist(), abs=1e-6)
    memory.rebuild_index()  # and repair, import_jsonl: all index through the same function
    rebuilt = stored_vectors(memory, [ids[1], *chunks])
    assert rebuilt.keys() == written.keys()
    for vid, vector in written.items():
        assert rebuilt[vid].tolist() == pytest.approx(vector.tolist(), abs=1e-6)
    assert memory.search(QUERY, user_id="u", k=1)[0].id == ids[1]


def test_repair_restores_a_lost_message_with_its_chunks_and_drops_stray_chunks(make_memory, tmp_path):
    m = make_memory("mem")
    ids = m.add_many(CHAT, user_id="u", session_id="s1")
    chunks = chunk_vectors(m, ids[1])
    m.index.collection.delete(ids=[ids[1], *sorted(chunks)])  # straight into Chroma
    dim = len(m.embedder.embed_query("x"))
    m.index.upsert([VectorItem(id=chunk_id("gone", 0), vector=[1.0] + [0.0] * (dim - 1), user_id="u",
                               layer=CHUNK_LAYER)])
    m.close()
    con = sqlite3.connect(tmp_path / "mem" / "records.sqlite3")  # what a crash leaves: still 'open'
    con.execute("UPDATE meta SET value='open' WHERE key='state'")
    con.commit()
    con.close()
    again = make_memory("mem")
    assert chunk_vectors(again, ids[1]) == chunks
    assert chunk_id("gone", 0) not in again.index.ids()
    assert again.search(QUERY, user_id="u", k=1)[0].id == ids[1]


def test_export_import_chunks_the_imported_messages(make_memory, tmp_path):
    m = make_memory("a")
    m.add_many(CHAT, user_id="u", session_id="s1")
    m.export_jsonl(tmp_path / "out.jsonl")
    other = make_memory("b")
    other.import_jsonl(tmp_path / "out.jsonl")
    hits = other.search(QUERY, user_id="u", k=1)
    assert hits and "flowerpot" in hits[0].explanation["part"]["text"]
    assert chunk_vectors(other, hits[0].id)


class QueriedLayers:
    """The real index, noting the layers each query asked for (one scan of a held user's
    vectors for several layers is one entry)."""

    def __init__(self, inner):
        self.inner = inner
        self.layers = []

    def query(self, *args, **kwargs):
        self.layers.append(tuple(kwargs.get("layers") or ()))
        return self.inner.query(*args, **kwargs)

    def query_held(self, *args, **kwargs):
        self.layers.append(tuple(kwargs["ks"]))
        return self.inner.query_held(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_search_queries_the_chunk_layer_only_for_a_user_with_a_long_message(memory):
    memory.add_many([{"role": "user", "content": t} for t in TOPICS], user_id="short", session_id="s1")
    memory.add_many(CHAT, user_id="long", session_id="s1")
    spy = QueriedLayers(memory.index)
    memory.index = spy
    assert memory.search("how do I keep a knife safe", user_id="short", k=3)
    assert spy.layers == [("turn",)]
    spy.layers.clear()
    assert memory.search(QUERY, user_id="long", k=1)[0].explanation["part"]
    # a query per layer, or one scan for both once the user's vectors are held in memory
    assert spy.layers in ([("turn",), (CHUNK_LAYER,)], [("turn", CHUNK_LAYER)])


class PerLayer:
    """The real index without its one-scan read: a query per layer, as any index answers."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        if name == "query_held":
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_a_held_user_with_a_long_message_is_searched_with_one_scan(memory):
    ids = memory.add_many(CHAT, user_id="u", session_id="s1")
    memory.add_many([{"role": "user", "content": t} for t in TOPICS], user_id="u", session_id="s2")
    if not memory.index.scans_exactly("u", wait=True):
        pytest.fail("the embedded index holds a small user's vectors")
    index = memory.index
    memory.index = PerLayer(index)
    per_layer = [(h.id, h.score) for h in memory.search(QUERY, user_id="u", k=5)]
    memory.index = spy = QueriedLayers(index)
    hits = memory.search(QUERY, user_id="u", k=5)
    assert spy.layers == [("turn", CHUNK_LAYER)]  # both layers from one product
    assert hits[0].id == ids[1] and "flowerpot" in hits[0].explanation["part"]["text"]
    assert [h.id for h in hits] == [i for i, _ in per_layer]
    assert [h.score for h in hits] == pytest.approx([s for _, s in per_layer], abs=1e-5)
