"""The lock on an embedded store folder: one process at a time, and in this process one
open object at a time, with a message that says which object holds it."""

from __future__ import annotations

import gc
import os
import sys
import traceback
import weakref
from pathlib import Path

from .errors import StoreLockedError


class FolderLock:
    """An exclusive lock on an embedded store folder; the OS drops it if the process dies.

    A second open of the folder from another process gets :class:`StoreLockedError` at
    once. A second open from this same process (a re-run notebook cell) is refused too,
    with a message naming the object that still holds the folder and ``close()``: closing
    that object behind its back would break whoever still uses it. An earlier object that
    is no longer referenced is collected first, so ``del memory`` is enough.
    """

    _held: "dict[str, tuple[weakref.ref[FolderLock], str]]" = {}  # folder -> (lock, who opened it)

    def __init__(self, folder: Path, owner: object = None) -> None:
        self.key = str(folder.resolve())
        try:
            self.file = open(folder / ".lock", "a+")
        except OSError as e:
            raise StoreLockedError(
                f"cannot open the lock file {folder / '.lock'} ({e.strerror or e}). If it is a folder or "
                "unreadable, remove it (nothing else is kept there) and open again.") from e
        try:
            self._acquire()
        except OSError as e:
            holder = self._holder()
            if holder is not None:
                gc.collect()  # an unreferenced earlier memory releases its lock when collected
                holder = self._holder()
            if holder is None:
                try:
                    self._acquire()
                except OSError:
                    pass
                else:
                    self._register(owner)
                    return
            self.file.close()
            if holder is not None:
                raise StoreLockedError(
                    f"{folder} is already open in this process, by {holder}, which was not closed. "
                    "Call close() on that object first (for example memory.close()), or reuse it; "
                    "`with TieredMemory(path) as memory:` closes it for you.") from e
            raise StoreLockedError(
                f"{folder} is open in another process. The embedded store serves one process; "
                "for many workers use a PostgreSQL record store and a vector server "
                "(see 'Running at scale' in the README)."
            ) from e
        self._register(owner)

    def _acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # not POSIX: no cross-process protection
            return
        fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _holder(self) -> str | None:
        """Who holds this folder in this process, if a live lock of ours does."""
        return FolderLock.holder_here(Path(self.key))

    @staticmethod
    def holder_here(folder: Path) -> str | None:
        """Who holds ``folder`` in this process (the object and where it was opened), if a
        live lock of this process does; ``None`` when none does (another process may)."""
        held = FolderLock._held.get(str(folder.resolve()))
        if held is None:
            return None
        lock = held[0]()
        return held[1] if lock is not None and not lock.file.closed else None

    def _register(self, owner: object) -> None:
        FolderLock._held[self.key] = (weakref.ref(self), f"{_describe(owner)} opened at {_caller()}")

    def release(self) -> None:
        held = FolderLock._held.get(self.key)
        if held is not None and held[0]() is self:
            del FolderLock._held[self.key]
        self.file.close()


def _describe(owner: object) -> str:
    if owner is None:
        return "an object"
    return f"the {type(owner).__name__} object at {id(owner):#x}"


def _caller() -> str:
    """The first frame outside this package: the line of user code that opened the folder
    (``notebook cell In[3], line 1`` inside IPython or Jupyter)."""
    package = str(Path(__file__).resolve().parent) + os.sep
    for frame in reversed(traceback.extract_stack()):
        if not str(Path(frame.filename).resolve()).startswith(package):
            cell = _notebook_cell(frame.filename)
            return f"notebook cell {cell}, line {frame.lineno}" if cell else f"{frame.filename}:{frame.lineno}"
    return "an unknown place"


def _notebook_cell(filename: str) -> str | None:
    """``In[3]`` when ``filename`` is a cell of the running IPython shell (never imports IPython)."""
    shell_module = sys.modules.get("IPython")
    try:
        shell = shell_module.get_ipython() if shell_module else None
        label = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # another IPython version: the file name is still said
        return None
    return str(label[1]) if label else None
