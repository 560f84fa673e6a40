"""Recall: query analysis (:mod:`.query`), the pure scoring and fusion of candidates
(:mod:`.scoring`), the I/O shell that searches turns (:mod:`.search`) and the write side
that keeps the vector index in line with the record store (:mod:`.indexing`)."""
