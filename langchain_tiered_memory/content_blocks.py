"""The content blocks a replayed LangChain message may carry (pure).

A replay resends a stored message's content blocks only when each says nothing the stored
(indexed, checked) text does not: a plain text block (its text is the stored text) or media
that says only where the media is and what it is. Any other block (reasoning, ``tool_use``,
text-bearing media, an unknown kind, a block with annotations) is not resent as it is: a message
with one replays its text and its media (:func:`resent`), and a replay that turns a message to
text (its calls quoted, a tool result quoted as user-side data) keeps its media beside that text
(:func:`appended`, :func:`led_by`). LangChain's standard content blocks let every kind of message
carry media (a provider's adapter translates them), and a quoted tool result becomes a user
message, which every provider takes media in. Media that says more than where it is and what it is
(``text-plain``, a field of text, a payload of text: a text file, a data URL of text, SVG, base64
"data" that is words) comes back as a placeholder naming its kind (``[stored image_url block left
out]``), so a model knows something was there.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["DATA_KINDS", "appended", "attachments", "block_text", "is_media", "is_text", "led_by", "replayable",
           "resent"]

# Media blocks: LangChain v1 (``image``/``audio``/``video``/``file`` with url, base64 or
# file_id), v0 (``source_type`` url/base64/id with url, data or id) and the provider shapes
# LangChain passes through (OpenAI ``image_url``/``input_audio``/``file``, Anthropic ``source``).
_MEDIA_KINDS = frozenset({"image", "image_url", "audio", "input_audio", "video", "file"})
_MEDIA_PAYLOAD = frozenset({"url", "base64", "data", "file_data", "image_url"})  # fetched or decoded, not read
_MEDIA_WORDS = frozenset({"type", "source_type", "id", "file_id", "mime_type", "media_type", "detail", "format",
                          "filename", "ttl"})
_MEDIA_NESTED = frozenset({"image_url", "source", "file", "input_audio", "extras", "metadata", "cache_control"})
_MEDIA_SOURCES = frozenset({"url", "base64", "id", "file", "ephemeral"})  # nested ``type``s and ``source_type``s
DATA_KINDS = _MEDIA_KINDS | {"text-plain"}
"""Block kinds that carry media (LangChain's data blocks and the provider shapes of :func:`is_media`)."""
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+/-]{0,127}")  # a mime type, an id, a file name, a detail
# what providers take as media; any other type (text/*, JSON, SVG's XML) is a document whose bytes are text
_MEDIA_TYPE = re.compile(r"(?:image|audio|video)/[a-z0-9][a-z0-9.+-]{0,63}|application/pdf", re.IGNORECASE)
_TEXT_IMAGES = frozenset({"image/svg+xml"})
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")  # no space: no words
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")  # RFC 3986's characters
# its parameters (charset=..., name=...) hold a URL's characters, as any URL: no space, no quote
_DATA_URL = re.compile(r"data:([^;,]*)(?:;[A-Za-z0-9._~:/?#\[\]@!$&()*+=%-]*)*;base64,(.*)", re.IGNORECASE | re.DOTALL)


def _is_media_type(value: str) -> bool:
    return _MEDIA_TYPE.fullmatch(value) is not None and value.lower() not in _TEXT_IMAGES


def _is_payload(key: str, value: object) -> bool:
    """Whether ``value`` is where media is and nothing else (pure): base64 data, a URL with no space
    or quote in it, or a base64 data URL of a media type (a data URL of text, or not base64, holds text)."""
    if not isinstance(value, str):
        return False
    if key in ("base64", "data"):
        return _BASE64.fullmatch(value) is not None
    if value[:5].lower() == "data:":
        data = _DATA_URL.fullmatch(value)
        return data is not None and _is_media_type(data[1]) and _BASE64.fullmatch(data[2]) is not None
    return _URL.fullmatch(value) is not None


def _is_word(key: str, value: object) -> bool:
    """Whether ``value`` is a word (:data:`_WORD`), and, under a mime type's key, a media type."""
    return (isinstance(value, str) and _WORD.fullmatch(value) is not None
            and (key not in ("mime_type", "media_type") or _is_media_type(value)))


