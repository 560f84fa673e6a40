"""Make an upgrade fixture (tests/test_upgrade.py) with an earlier version of the library.

Run it with that version's code first on the path, from a worktree of its commit::

    git worktree add --detach /tmp/old-REV REV
    PYTHONPATH=/tmp/old-REV python tests/data/upgrade/make_fixture.py tests/data/upgrade/DATE-REV

It fills a memory through that version's public API (turns with metadata and accents, a long
message, a duplicate, an ended and an open session, facts added, updated and deleted, working
memory, LangGraph store items, a consolidated 100-day-old session) and writes OUT_DIR/records.sql
(the sqlite3 shell's ``.dump`` of the record store: Python's ``iterdump`` writes FTS5 tables in a
form it cannot load back) and OUT_DIR/export.jsonl (that version's export). The vector index is
not kept: it is derived from the records.
"""
import os
import shutil
import subprocess
import sys
import tempfile

from tiered_memory import TieredMemory

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
folder = tempfile.mkdtemp(prefix="fixture-")
m = TieredMemory(folder)
day = 86400.0
t0 = 1_795_000_000.0  # fixed times: 2026-11-18
LONG = " ".join(f"Paragraph {i}: the Zürich offsite discussed the café budget and the façade near the Münster; "
                f"decision {i} was to keep the jalapeño tacos 🌮." for i in range(16))
assert len(LONG) > 1200


def turns(items, start):
    return [{"role": r, "content": c, "timestamp": start + 60 * i, **({"metadata": md} if md else {})}
            for i, (r, c, md) in enumerate(items)]


m.add_many(turns([
    ("user", "I'm vegetarian and I live in Lisbon. Olá! 🇵🇹", {"lang": "pt", "tags": ["food", "home"]}),
    ("assistant", "Noted! Lisbon has great vegetarian food.", None),
    ("user", "We decided to book the Porto trip for May. My favourite dessert is crème brûlée.", {"n": 3}),
    ("assistant", "Got it: Porto in May.", None),
], t0), user_id="ana", session_id="trip")
m.add_many(turns([("user", LONG, {"source": "notes"}), ("assistant", "Summarised the offsite.", None)],
                 t0 + day), user_id="ana", session_id="notes")
m.add_many(turns([
    ("user", "I'm learning the cavaquinho, señor.", None),
    ("assistant", "Practise the chords daily.", None),
    ("user", "I'm learning the cavaquinho, señor.", None),  # a duplicate
], t0 + 2 * day), user_id="ana", session_id="open")
m.add_many(turns([("user", "Jag bor i Göteborg och gillar smörgåsbord.", {"lang": "sv"}),
                  ("assistant", "Göteborg är fint!", None)], t0), user_id="björn", session_id="s1")
m.add_many(turns([("user", "Carol used to live in Kraków.", None), ("assistant", "Kraków is lovely.", None)],
                 t0 - 100 * day), user_id="carol", session_id="ancient")
m.end_session("trip", user_id="ana")
f1 = m.add_fact("User prefers green tea", user_id="ana", type="preference")
f2 = m.add_fact("User owns a cat named Miau", user_id="ana")
m.update_fact(f1.id, user_id="ana", text="User prefers green tea and pastéis de nata 🍵")
m.delete_fact(f2.id, user_id="ana")
wm = m.working_memory("open", user_id="ana")
wm.remember("Looking for a hotel near the river in Porto 🏨", importance=0.9, type="goal")
wm.scratchpad["plan"] = {"city": "Porto", "días": 2}
try:
    from langchain_tiered_memory.store import TieredMemoryStore
except ImportError:
    pass
else:
    store = TieredMemoryStore(m, fields=["text"])
    store.put(("ana", "memories"), "drink", {"text": "Prefers green tea 🍵", "tags": ["drink"]})
    store.put(("björn", "memories"), "food", {"text": "Likes köttbullar"})
m.consolidate("carol")  # the 100-day-old session: an episode, its turns archived
m.export_jsonl(os.path.join(out, "export.jsonl"))
m.close()
# the sqlite3 shell's .dump: FTS5 tables as their schema rows and shadow tables, which
# Python's iterdump cannot load back
dump = subprocess.run(["sqlite3", os.path.join(folder, "records.sqlite3"), ".dump"], capture_output=True,
                      text=True, check=True).stdout
with open(os.path.join(out, "records.sql"), "w") as f:
    f.write(dump)
shutil.rmtree(folder)
print("written", out)
