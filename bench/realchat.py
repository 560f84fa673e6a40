"""A second development set that reads like real chat, derived from the LoCoMo dev file.

LoCoMo's turns are written prose: every turn starts with the speaker's name (as
:func:`bench.locomo_data.turn_text` stores it), sentences are long, cased and punctuated,
and one turn holds what a person would send as two or three messages. The real chats the
library meets (and the held-back real-chat set the issue describes: short informal
messages, photos, typos) do not look like that, and signals that fit the written style
help less there. :func:`realchat` turns each dev conversation into one that looks more
like a chat, deterministically (the same input gives the same output on every machine),
keeping every evidence id answerable:

- **no speaker prefix** in the text (the speaker stays in the metadata, as a chat app
  knows who sent a message);
- **long turns split** into messages at sentence ends (at most :data:`MAX_PARTS`), each
  part keeping the turn's dialogue id, so evidence found in any part counts;
- **informal casing**: most messages start lower-case, ``I`` becomes ``i``, a final
  full stop is dropped, a few messages are entirely lower-case;
- **chat spellings** (``you`` -> ``u``, ``because`` -> ``bc``, ...) and **typos** (two
  adjacent letters swapped, a letter dropped) in a small share of words;
- **dates written out in the text** (``on 8 May, 2023``) are removed; the session date
  still stamps every message, as a chat's timestamps do;
- a shared photo's caption stays (``[shares a photo: ...]``): chats share photos too.

Questions are unchanged. Pure functions; ``bench.locomo --dataset realchat`` runs it.

:func:`realchat_noisy` (``--dataset realchat-noisy``) goes one step further: real chats are
full of messages that carry nothing but a reaction (``lol``, ``omg``, ``haha yes``). After
:data:`REACTION_RATE` of the messages the other person sends one, between a message and
its reply, so a reply's turn before is often a reaction. Reactions are never evidence.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import replace

from bench.locomo_data import Conversation, Turn

MAX_PARTS = 3
SPLIT_OVER = 110  # characters: a turn longer than this is sent as several messages
TYPO_RATE = 0.04  # share of words of 4+ letters with a typo
SLANG_RATE = 0.5  # share of the words of SLANG respelt
LOWER_ALL_RATE = 0.3  # share of messages entirely lower-case

SLANG = {"you": "u", "your": "ur", "are": "r", "because": "bc", "really": "rly", "okay": "ok",
         "though": "tho", "tonight": "tonite", "probably": "prob", "people": "ppl", "thanks": "thx",
         "about": "abt", "something": "smth", "with": "w/", "please": "pls", "great": "gr8"}
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_PHOTO = re.compile(r"\s*(\[shares a photo: [^\]]*\])$")
_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November|"
          r"December)")
_DATE_IN_TEXT = re.compile(
    r",?\s*(?:\(|\bon\s+)?(?:\d{1,2}(?:st|nd|rd|th)?\s+" + _MONTH + r",?\s+(?:19|20)\d\d|"
    + _MONTH + r"\s+\d{1,2}(?:st|nd|rd|th)?,?\s+(?:19|20)\d\d)\)?")
_WORD = re.compile(r"[A-Za-z']+")
REACTION_RATE = 0.35  # share of messages the other person answers with a reaction first
REACTIONS = ("lol", "haha", "omg", "wow", "nice!!", "yeah", "same", "aww", "ikr", "no way",
             "haha yes", "for real?", "omg yes", "love that", "so cool", "hmm", "oh nice", "ya",
             "lmao", "true", "wait what", "aw thx", "yess", "damn")


def _rng(*key: str) -> random.Random:
    """A generator seeded by ``key`` alone (not Python's salted ``hash``): deterministic."""
    return random.Random(int.from_bytes(hashlib.sha256("\x1f".join(key).encode()).digest()[:8], "big"))


def strip_speaker(text: str, speaker: str) -> str:
    """``"Caroline: hi"`` -> ``"hi"`` (only the turn's own speaker's prefix)."""
    prefix = f"{speaker}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def drop_dates(text: str) -> str:
    """Remove dates written out in full (``on 8 May, 2023``, ``(May 20, 2023)``)."""
    return re.sub(r"\s{2,}", " ", _DATE_IN_TEXT.sub("", text)).strip()


def split_message(text: str, *, over: int = SPLIT_OVER, parts: int = MAX_PARTS) -> list[str]:
    """Sentences of a long ``text`` grouped into up to ``parts`` messages of similar length;
    a short text, or one sentence, stays whole."""
    if len(text) <= over:
        return [text]
    sentences = _SENTENCE_END.split(text)
    if len(sentences) < 2:
        return [text]
    n = min(parts, len(sentences), max(2, len(text) // over))
    target = len(text) / n
    out: list[str] = []
    current = ""
    for s in sentences:
        if current and len(current) >= target and len(out) < n - 1:
            out.append(current)
            current = s
        else:
            current = f"{current} {s}" if current else s
    out.append(current)
    return out


def _typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word) - 1)
    if rng.random() < 0.5:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    return word[:i] + word[i + 1:]


def informal(text: str, key: str) -> str:
    """Chat-style casing, spellings and typos, decided by ``key`` (deterministic)."""
    rng = _rng("informal", key)

    def respell(m: re.Match[str]) -> str:
        word = m[0]
        low = word.lower()
        if low in SLANG and rng.random() < SLANG_RATE:
            return SLANG[low]
        if len(word) >= 4 and word.isalpha() and rng.random() < TYPO_RATE:
            return _typo(word, rng)
        return word

    out = _WORD.sub(respell, text)
    out = re.sub(r"\bI\b", "i", out)
    if out.endswith(".") and not out.endswith(".."):
        out = out[:-1]
    if rng.random() < LOWER_ALL_RATE:
        return out.lower()
    return out[:1].lower() + out[1:]


def realchat_turns(turn: Turn) -> list[Turn]:
    """One LoCoMo turn as the chat messages a person would have sent."""
    body = strip_speaker(turn.text, turn.speaker)
    photo = _PHOTO.search(body)
    caption = photo[1] if photo else ""
    body = drop_dates(body[: photo.start()] if photo else body)
    pieces = split_message(body) if body else []
    texts = [informal(p, f"{turn.dia_id}/{i}") for i, p in enumerate(pieces)]
    if caption:
        texts = texts[:-1] + [f"{texts[-1]} {caption}".strip()] if texts else [caption]
    return [replace(turn, text=t) for t in texts if t.strip()]


def realchat(conversations: list[Conversation]) -> list[Conversation]:
    """Every conversation as real-chat-looking messages (see the module docstring)."""
    out = []
    for c in conversations:
        turns = [m for t in c.turns for m in realchat_turns(t)]
        known = {t.dia_id for t in turns}
        questions = [q for q in c.questions if set(q.evidence) & known]
        out.append(replace(c, id=c.id, turns=turns, questions=questions))
    return out


def realchat_noisy(conversations: list[Conversation]) -> list[Conversation]:
    """:func:`realchat` with reactions between messages (see the module docstring); a
    reaction's dialogue id is its message's with ``~r`` appended, never an evidence id."""
    out = []
    for c in realchat(conversations):
        speakers = list(dict.fromkeys(t.speaker for t in c.turns))
        turns: list[Turn] = []
        for i, t in enumerate(c.turns):
            turns.append(t)
            rng = _rng("reaction", c.id, t.dia_id, str(i))
            others = [s for s in speakers if s != t.speaker]
            if others and rng.random() < REACTION_RATE:
                turns.append(replace(t, dia_id=f"{t.dia_id}~r{i}", speaker=others[0],
                                     text=rng.choice(REACTIONS)))
        out.append(replace(c, turns=turns))
    return out
