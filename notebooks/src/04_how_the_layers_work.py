# %% [markdown]
# # How the layers work
#
# Buffer eviction, episode compression, fact extraction with updates and invalidation,
# working-memory decay, consolidation over simulated months, and the token budget per
# section, each with a small plot.
#
# **LLM note:** this notebook runs offline with no key. Episodes and facts come from the
# documented **extractive fallback** (rules, marked `metadata["method"] == "extractive"`);
# one cell uses the library's `ScriptedLLM` fake to show the LLM path. With a real model,
# pass `llm=ChatOpenAI(...)` (or any LangChain / LlamaIndex LLM) to `TieredMemory`.

# %%
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib.pyplot as plt  # inline in Jupyter; MPLBACKEND=Agg in CI

from tiered_memory import TieredMemory
from tiered_memory.layers.buffer import select_buffer
from tiered_memory.tokens import default_token_counter
from tiered_memory.types import StoredMessage

count = default_token_counter()

# %% [markdown]
# ## 1. The buffer evicts whole turns
# The buffer keeps the newest *whole* user→assistant turns within a message and token
# limit; what it evicts stays searchable in long-term memory.

# %%
messages, kept_tokens, evicted_counts = [], [], []
for turn in range(30):
    for role, text in (("user", f"Question {turn}: " + "tell me more " * (turn % 5 + 1)),
                       ("assistant", f"Answer {turn}: " + "here is a detail " * (turn % 7 + 2))):
        messages.append(StoredMessage(id=f"m{len(messages)}", user_id="u", session_id="s", role=role,
                                      content=text, timestamp=float(len(messages))))
    kept, evicted = select_buffer(messages, max_messages=20, max_tokens=250, count=count)
    kept_tokens.append(sum(count(m.content) for m in kept))
    evicted_counts.append(len(evicted))
    assert kept[0].role == "user"  # never starts mid-turn

fig, ax = plt.subplots(1, 2, figsize=(9, 3))
ax[0].plot(kept_tokens); ax[0].axhline(250, ls="--", c="grey"); ax[0].set_title("buffer tokens (limit 250)")
ax[1].plot(evicted_counts); ax[1].set_title("messages evicted to long-term")
for a in ax: a.set_xlabel("turn")
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 2. Sessions become episodes, statements become facts
# We simulate six months of weekly sessions for one user, ending each session.

# %%
memory = TieredMemory(tempfile.mkdtemp(prefix="tm-layers-"))
DAY = 86400.0
start = time.time() - 180 * DAY
script = [
    "I live in Lisbon and I work as a nurse.",
    "I prefer tea over coffee in the mornings.",
    "We decided to adopt a dog called Bolt next month.",
    "I'm allergic to peanuts.",
    "My sister Rita is visiting in December.",
    "I moved to Porto last week for a new job.",
]
small_talk = ["The weather was rainy all week.", "Work was busy with night shifts.",
              "Bolt learned to sit today!", "I watched a documentary about whales."]
sizes = []
for week in range(26):
    t = start + week * 7 * DAY
    text = script[week] if week < len(script) else small_talk[week % len(small_talk)]
    memory.add_many(
        [{"role": "user", "content": text, "timestamp": t},
         {"role": "assistant", "content": "Thanks, noted.", "timestamp": t + 60}],
        user_id="ana", session_id=f"week-{week:02d}",
    )
    memory.end_session(f"week-{week:02d}", user_id="ana")
    sizes.append((week, memory.stats().messages, len(memory.episodes("ana")),
                  len(memory.facts("ana")), len(memory.facts("ana", include_invalid=True))))

episode = memory.episodes("ana")[-1]
print("latest episode:", episode.summary, "| entities:", episode.entities, "|", episode.metadata.get("method"))
for fact in memory.facts("ana", include_invalid=True)[:8]:
    state = "valid" if fact.valid else "invalidated"
    print(f"{fact.type:12s} {state:12s} {fact.text}")

# %% [markdown]
# "I moved to Porto" contradicts "I live in Lisbon": the old fact is **invalidated from a
# time**, not destroyed, and every change is in the fact history.

# %%
for change in memory.fact_history("ana")[:10]:
    print(change)

# %% [markdown]
# ## 3. The LLM path, with the scripted fake
# The same `end_session`, with an LLM that returns (fenced) JSON. A real model is used the
# same way; malformed output is retried once with the validation error, then falls back.

