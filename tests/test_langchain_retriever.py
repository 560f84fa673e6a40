"""TieredMemoryRetriever: LangChain's standard retriever suite plus our own checks."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_tiered_memory import TieredMemoryRetriever
from lc_support import PromptRecorder
from tiered_memory import InvalidInputError, SentenceTransformerEmbedder, TieredMemory

FACTS = [
    "I adopted a greyhound called Pixel.",
    "Pixel loves long walks on the beach.",
    "My dog Pixel is afraid of thunder.",
    "I work as a marine biologist.",
    "I am learning to play the cello.",
]


@pytest.fixture(scope="module")
def shared_memory(tmp_path_factory: pytest.TempPathFactory,
                  embedder: SentenceTransformerEmbedder) -> Iterator[TieredMemory]:
    memory = TieredMemory(tmp_path_factory.mktemp("retriever"), embedder=embedder)
    memory.add_many([{"role": "user", "content": t} for t in FACTS], session_id="s1", user_id="u1")
    memory.add_many([{"role": "user", "content": "My dog Rex is a poodle."}], session_id="s1", user_id="u2")
    yield memory
    memory.close()


class TestTieredMemoryRetrieverStandard(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _memory(self, shared_memory: TieredMemory) -> None:
        self.memory = shared_memory

    @property
    def retriever_constructor(self) -> type[TieredMemoryRetriever]:
        return TieredMemoryRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": self.memory, "user_id": "u1"}

    @property
    def retriever_query_example(self) -> str:
        return "tell me about my dog"


def test_documents_carry_score_and_metadata(shared_memory: TieredMemory) -> None:
    docs = TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=3).invoke("what is my dog afraid of?")
    assert docs[0].page_content == "My dog Pixel is afraid of thunder."
    scores = [d.metadata["score"] for d in docs]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
    first = docs[0]
    assert first.id == first.metadata["id"] and first.metadata["role"] == "user"
    assert first.metadata["session_id"] == "s1" and first.metadata["layer"] == "turn"
    assert isinstance(first.metadata["timestamp"], float)


def test_user_scope_and_per_call_overrides(shared_memory: TieredMemory) -> None:
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=5)
    assert all("Rex" not in d.page_content for d in retriever.invoke("poodle dog"))
    assert retriever.invoke("poodle dog", user_id="u2")[0].page_content == "My dog Rex is a poodle."
    assert retriever.invoke("dog", session_id="elsewhere") == []
    with pytest.raises(TypeError, match="unexpected"):
        retriever.invoke("dog", limit=2)


async def test_retriever_in_an_lcel_chain(shared_memory: TieredMemory) -> None:
    rec = PromptRecorder()
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=2)

    def fmt(docs: list[Document]) -> str:
        return "\n".join(d.page_content for d in docs)

    prompt = ChatPromptTemplate.from_messages([("system", "Memory:\n{memory}"), ("human", "{question}")])
    model = FakeMessagesListChatModel(responses=[AIMessage("It plays the cello.")], callbacks=[rec])
    chain = {"memory": retriever | fmt, "question": RunnablePassthrough()} | prompt | model | StrOutputParser()
    assert await chain.ainvoke("which instrument am I learning?") == "It plays the cello."
    assert "learning to play the cello" in rec.last[0].text


def test_search_kwargs_and_top_k_as_on_vector_store_retrievers(shared_memory: TieredMemory) -> None:
    assert len(TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_kwargs={"k": 2})
               .invoke("dog")) == 2
    assert len(TieredMemoryRetriever(memory=shared_memory, user_id="u1", top_k=1).invoke("dog")) == 1
    # an explicit k wins over search_kwargs; a per-call top_k or k wins over both
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=3, search_kwargs={"k": 1})
    assert retriever.k == 3 and len(retriever.invoke("dog")) == 3
    assert len(retriever.invoke("dog", top_k=2)) == 2 and len(retriever.invoke("dog", k=1)) == 1
    only = TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=5,
                                 search_kwargs={"filter": {"role": "assistant"}})
    assert only.invoke("dog") == []  # the filter was applied: u1 has no assistant turns


def test_search_kwargs_are_read_at_each_call_and_can_be_configured(shared_memory: TieredMemory) -> None:
    from langchain_core.runnables import ConfigurableField

    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_kwargs={"k": 2})
    assert len(retriever.invoke("dog")) == 2
    retriever.search_kwargs["k"] = 3  # as on VectorStoreRetriever: the next call sees it
    assert len(retriever.invoke("dog")) == 3
    plain = TieredMemoryRetriever(memory=shared_memory, user_id="u1")
    assert len(plain.invoke("dog")) == 4  # the default k
    configurable = plain.configurable_fields(
        search_kwargs=ConfigurableField(id="search_kwargs", name="Search kwargs"))
    assert len(configurable.invoke("dog", config={"configurable": {"search_kwargs": {"k": 1}}})) == 1
    assert len(configurable.invoke("dog")) == 4


@pytest.mark.parametrize("typo", [{"fliters": {"role": "user"}}, {"session": "s1"}])
def test_an_argument_the_retriever_does_not_know_is_refused(shared_memory: TieredMemory,
                                                            typo: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(typo))):  # pydantic's ValidationError names it
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", **typo)


def test_an_empty_user_id_at_invoke_is_bad_input_not_the_default_user(shared_memory: TieredMemory) -> None:
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1")
    with pytest.raises(InvalidInputError, match="user_id"):
        retriever.invoke("dog", user_id="")


@pytest.mark.parametrize("bad", [0, -1, "2", 2.0, True])
def test_a_bad_k_raises_the_same_typed_error_everywhere(shared_memory: TieredMemory, bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="k must be an int >= 1"):
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=bad)
    with pytest.raises(InvalidInputError, match="k must be an int >= 1"):
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_kwargs={"k": bad})
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1")
    with pytest.raises(InvalidInputError, match="k must be an int >= 1"):
        retriever.invoke("dog", k=bad)
    with pytest.raises(InvalidInputError, match="k must be an int >= 1"):
        retriever.invoke("dog", top_k=bad)


def test_search_kwargs_refuse_unknown_names_and_the_user(shared_memory: TieredMemory) -> None:
    with pytest.raises(TypeError, match="unexpected"):
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_kwargs={"fetch_k": 20})
    with pytest.raises(InvalidInputError, match="user_id"):
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_kwargs={"user_id": "u2"})
    with pytest.raises(InvalidInputError, match="given twice"):
        TieredMemoryRetriever(memory=shared_memory, user_id="u1").invoke("dog", k=1, top_k=2)


@pytest.mark.parametrize(("field", "bad"), [("user_id", ""), ("user_id", 7), ("session_id", ""), ("session_id", 3)])
def test_bad_ids_are_refused_at_construction_not_at_the_first_call(shared_memory: TieredMemory,
                                                                   field: str, bad: Any) -> None:
    kwargs: dict[str, Any] = {"memory": shared_memory, "user_id": "u1", field: bad}
    with pytest.raises(ValueError, match=field):  # the id check's InvalidInputError, inside pydantic's error
        TieredMemoryRetriever(**kwargs)


async def test_a_blank_query_finds_nothing_instead_of_failing_the_chain(shared_memory: TieredMemory) -> None:
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1")
    assert retriever.invoke("") == [] and retriever.invoke("   ") == []
    assert await retriever.ainvoke("") == []
    assert retriever.batch(["", "dog"], k=1)[0] == [] and len(retriever.batch(["", "dog"], k=1)[1]) == 1
    with pytest.raises(InvalidInputError, match="k must be"):  # the call's settings are still checked
        retriever.invoke("", k=0)
    with pytest.raises(InvalidInputError, match="query"):
        retriever.invoke(42)  # type: ignore[arg-type]


def test_a_filter_on_a_documents_own_metadata_is_honoured_or_refused_never_empty(memory: TieredMemory) -> None:
    """A LangChain filter names a Document's metadata keys (``filter={"session_id": ...}`` on any
    vector store). Here it was read as a key of the message's own metadata, so a filter on the
    ``session_id`` every Document shows, or its ``layer`` or ``id``, found nothing, silently."""
    memory.add_many([{"role": "user", "content": "My sister Lena lives in Oslo.", "metadata": {"topic": "family"}}],
                    session_id="s1", user_id="u")
    memory.add_many([{"role": "user", "content": "Lena visited Oslo again."}], session_id="s2", user_id="u")
    retriever = TieredMemoryRetriever(memory=memory, user_id="u")
    docs = retriever.invoke("Lena", filter={"session_id": "s1"})
    assert [d.page_content for d in docs] == ["My sister Lena lives in Oslo."]
    scoped = TieredMemoryRetriever(memory=memory, user_id="u", session_id="s1").invoke("Lena")
    assert [d.id for d in docs] == [d.id for d in scoped]  # the scores hold recency, so differ a little
    given = {"session_id": "s2", "role": "user"}
    in_kwargs = TieredMemoryRetriever(memory=memory, user_id="u", search_kwargs={"filter": given})
    assert [d.metadata["session_id"] for d in in_kwargs.invoke("Lena")] == ["s2"]
    assert given == {"session_id": "s2", "role": "user"}  # the caller's filter is not changed
    assert [d.page_content for d in retriever.invoke("Lena", filter={"topic": "family"})] == [
        "My sister Lena lives in Oslo."]  # a message metadata key, as before
    with pytest.raises(InvalidInputError, match="session_id"):  # two different sessions asked for
        retriever.invoke("Lena", session_id="s1", filter={"session_id": "s2"})
    with pytest.raises(InvalidInputError, match="filter session_id must be a str"):  # not every session
        retriever.invoke("Lena", filter={"session_id": None})
    for own in ({"layer": "turn"}, {"id": docs[0].id}, {"timestamp": docs[0].metadata["timestamp"]},
                {"score": 1.0}):
        with pytest.raises(InvalidInputError, match=next(iter(own))):
            retriever.invoke("Lena", filter=own)


# ---- search_type, as on VectorStoreRetriever -------------------------------------------------
def _cosine(memory: TieredMemory, query: str, text: str) -> float:
    q, d = memory.embedder.embed_query(query), memory.embedder.embed_documents([text])[0]
    return sum(a * b for a, b in zip(q, d)) / (sum(a * a for a in q) * sum(b * b for b in d)) ** 0.5


def test_search_type_similarity_is_accepted_as_from_as_retriever(shared_memory: TieredMemory) -> None:
    """``vectorstore.as_retriever(search_type="similarity", search_kwargs={"k": 4})`` is how most
    LangChain code builds a retriever; moving it here failed with pydantic's 'extra inputs'."""
    plain = TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_kwargs={"k": 2}).invoke("dog")
    moved = TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_type="similarity",
                                  search_kwargs={"k": 2})
    assert moved.search_type == "similarity"
    assert [d.id for d in moved.invoke("dog")] == [d.id for d in plain] and len(plain) == 2


