"""The memory layers below the facade: the buffer, episodic, semantic and working memory,
the LangGraph items, consolidation and the extractive (rule-based) fallbacks.

Layers look only down: they receive a :class:`~tiered_memory.parts.Parts` bundle (the
record store, the vector index, the embedder, the config, the write lock, the token
counter and the clock), never the facade, and reach the database only through the
repository protocols of :mod:`tiered_memory.store`.
"""
