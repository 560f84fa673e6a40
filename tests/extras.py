"""Optional extras in tests that also run in ``make test-notorch``'s virtualenv.

That virtualenv lacks the framework and ``[minilm]`` extras on purpose and sets
``TM_NOTORCH=1``; there a test needing one is skipped. Anywhere else (``make test``
installs ``.[all,test]``) a missing extra is a broken install: the test fails, so it
cannot pass as a skip."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

NOTORCH = os.environ.get("TM_NOTORCH", "").strip().lower() in {"1", "true", "yes"}


def import_extra(name: str) -> ModuleType:
    """``name`` imported; skipped only where ``TM_NOTORCH=1`` says its extra is left out."""
    if NOTORCH:
        return pytest.importorskip(name, reason=f"{name} is not installed in make test-notorch's virtualenv")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        error = e
    pytest.fail(f"{name} does not import ({error}): install the test extras (pip install -e \".[all,test]\", "
                "as make test does), or set TM_NOTORCH=1 where they are left out on purpose", pytrace=False)