# %%
from tiered_memory.testing import ScriptedLLM, fenced

llm = ScriptedLLM(by_task={
    "facts": [fenced({"facts": [{"type": "preference", "text": "User enjoys hiking in Sintra",
                                 "confidence": 0.9, "sources": [1]}]})],
    "episode": [fenced({"summary": "Ana talked about weekend hiking in Sintra.", "entities": ["Ana", "Sintra"],
                        "decisions": [], "open_questions": ["Which trail?"], "key_facts": ["Ana hikes"]})],
}, default={"action": "add", "target": None, "text": None})  # answer for fact resolution
memory.llm = llm
memory.add("user", "This weekend I went hiking in Sintra, I love it.", user_id="ana", session_id="llm-demo")
ep = memory.end_session("llm-demo", user_id="ana")
print(ep.summary, ep.open_questions, ep.metadata.get("method"), "| LLM calls:", len(llm.calls))
memory.llm = None

# %% [markdown]
# ## 4. Working memory decays
# Per session, items carry an importance that decays with age (rate per hour) and the
# lowest are evicted at capacity. Relevance to the query re-ranks them.

# %%
from tiered_memory.layers.working import decayed

hours = list(range(0, 72))
fig, ax = plt.subplots(figsize=(5, 3))
for importance in (1.0, 0.6, 0.3):
    ax.plot(hours, [decayed(importance, 0, h * 3600, memory.config.working.decay_per_hour) for h in hours],
            label=f"importance {importance}")
ax.set_xlabel("hours"); ax.set_title("working-memory decay"); ax.legend(); plt.tight_layout(); plt.show()

wm = memory.working_memory("week-25", user_id="ana")
wm.remember("Goal: find a flat in Porto", importance=0.9, type="goal")
wm.remember("Asked about tram passes", importance=0.3)
wm.scratchpad["step"] = "comparing neighbourhoods"
print([(i.text, round(i.score or 0, 3)) for i in wm.items("where will I live?")], dict(wm.scratchpad))

# %% [markdown]
# ## 5. Consolidation over months
# `consolidate` merges near-duplicate facts, promotes often-recalled episodes to facts,
# compresses episodes older than 30 days (their raw turns move to an archive table, out of
# the hot indexes) and prunes stale memories as audited soft deletes. It is idempotent.

# %%
for _ in range(4):  # recall one episode often enough to be promoted
    memory.search_episodes("dog Bolt adoption", user_id="ana", k=1)
before = memory.stats().messages
report = memory.consolidate("ana")
print(report)
again = memory.consolidate("ana")
print("second run:", again)
print("hot messages:", before, "->", memory.stats().messages)

weeks = [s[0] for s in sizes]
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(weeks, [s[1] for s in sizes], label="raw messages")
ax.plot(weeks, [s[2] for s in sizes], label="episodes")
ax.plot(weeks, [s[3] for s in sizes], label="valid facts")
ax.plot(weeks, [s[4] for s in sizes], label="all facts (incl. invalidated)")
ax.scatter([weeks[-1]], [memory.stats().messages], c="k", zorder=3, label="hot messages after consolidate")
ax.set_xlabel("week"); ax.set_title("layer sizes over six months"); ax.legend(fontsize=7)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## 6. The token budget per section
# `build_context` gives each section a share of the memory budget, keeps items whole,
# lets unused share flow to other sections and reports what it dropped. A fact is shown
# when it is a constraint or about as close to the question as the past turns, so the
# tea, the dog and the sister stay out here. The model gets one `<memory>` block of
# quoted items, a `## title` line heading each section.

# %%
context = memory.build_context("Where do I live and what can't I eat?", user_id="ana",
                               session_id="week-25", max_tokens=400)
names = [s.name for s in context.sections] + ["recent"]
tokens = [s.tokens for s in context.sections] + [sum(i.tokens for i in context.recent)]
fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(names, tokens); ax.set_title(f"tokens per section (budget {context.max_tokens})")
plt.tight_layout(); plt.show()
print("total", context.tokens, "| dropped:", [(d.section, d.reason) for d in context.dropped][:5])
print(context.to_text()[:1500])
assert context.tokens <= context.max_tokens
memory.close()
