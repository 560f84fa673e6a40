"""A TieredMemoryBlock through pickling: an agent's ``Context`` saved with LlamaIndex's
``PickleSerializer``, and a ``Memory`` pickled on its own.

The block pickles its own fields and where its memory lives (folder and config), never the
memory: unpickled in the process that holds that memory open, it uses that memory; in a new
process it opens the folder itself. (``JsonSerializer`` leaves the agent's ``memory`` out of
the context by design: LlamaIndex asks for it again at ``run(memory=...)``.)
"""

from __future__ import annotations

import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.agent.workflow import FunctionAgent  # noqa: E402
from llama_index.core.llms.mock import MockFunctionCallingLLMWithChatMemoryOfLastCall  # noqa: E402
from llama_index.core.memory import Memory  # noqa: E402
from llama_index.core.workflow import Context  # noqa: E402
from workflows.context.serializers import PickleSerializer  # noqa: E402

from li_support import TOKENIZER, chat  # noqa: E402
from llamaindex_tiered_memory import TieredMemoryBlock  # noqa: E402
from tiered_memory import ConfigurationError, MemoryConfig, TieredMemory  # noqa: E402

REMEMBERED = [chat("user", "My cat is called Miso and she sleeps on the piano."),
              chat("assistant", "Miso sounds lovely.")]


def remembered(tm: TieredMemory, user_id: str = "u1") -> None:
    tm.add_many([{"role": m.role.value, "content": m.content} for m in REMEMBERED],
                session_id="old", user_id=user_id)


def classes_in(data: bytes) -> set[tuple[str, str]]:
    """The classes a pickle names (module, name)."""
    found: set[tuple[str, str]] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> type:
            found.add((module, name))
            return super().find_class(module, name)  # type: ignore[no-any-return]

    Recording(io.BytesIO(data)).load()
    return found


async def test_an_agent_context_pickled_and_restored_keeps_the_block_on_the_same_memory(
    make_memory: Callable[..., TieredMemory],
) -> None:
    tm = make_memory("agent")
    remembered(tm)
    block = TieredMemoryBlock(memory=tm, user_id="u1", max_tokens=900)
    chat_memory = Memory.from_defaults(session_id="s1", memory_blocks=[block], tokenizer_fn=TOKENIZER)
    llm = MockFunctionCallingLLMWithChatMemoryOfLastCall()
    agent = FunctionAgent(tools=[], llm=llm, system_prompt="You are a helpful assistant.")
    ctx = Context(agent)
    await agent.run(user_msg="Hello there.", memory=chat_memory, ctx=ctx)

    data = ctx.to_dict(serializer=PickleSerializer())
    assert chat_memory.memory_blocks == [block]  # saving the context took nothing from the live Memory

    restored = Context.from_dict(agent, data, serializer=PickleSerializer())
    again = await restored.store.get("memory")
    [back] = again.memory_blocks
    assert isinstance(back, TieredMemoryBlock)
    assert back.memory is tm  # the memory open in this process, not a copy and not a second open
    assert (back.user_id, back.max_tokens, back.name, back.priority) == ("u1", 900, block.name, block.priority)

    llm.reset_memory()
    await agent.run(user_msg="What is my cat called?", ctx=restored)
    sent = "\n".join(m.content or "" for m in llm.last_chat_messages or [] if m.role == "system")
    assert "Miso" in sent  # the restored agent still recalls long-term memory


def test_a_pickled_block_holds_no_memory_and_no_stored_text(make_memory: Callable[..., TieredMemory]) -> None:
    tm = make_memory("agent")
    remembered(tm)
    block = TieredMemoryBlock(memory=tm, user_id="u1")
    data = pickle.dumps(block)
    assert ("tiered_memory.memory", "TieredMemory") not in classes_in(data) and b"Miso" not in data
    back = pickle.loads(data)
    assert back.memory is tm and back.user_id == "u1"
    assert block.memory is tm  # pickling left the block as it was