def test_similarity_score_threshold_keeps_the_hits_whose_cosine_reaches_it(shared_memory: TieredMemory) -> None:
    """As ``similarity_search_with_relevance_scores``: of the k best, those whose relevance (here
    the cosine of the turn to the query, not the fused score, which is no 0-1 value) is at least
    ``score_threshold``; the order stays the search's."""
    query = "what is my dog afraid of?"
    plain = TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=5).invoke(query)
    kept = [d.id for d in plain if _cosine(shared_memory, query, d.page_content) >= 0.5]
    assert 0 < len(kept) < len(plain)  # the threshold keeps some and drops some
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_type="similarity_score_threshold",
                                      search_kwargs={"k": 5, "score_threshold": 0.5})
    assert [d.id for d in retriever.invoke(query)] == kept
    assert [d.id for d in retriever.invoke(query, score_threshold=0.0)] == [
        d.id for d in plain if _cosine(shared_memory, query, d.page_content) >= 0.0]  # per call, as upstream
    assert retriever.invoke(query, score_threshold=1.0) == []


def test_a_document_shows_the_cosine_the_threshold_compares(shared_memory: TieredMemory) -> None:
    """``metadata["score"]`` is the fused score (no 0-1 value); ``metadata["similarity"]`` is the
    cosine ``similarity_score_threshold`` compares, so a user can see why a document was kept or
    not; a filter naming it is refused as the Document's own."""
    query = "what is my dog afraid of?"
    docs = TieredMemoryRetriever(memory=shared_memory, user_id="u1", k=5).invoke(query)
    assert docs and all(d.metadata["similarity"] == pytest.approx(_cosine(shared_memory, query, d.page_content),
                                                                   abs=1e-3) for d in docs)
    kept = TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_type="similarity_score_threshold",
                                 search_kwargs={"k": 5, "score_threshold": 0.5}).invoke(query)
    assert kept and all(d.metadata["similarity"] >= 0.5 for d in kept)
    with pytest.raises(InvalidInputError, match="similarity"):
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_kwargs={"filter": {"similarity": 1}}).invoke(
            query)


