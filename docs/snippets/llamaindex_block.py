from llama_index.core.llms import ChatMessage
from llama_index.core.memory import Memory

from llamaindex_tiered_memory import TieredMemoryBlock, end_session, offline_tokenizer
from tiered_memory import TieredMemory

store = TieredMemory()  # ~/.tiered-memory (or $TIERED_MEMORY_HOME): SQLite + Chroma + static embedder
count = offline_tokenizer()  # the core's token count: Memory's, and the block's when it cuts
block = TieredMemoryBlock(memory=store, user_id="alice", tokenizer_fn=count)

monday = Memory.from_defaults(session_id="monday", memory_blocks=[block], tokenizer_fn=count)
monday.put_messages([ChatMessage(role="user", content="I'm vegetarian and I live in Lisbon."),
                     ChatMessage(role="assistant", content="Noted!")])
end_session(monday)  # what is still short-term goes to long-term memory

tuesday = Memory.from_defaults(session_id="tuesday", memory_blocks=[block], tokenizer_fn=count)
print(tuesday.get(input="Where should I eat tonight?")[0].content)  # memory: Lisbon, vegetarian
# agent.run("Where should I eat tonight?", memory=tuesday) -- a FunctionAgent; for a
# ReActAgent: Memory.from_defaults(..., insert_method="user")
store.close()
