"""What ``TieredMemory(...)`` is given, checked when it opens: a setting that names no backend is a
``ConfigurationError`` that shows no password, an argument of the wrong kind is a
``ConfigurationError`` naming what it must be, and neither leaves a file behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tiered_memory import ConfigurationError, StaticEmbedder, TieredMemory

SECRET = "pg-s3cret-pw"

NOT_URLS = [
    f"host=db.internal user=app password={SECRET} dbname=app",  # a libpq key/value string
    f"postgresql//app:{SECRET}@db.internal/app",  # a URL missing its colon
    f"app:{SECRET}@db.internal:5432/app",  # a URL missing its scheme
    f"postgresql:app:{SECRET}@db.internal",
]


@pytest.mark.parametrize("setting", NOT_URLS)
@pytest.mark.parametrize("key", ["record_store", "vector_store"])
@pytest.mark.parametrize("via", ["argument", "environment"])
def test_a_setting_that_is_no_url_is_refused_without_showing_its_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, key: str, via: str) -> None:
    kwargs: dict[str, Any] = {key: setting}
    if via == "environment":
        monkeypatch.setenv(f"TIERED_MEMORY_{key.upper()}", setting)
        kwargs = {}
    with pytest.raises(ConfigurationError, match=f"{key} must be") as info:
        TieredMemory(tmp_path / "m", embedder=StaticEmbedder(), **kwargs)
    assert SECRET not in str(info.value)
    assert not (tmp_path / "m").exists()