def test_a_pickled_memory_reopens_the_folder_in_a_new_process(tmp_path: Path) -> None:
    config = MemoryConfig(max_content_chars=5000)
    tm = TieredMemory(tmp_path / "mem", config=config)  # the default embedder: a new process opens it alike
    remembered(tm)
    remembered(tm, user_id="u2")
    chat_memory = Memory.from_defaults(session_id="s1", tokenizer_fn=TOKENIZER,
                                       memory_blocks=[TieredMemoryBlock(memory=tm, user_id="u2")])
    (tmp_path / "memory.pickle").write_bytes(pickle.dumps(chat_memory))
    tm.close()

    script = textwrap.dedent("""
        import asyncio, pickle, sys
        from llama_index.core.llms import ChatMessage
        chat_memory = pickle.loads(open(sys.argv[1], "rb").read())
        [block] = chat_memory.memory_blocks
        print("config kept:", block.memory.config.max_content_chars, "user:", block.user_id)
        asyncio.run(chat_memory.aput(ChatMessage(role="user", content="What is my cat called?")))
        messages = asyncio.run(chat_memory.aget())
        print(messages[0].role.value, "Miso" in (messages[0].content or ""))
        block.memory.close()
    """)
    # that process's settings name other engines: the folder is opened as it was made all the same
    env = {**os.environ, "TIERED_MEMORY_RECORD_STORE": "postgresql://nobody@127.0.0.1:1/none",
           "TIERED_MEMORY_VECTOR_STORE": "qdrant"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "memory.pickle")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["config kept: 5000 user: u2", "system True"]


def test_a_block_whose_memory_cannot_be_opened_again_says_so_when_unpickled(tmp_path: Path) -> None:
    from tiered_memory.vector.chroma import ChromaVectorIndex

    tm = TieredMemory(tmp_path / "mem", vector_store=ChromaVectorIndex(str(tmp_path / "index")))
    data = pickle.dumps(TieredMemoryBlock(memory=tm, user_id="u1"))
    assert pickle.loads(data).memory is tm  # while it is open here, the block finds it
    tm.close()
    del tm
    gc.collect()
    with pytest.raises(ConfigurationError, match="cannot open it"):
        pickle.loads(data)


async def test_a_deep_copied_memory_shares_the_blocks_tiered_memory(make_memory: Callable[..., TieredMemory]) -> None:
    """A ``Memory`` deep-copies (a conversation branched); its block's memory is a handle, shared
    as LlamaIndex's state edits share the fields a model excludes, never copied."""
    tm = make_memory("agent")
    remembered(tm)
    block = TieredMemoryBlock(memory=tm, user_id="u1", every_turn=True)
    chat_memory = Memory.from_defaults(session_id="s1", memory_blocks=[block], tokenizer_fn=TOKENIZER)
    await block.arecord([chat("user", "hello")], session_id="s1")
    branch = copy.deepcopy(chat_memory)
    [copied] = branch.memory_blocks
    assert copied is not block and copied.memory is tm and copied.tokenizer_fn is block.tokenizer_fn
    assert copied.user_id == "u1" and copied._recorded == {"s1"} and copied._recorded is not block._recorded
    await branch.aput(chat("user", "What is my cat called?"))
    assert "Miso" in (await branch.aget())[0].content


def test_a_block_unpickled_after_its_memory_closed_uses_the_folder_open_now(tmp_path: Path) -> None:
    # a long-running app closes its memory (a reload, a shutdown hook) while the old object is
    # still referenced, then restores a saved agent: the block must not come back on the closed
    # object, whose every call is refused, but on the folder open now, or open it itself
    first = TieredMemory(tmp_path / "mem")
    remembered(first)
    data = pickle.dumps(Memory.from_defaults(session_id="s1", tokenizer_fn=TOKENIZER,
                                             memory_blocks=[TieredMemoryBlock(memory=first, user_id="u1")]))
    first.close()
    reopened = pickle.loads(data).memory_blocks[0]
    assert reopened.memory is not first
    try:
        assert "Miso" in reopened.memory.get_messages("old", user_id="u1")[0].content  # it opened the folder
    finally:
        reopened.memory.close()

    second = TieredMemory(tmp_path / "mem")  # the app opens the folder again and builds its blocks on it
    TieredMemoryBlock(memory=second, user_id="u2")
    try:
        assert pickle.loads(data).memory_blocks[0].memory is second
    finally:
        second.close()
    assert first is not None  # still referenced all along
