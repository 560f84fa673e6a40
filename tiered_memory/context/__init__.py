"""Context for a model: gathering candidates from every layer within per-section budgets
(:mod:`.assembly`), and the :class:`~.render.MemoryContext` with its safe rendering and
truncation (:mod:`.render`)."""