async def test_similarity_score_threshold_applies_on_the_async_path(shared_memory: TieredMemory) -> None:
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_type="similarity_score_threshold",
                                      search_kwargs={"k": 5, "score_threshold": 0.5})
    assert [d.id for d in await retriever.ainvoke("what is my dog afraid of?")] == [
        d.id for d in retriever.invoke("what is my dog afraid of?")]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"search_type": "similarity_score_threshold"}, "score_threshold"),  # upstream refuses it too
    ({"search_type": "similarity_score_threshold", "search_kwargs": {"score_threshold": 1.5}}, "score_threshold"),
    ({"search_type": "similarity_score_threshold", "search_kwargs": {"score_threshold": "0.5"}}, "score_threshold"),
    ({"search_type": "similarity_score_threshold", "search_kwargs": {"score_threshold": float("nan")}},
     "score_threshold"),
    ({"search_type": "similarity", "search_kwargs": {"score_threshold": True}}, "score_threshold"),
    ({"search_type": "cosine"}, "search_type"),
    ({"search_type": "mmr"}, "mmr"),
])
def test_a_search_type_or_threshold_that_cannot_be_honoured_is_refused_at_construction(
        shared_memory: TieredMemory, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", **kwargs)


def test_mmr_is_refused_with_why(shared_memory: TieredMemory) -> None:
    with pytest.raises(InvalidInputError, match="mmr.*not supported") as info:
        TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_type="mmr",
                              search_kwargs={"k": 2, "fetch_k": 10, "lambda_mult": 0.5})
    assert isinstance(info.value, ValueError)  # what VectorStoreRetriever raises for a search_type


def test_a_search_type_changed_after_construction_is_checked_at_the_call(shared_memory: TieredMemory) -> None:
    retriever = TieredMemoryRetriever(memory=shared_memory, user_id="u1", search_type="similarity_score_threshold",
                                      search_kwargs={"score_threshold": 0.5})
    retriever.search_kwargs.pop("score_threshold")
    with pytest.raises(InvalidInputError, match="score_threshold"):
        retriever.invoke("dog")
    retriever.search_type = "mmr"
    with pytest.raises(InvalidInputError, match="mmr"):
        retriever.invoke("dog")
