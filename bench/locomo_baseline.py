"""The plain vector baseline of :mod:`bench.locomo`: the recipe most users start from, one
ChromaDB collection holding one embedding per turn, queried by cosine nearest neighbours,
with the same embedder as the library. Its session search is the sessions of its
:data:`SESSION_DEPTH` nearest turns, each once, in rank order."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from bench.locomo_data import Answer, Conversation, first_of_each_session

SESSION_DEPTH = 200  # the baseline's session search ranks the sessions of this many nearest turns


class Baseline:
    """The seed recipe: one Chroma collection, one vector per turn (same embedder), cosine k-NN."""

    def __init__(self, path: str, embedder: Any) -> None:
        import chromadb
        from chromadb.config import Settings

        self.client = chromadb.PersistentClient(path=path, settings=Settings(anonymized_telemetry=False))
        self.embedder = embedder

    def ingest(self, conv: Conversation, name: str, vectors: Mapping[str, Any]) -> tuple[Any, float]:
        """Add the turns with their vectors from the one-batch embedding (the same model on
        the same texts gives the same vectors); returns the collection and the seconds spent
        in Chroma, to which the caller adds the embedding time."""
        import numpy as np

        start = time.perf_counter()
        col = self.client.create_collection(name, embedding_function=None,
                                            configuration={"hnsw": {"space": "cosine"}})
        texts = [t.text for t in conv.turns]
        # ids by position: a real-chat turn split into messages keeps its dialogue id in each
        col.add(ids=[f"{conv.id}/{n}" for n in range(len(conv.turns))], documents=texts,
                embeddings=np.asarray([vectors[t] for t in texts]),
                metadatas=[{"dia_id": t.dia_id} for t in conv.turns])
        return col, time.perf_counter() - start

    def ask(self, col: Any, conv: Conversation, *, k: int, count: Callable[[str], int]) -> list[Answer]:
        answers = []
        for q in conv.questions:
            start = time.perf_counter()
            res = col.query(query_embeddings=self.embedder.embed_array([q.question]), n_results=k,
                            include=["documents", "metadatas"])
            spent = time.perf_counter() - start
            sizes = [count(d) for d in res["documents"][0]]
            # its session search: the sessions of the nearest turns, each once, in rank order
            start = time.perf_counter()
            near = col.query(query_embeddings=self.embedder.embed_array([q.question]), n_results=SESSION_DEPTH,
                             include=["metadatas"])
            ranked = first_of_each_session([m["dia_id"] for m in near["metadatas"][0]])
            answers.append(Answer(question=q, retrieved=[m["dia_id"] for m in res["metadatas"][0]],
                                  tokens=sum(sizes), seconds=spent, hit_tokens=sizes, sessions=ranked[:k],
                                  session_seconds=time.perf_counter() - start))
        return answers
