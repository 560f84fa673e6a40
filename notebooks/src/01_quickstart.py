# %% [markdown]
# # tiered-memory quickstart
#
# Long-term memory for an LLM agent on the **embedded default**: SQLite + ChromaDB on
# disk + the static embedder shipped in the wheel (distilled from all-MiniLM-L6-v2; no
# PyTorch). No API key, no network.
#
# We store two sessions for two users, search, build a prompt context within a token
# budget, restart, and finally forget a user.

# %%
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from tiered_memory import TieredMemory

folder = tempfile.mkdtemp(prefix="tiered-memory-quickstart-")
memory = TieredMemory(folder)
print("memory folder:", folder)

# %% [markdown]
# ## Store conversations
# `add_many` is the bulk path (it embeds in batches); every call is scoped by
# `user_id` and `session_id`.

# %%
memory.add_many(
    [
        {"role": "user", "content": "Hi! I'm Ana. I moved to Lisbon last spring."},
        {"role": "assistant", "content": "Welcome, Ana! How are you finding Lisbon?"},
        {"role": "user", "content": "I love it. I'm vegetarian, so the bakeries are my favourite part."},
        {"role": "assistant", "content": "Pastel de nata is vegetarian, lucky you."},
    ],
    user_id="ana", session_id="2026-01-10",
)
memory.add_many(
    [
        {"role": "user", "content": "I'm training for the Lisbon half marathon in March."},
        {"role": "assistant", "content": "Great goal! How many runs a week?"},
        {"role": "user", "content": "Three runs a week, and my knee hurts after long runs."},
    ],
    user_id="ana", session_id="2026-02-02",
)
memory.add_many(
    [
        {"role": "user", "content": "I'm Ben. I live in Toronto and I eat a lot of steak."},
        {"role": "assistant", "content": "Nice to meet you, Ben."},
    ],
    user_id="ben", session_id="s1",
)
print(memory.stats())

# %% [markdown]
# ## Search
# Hybrid recall fuses vector similarity, keyword (BM25) and signals read from the turns
# around each hit (a learned table of weights); every hit explains its score, signal by
# signal. Ben's memories never appear in Ana's results.

# %%
for hit in memory.search("What does the user eat?", user_id="ana", k=3):
    print(f"{hit.score:.4f}  {hit.session_id:12s} {hit.text}")
    parts = hit.explanation["signals"]
    print("        what it adds:", {k: round(v["contribution"], 2) for k, v in parts.items() if "contribution" in v})

# %% [markdown]
# ## Build a context for the next prompt
# `build_context` fits the recent buffer and relevant long-term memory into a token
# budget and reports what it left out.

# %%
context = memory.build_context(
    "Any advice for my race?", user_id="ana", session_id="2026-02-02", max_tokens=400
)
for section in context.sections:
    print(f"== {section.title} ({section.tokens} tokens)")
    for item in section.items:
        print("  ", item.text)
print(f"== recent buffer ({sum(i.tokens for i in context.recent)} tokens)")
for item in context.recent:
    print("  ", item.role, ":", item.text)
print("total tokens:", context.tokens, "of", context.max_tokens, "| dropped:", len(context.dropped))

# %% [markdown]
# The same context as chat messages: memory is quoted data inside one system message,
# the recent turns keep their roles.

# %%
for message in context.to_messages():
    print(message["role"].upper(), "::", message["content"][:300])

# %% [markdown]
# ## Restart: nothing is lost

# %%
before = memory.stats()
memory.close()
memory = TieredMemory(folder)
after = memory.stats()
print(before.messages, "->", after.messages)
assert after.messages == before.messages
print(memory.search("knee pain", user_id="ana", k=1)[0].text)

# %% [markdown]
# ## Forget a user
# `forget_user` removes every trace of a user from every store and index.

# %%
removed = memory.forget_user("ben")
print("removed", removed, "messages;", memory.stats())
assert memory.search("steak", user_id="ben") == []
memory.close()
