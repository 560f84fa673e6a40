"""Opening a Qdrant server: the error of a failed open and the traceback logged with it quote no
password or API key."""

from __future__ import annotations

import socket
import traceback

import pytest

from tiered_memory import VectorIndexError
from tiered_memory.vector.qdrant import QdrantVectorIndex

PASSWORD = "pw-h1dden-9f3"
API_KEY = "qk-h1dden-api-7c1"


def _logged(error: BaseException) -> str:
    """What ``log.exception`` or an uncaught error prints: the error and every error chained below it."""
    return "".join(traceback.format_exception(error))


def test_an_unreadable_url_keeps_its_password_out_of_the_logged_traceback() -> None:
    """A port out of range: urllib3's LocationParseError (qdrant-client reads the URL with it) quotes
    the whole URL. Our message masked the password; the cause chained below it ("The above exception
    was the direct cause") printed it in every logged traceback."""
    with pytest.raises(VectorIndexError) as info:
        QdrantVectorIndex(url=f"http://app:{PASSWORD}@127.0.0.1:99999")
    assert "Failed to parse: http://app:***@127.0.0.1:99999" in str(info.value)
    logged = _logged(info.value)
    assert PASSWORD not in logged
    assert "urllib3.exceptions.LocationParseError: Failed to parse" in logged  # what failed, still said


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")
def test_an_api_key_read_with_its_newline_is_masked_and_the_newline_shown() -> None:
    """A key read from a file (a mounted secret) with its line end: h11 refuses the header, quoting
    its value as bytes (``b'key\\n'``), a form the mask did not know, so the key was in our message
    and in the chained errors. Masked now, in every form, with the newline left to see."""
    with socket.socket() as listening:  # connections wait in its backlog: the request is refused before sending
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(VectorIndexError) as info:
            QdrantVectorIndex(url=url, api_key=API_KEY + "\n")
    assert "Illegal header value b'***\\n'" in str(info.value)
    logged = _logged(info.value)
    assert API_KEY not in logged
    assert "LocalProtocolError: Illegal header value b'***\\n'" in logged
