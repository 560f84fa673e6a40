"""Where a :class:`~.block.TieredMemoryBlock`'s memory lives, as a value that pickles, and
the memory that value names.

LlamaIndex pickles a ``Memory`` (``PickleSerializer`` on an agent's ``Context``, or
``pickle.dumps(memory)``) by pickling its blocks; a block whose state does not pickle is
removed, from the copy and from the live ``Memory`` too. A block pickles a
:class:`MemoryAddress` in place of its memory, never the memory (its connections, its
locks, its users' text). Unpickled in the process that holds that memory open, the block
uses that memory; elsewhere it opens the folder again from its
:attr:`~tiered_memory.TieredMemory.folder_settings`. A memory whose folder does not hold it
all (a PostgreSQL store, a vector server) is found only in the process that opened it.

Invariants: an embedded folder is open once per process (the core's folder lock), so a
folder's path names one open memory here (a closed one is passed over); any other memory is named by a token of this process.
The registry holds memories weakly: it never keeps one open.
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Optional

from tiered_memory import FolderSettings, TieredMemory
from tiered_memory.errors import ConfigurationError

_open: "weakref.WeakValueDictionary[str, TieredMemory]" = weakref.WeakValueDictionary()
_tokens: "weakref.WeakKeyDictionary[TieredMemory, str]" = weakref.WeakKeyDictionary()
_lock = threading.RLock()  # held while a folder opens: two blocks unpickled at once open it once


@dataclass(frozen=True, kw_only=True)
class MemoryAddress:
    """A memory's name in the registry, and what opens it again (``None``: nothing can)."""

    key: str
    settings: Optional[FolderSettings]


def address_of(memory: TieredMemory) -> MemoryAddress:
    """Register ``memory`` in this process and return its address."""
    settings = memory.folder_settings
    with _lock:
        if settings is not None:
            key = f"folder:{settings.path}"  # resolved when the memory opened
        else:
            key = _tokens.setdefault(memory, f"process:{os.getpid()}:{uuid.uuid4().hex}")
        _open[key] = memory
    return MemoryAddress(key=key, settings=settings)


def memory_at(address: MemoryAddress) -> TieredMemory:
    """The memory ``address`` names: the one this process holds open, else its folder opened again
    (a memory closed since the block was pickled is not used: every call of it is refused).

    Raises:
        ConfigurationError: the memory is not open here and is not a folder that can be opened.
        StoreError: opening the folder failed (another process holds it, say).
    """
    with _lock:
        found = _open.get(address.key)
        if found is not None and not found.closed:  # an app may still hold one it closed
            return found
        settings = address.settings
        if settings is None:
            raise ConfigurationError(
                "this TieredMemoryBlock was pickled with a TieredMemory that is not open in this process and "
                "whose folder does not hold it all (a PostgreSQL store, a vector server or engines passed as "
                "objects), so the block cannot open it: build the block again, "
                "TieredMemoryBlock(memory=TieredMemory(...), user_id=...)")
        memory = TieredMemory(settings.path, config=settings.config, record_store="sqlite",  # not this process's setting
                              vector_store=settings.vector_store)
        address_of(memory)
        return memory
