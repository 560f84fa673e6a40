"""The pure conversions between LlamaIndex chat messages and the core's
(``llamaindex_tiered_memory.messages``): table tests."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import TextBlock  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402

from llamaindex_tiered_memory.messages import (build_query, message_text, shown_already, storable_text,  # noqa: E402
                                               to_core_messages, without_rendered_memory)
from tiered_memory.context.render import (CUT_MARKER, PREAMBLE, ContextItem, Section,  # noqa: E402
                                          holds_rendered_memory, render_memory)




def chat(role: str, text: str) -> ChatMessage:
    return ChatMessage(role=role, content=text)


def test_query_and_conversion_rules() -> None:
    msgs = [chat("user", "first"), chat("assistant", "reply"), chat("tool", "42"),
            ChatMessage(role="assistant", content="")]
    assert build_query(msgs) == "first"
    assert build_query([chat("assistant", "only me")]) == "only me"
    assert build_query([]) == ""
    # text the chat store holds but the core refuses as a query is made valid, not refused
    assert build_query([chat("user", "bad \udcff bytes\x00 here"), chat("tool", "x")]) == "bad ? bytes here"
    rows = to_core_messages([*msgs, chat("developer", "be brief"), chat("chatbot", "hi")])
    assert [(r["role"], r["content"]) for r in rows] == [
        ("user", "first"), ("assistant", "reply"), ("tool", "42"),
        ("system", "be brief"), ("assistant", "hi")]
    assert rows[3]["metadata"]["llamaindex_role"] == "developer"


def test_a_text_block_holding_a_rendered_memory_is_not_the_messages_text() -> None:
    rendered = render_memory([Section(name="facts", title="Facts", items=[
        ContextItem(id="f1", text="User lives in Lisbon", tokens=4)])])
    inserted = f"<memory>\n<tiered_memory>\n{rendered}\n</tiered_memory>\n</memory>"  # Memory's template
    assert holds_rendered_memory(rendered) and holds_rendered_memory(inserted)
    for own_words in ["What does <memory> mean?", PREAMBLE, "User lives in Lisbon", ""]:
        assert not holds_rendered_memory(own_words)
    asked = ChatMessage(role="user", blocks=[TextBlock(text=inserted), TextBlock(text="Where do I live?")])
    assert message_text(asked) == "Where do I live?"
    assert build_query([asked]) == "Where do I live?"
    assert to_core_messages([ChatMessage(role="system", blocks=[TextBlock(text=inserted)]), asked]) == [
        {"role": "user", "content": "Where do I live?", "metadata": {"source": "llamaindex"}}]


def test_the_block_stores_text_with_the_cores_storable_text() -> None:
    # one function for both adapters (its rules: tests/test_core_storable.py)
    from tiered_memory import storable

    assert storable_text is storable.storable_text


@pytest.mark.parametrize(
    ("item", "current", "shown"),
    [
        ("hello", {"hello"}, True),
        ("hello", {"hello there"}, False),  # a whole text is matched whole
        ("Here is my essay" + CUT_MARKER, {"Here is my essay about kayaks."}, True),
        ("  Here is my essay" + CUT_MARKER, {"  Here is my essay about kayaks."}, True),
        ("Here is my poem" + CUT_MARKER, {"Here is my essay about kayaks."}, False),
        (CUT_MARKER.strip(), {"anything"}, False),  # a cut that kept no text
    ],
)
def test_shown_already_rules(item: str, current: set[str], shown: bool) -> None:
    assert shown_already(item.strip(), current) is shown


RENDERED = render_memory([Section(name="facts", title="Facts", items=[
    ContextItem(id="f1", text="User said </memory> once", tokens=4)])])
WRAPPED = f"\n<memory>\n<tiered_memory>\n{RENDERED}\n</tiered_memory>\n</memory>\n"  # Memory's template


@pytest.mark.parametrize(("text", "left"), [
    (WRAPPED + "\nWhere do I live? I have a dog, Rex.", "Where do I live? I have a dog, Rex."),  # content kept
    (WRAPPED + "\nWhat does </memory> mean?", "What does </memory> mean?"),  # a tag in the words
    (WRAPPED.replace("</tiered_memory>", "</tiered_memory>\n<notes>\nhikes\n</notes>") + "\nYou are kind.",
     "You are kind."),  # another block in the wrapper is the prompt's too
    (WRAPPED, None), (RENDERED, None),  # only a memory
    (f"I pasted this: {RENDERED} what is it?", "I pasted this:  what is it?"),  # no wrapper: the memory alone
    (WRAPPED[: WRAPPED.index("## Facts")], None),  # cut short: where it ends is unknown
    ("What does <memory> mean?", "What does <memory> mean?"),
])
def test_a_memory_memory_put_before_the_words_is_taken_out_of_them(text: str, left: str | None) -> None:
    assert without_rendered_memory(text) == left
    assert message_text(chat("user", text)) == (left or "")