def is_media(block: Mapping[str, Any], *, depth: int = 0) -> bool:
    """Whether ``block`` says only where media is and what it is, with no field a provider
    could show the model as text (pure): its payload base64 data or a URL (:func:`_is_payload`), its
    other fields words, its mime type an image, audio or video type or PDF, never text (a text file,
    SVG). ``depth`` counts the nested mappings above it."""
    kind, source = block.get("type"), block.get("source_type", "url")
    if depth > 2 or not isinstance(kind, (str, type(None))) or not isinstance(source, str):
        return False
    if not (kind in _MEDIA_KINDS if depth == 0 else kind is None or kind in _MEDIA_SOURCES):
        return False
    if source not in _MEDIA_SOURCES:  # v0's ``text`` source holds text
        return False
    for key, value in block.items():
        ok = ((key in _MEDIA_PAYLOAD and _is_payload(key, value))
              or (key in _MEDIA_NESTED and isinstance(value, Mapping) and is_media(value, depth=depth + 1))
              or (key in _MEDIA_WORDS and _is_word(key, value))
              or (key == "index" and isinstance(value, int)))
        if not ok:
            return False
    return True


def is_text(block: Mapping[str, Any]) -> bool:
    """A plain text block: its text, at most an id and an index (annotations and extras may
    hold other text, so a block with them is not replayed as a block)."""
    return (block.get("type") == "text" and isinstance(block.get("text"), str)
            and set(block) <= {"type", "text", "id", "index"}
            and _WORD.fullmatch(str(block.get("id", "id"))) is not None and isinstance(block.get("index", 0), int))


def replayable(content: Any) -> bool:
    """Whether ``content`` may be replayed as it is (pure): a string, or a list of strings,
    plain ``text`` blocks (whose text ``text_of`` compares with the stored text) and media
    blocks. Any other block is not replayed: reasoning and thinking blocks (a provider takes a
    past assistant turn without them; only the turn of an active tool loop needs them, and that
    one is in the agent's state, not replayed), ``tool_use`` and ``tool_call`` blocks (the
    message's ``tool_calls`` stand for them), text-bearing media (``text-plain``), unknown kinds."""
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(b, str) or isinstance(b, Mapping) and (is_text(b) or is_media(b)) for b in content)


def block_text(block: str | Mapping[str, Any]) -> str:
    """The text of a string or a plain text block (:func:`is_text`)."""
    return block if isinstance(block, str) else str(block["text"])


def _resent_block(block: Any) -> tuple[bool, Any] | None:
    """``(is it the message's text, the block a replay sends for it)``, or ``None`` for a block
    that is left out (pure)."""
    if isinstance(block, str) or isinstance(block, Mapping) and is_text(block):
        return True, block
    if not isinstance(block, Mapping):
        return None
    if is_media(block):
        return False, block
    if block.get("type") == "text" and isinstance(block.get("text"), str):  # annotations, extras: the text alone
        return True, {"type": "text", "text": block["text"]}
    if block.get("type") in DATA_KINDS:  # a known kind, never a stored string
        return False, {"type": "text", "text": f"[stored {block['type']} block left out]"}
    return None


def resent(content: list[Any]) -> list[Any]:
    """The blocks of ``content`` a replay may resend, in order (pure): strings, plain text blocks
    and media as they are; a text block with more (annotations, extras) as its text alone, which is
    what the message's text counts; media that says more than where it is as a placeholder naming
    its kind; nothing of any other block (reasoning, ``tool_use``, unknown kinds)."""
    return [kept[1] for kept in map(_resent_block, content) if kept is not None]


def attachments(content: Any) -> list[Any]:
    """What of ``content`` is not its text: its media blocks and the placeholders of media it cannot
    resend, in order (pure; none for a string)."""
    if not isinstance(content, list):
        return []
    return [kept[1] for kept in map(_resent_block, content) if kept is not None and not kept[0]]


def appended(content: Any, own_text: str, text: str) -> str | list[Any]:
    """``content`` (whose text is ``own_text``) with ``text`` after it, on a line of its own when
    there is text before it (pure): a string when ``content`` holds no media, else its blocks and a
    text block of ``text``."""
    line = ("\n" if own_text.strip() and text else "") + text
    if not attachments(content):
        return own_text + line
    return [*content, {"type": "text", "text": line}] if line else content


def led_by(text: str, content: Any) -> str | list[Any]:
    """``text`` in place of ``content``'s text, its media after it (pure): ``text`` alone when
    ``content`` holds none."""
    media = attachments(content)
    return [{"type": "text", "text": text}, *media] if media else text
