"""The CLI run in-process for tests: exit code, stdout and stderr, never a traceback."""

from __future__ import annotations

import io

from tiered_memory.cli import main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    assert "Traceback" not in err.getvalue()
    return code, out.getvalue(), err.getvalue()
