"""The masking of secrets (tiered_memory.redaction): in each form an error may quote one, and in
the errors chained below ours, which a logged traceback prints."""

from __future__ import annotations

import traceback

import pytest

from tiered_memory.redaction import MaskedError, RememberedTokens, mask, masked_cause
from tiered_memory.store.postgres_url import redact

KEY = "k3y-Ω\\x"


@pytest.mark.parametrize("text, expected", [
    (f"bad key {KEY}", "bad key ***"),
    (f"header {KEY!r}", "header '***'"),  # repr escapes the backslash
    (f"header {(KEY + chr(10)).encode()!r}", "header b'***\\n'"),  # as h11 quotes it; the newline left to see
    ("url http://u:k3y-%CE%A9%5Cx@h", "url http://u:***@h"),  # percent-encoded
    ("nothing secret", "nothing secret"),
])
def test_a_secret_is_masked_in_each_form_a_message_quotes_it(text: str, expected: str) -> None:
    assert mask(text, [None, "", " ", KEY + "\n"]) == expected


def test_a_decoded_password_of_a_postgres_url_is_masked() -> None:
    """The URL holds it percent-encoded; libpq and psycopg read it decoded. Only the encoded form was masked."""
    url = "postgresql://app:s%C3%A9cret-pw@db.internal/notes"
    assert redact(f"{url} refused: password 'sécret-pw'", url) == (
        "postgresql://app:***@db.internal/notes refused: password '***'")


def _raised(secret: str) -> BaseException:
    """A backend's chain: a cause quoting ``secret``, and an error raised while handling it."""
    try:
        try:
            raise ValueError(f"cannot parse http://u:{secret}@h")
        except ValueError as inner:
            raise KeyError("no such option") from inner
    except KeyError as outer:
        try:
            raise RuntimeError("while cleaning up")
        except RuntimeError as last:
            return last


def test_a_chain_quoting_no_secret_is_chained_as_it_is() -> None:
    error = _raised("public")
    assert masked_cause(error, ["s3cret-pw", None]) is error


def test_a_chain_quoting_a_secret_is_masked_and_keeps_its_types_links_and_frames() -> None:
    error = _raised("s3cret-pw")
    error.__context__.__cause__.__notes__ = ["again: s3cret-pw"]  # type: ignore[union-attr]
    masked = masked_cause(error, ["s3cret-pw"])
    printed = "".join(traceback.format_exception(masked))
    assert "s3cret-pw" not in printed
    assert isinstance(masked, MaskedError) and str(masked) == "builtins.RuntimeError: while cleaning up"
    below = masked.__context__
    assert masked.__cause__ is None and str(below) == "builtins.KeyError: 'no such option'"
    assert str(below.__cause__) == "builtins.ValueError: cannot parse http://u:***@h"
    assert below.__cause__.__notes__ == ["again: ***"]
    assert "During handling of the above exception" in printed and "direct cause" in printed
    assert printed.count('raise ValueError(f"cannot parse') == 1  # the original frames


def test_remembered_tokens_call_the_provider_once_a_call_and_keep_the_last_few() -> None:
    """A token provider wrapped: each call is one call of it, its answer returned as it is (an
    awaitable too, which a client may await), and the last ``keep`` different tokens are kept."""
    given = iter(["t1", "t2", "t2", "t3", "t4"])
    remembered = RememberedTokens(lambda: next(given), keep=2)
    assert [remembered() for _ in range(5)] == ["t1", "t2", "t2", "t3", "t4"]
    assert list(remembered) == ["t3", "t4"]
    not_a_token = object()
    assert RememberedTokens(lambda: not_a_token)() is not_a_token
