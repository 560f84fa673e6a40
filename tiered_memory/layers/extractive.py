"""What the layers do without an LLM, by rules (pure functions).

Episode summaries are the most salient sentences of a session, with named
entities, ids, numbers and dates found by regular expressions. Fact candidates
come from first-person patterns of user messages ("I live in ...", "I'm allergic
to ...", "my wife ...", "we decided ..."). Everything produced here is marked
``{"method": "extractive"}`` by the layers, so nobody mistakes it for model output.

Whose words the rules read is chosen here, once (:data:`QUOTED_ROLES`, :data:`NAMED_ROLES`,
:data:`FACT_ROLES`), for every caller: a system message is the app's instructions to its
model, not what was said; a tool's output is data, listed by its names, never quoted.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Sequence

from ..graphemes import cut_point
from ..recall.query import STOPWORDS, keywords
from ..types import StoredMessage
from ..records import EpisodeDraft, FactCandidate
from ..slots import DIETS, RELATIONS, normalize_key

# where a sentence may end: a line break; a full-width mark (Chinese, Japanese: no space follows)
# with its closing quotes or brackets; or, where the next sentence starts (:func:`sentences`), the
# space after a mark (. ! ? and the Arabic, Urdu, Devanagari and Armenian ones)
_BREAK = re.compile(r"(?P<line>\n+)|(?P<wide>[\u3002\uff01\uff1f\uff61][\u300d\u300f\u201d\u2019\uff09)\]]*\s*)"
                    r"|(?<=[.!?\u061f\u06d4\u0964\u0965\u0589])(?P<mark>\s+)")
_OPENING = "\"'([\u00bf\u00a1\u00ab\u201c\u2018\u300c\u300e"


def _upper_class() -> str:
    """A character class body of the capital letters of the Basic Multilingual Plane (``A-Z``,
    ``ÄÖÜ``, ``А-Я``, ``Α-Ω``...), as ranges."""
    ranges: list[tuple[int, int]] = []
    for code in range(0x10000):
        if chr(code).isupper() and not 0xD800 <= code < 0xE000:
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


_UPPER = _upper_class()
_CAPITALISED = rf"[{_UPPER}](?:[^\W_]|['&-])+"  # in any alphabet: "Zürich", "Москве", "O'Brien"
# the space before a name's next word is one run (a connecting word, then its own run): "\s+(?:of)?\s*"
# split a long run of spaces every way before failing, time quadratic in its length
_ENTITY = re.compile(rf"\b{_CAPITALISED}(?:\s+(?:(?:of|de|da|van|von|the)\s+)?{_CAPITALISED})*")
# where a sentence starts, past any opening quote or bracket (find_entities)
_INITIAL = re.compile(r"^[\s\"'(\u00bf\u00a1\u00ab\u201c]*|(?:[.!?\u2026]\s+|\n+)[\"'(\u00bf\u00a1\u00ab\u201c]*")
# words of English that other languages written in Latin letters seldom use as words
_ENGLISH = frozenset("the and is are to of you it that with for this have was my we i i'm he she they on at but"
                     " be not what".split())
ENGLISH_SHARE = 0.15  # chat in English: a fifth to a half of its words are these; German, Spanish: under a twentieth
_ID = re.compile(
    r"\b(?:[A-Z]{2,}[-_]\d+|[A-Za-z]+-\d{2,}|[0-9a-f]{8,}(?:-[0-9a-f]{4,})*)\b|(?<!\w)#\d+\b"
    # an address starts where its run of name characters does: tried at each character of a long
    # run without "@" ("AAAA...", "a-a-a-..."), each try read to the run's end, time quadratic in it
    r"|(?<![\w.+-])[\w.+-]+@[\w-]+\.[\w.]+|https?://\S+")
_NUMBER = re.compile(r"(?<![\w.])[$€£]?\d+(?:[.,]\d+)*(?:\s?(?:%|k|kg|km|mb|gb|ms|s|h|usd|eur))?(?![\w])", re.I)
_MONTHS = ("january|february|march|april|may|june|july|august|september|october|november|december|"
           "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec")
_DATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    rf"|\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b(?:\s+\d{{4}})?"
    r"|\b(?:next|last|this)\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|week|month|year)\b"
    r"|\b(?:today|tomorrow|yesterday|tonight)\b",
    re.I)
_COMMON_CAPS = frozenset(
    "I I'm I'll I've I'd The A An And But So Yes No Ok Okay Sure Thanks Thank Hi Hello Hey Please "
    "What When Where Why How Who Which Can Could Would Should Will Do Does Did Is Are It It's This That "
    "We We're Let's Let My You Your Also Then Great Good Maybe Just Here There Also If Not Nice Noted Got "
    "Sounds Perfect Absolutely Certainly Awesome Cool Right Well First Next Finally Now Today Tomorrow "
    "Yesterday Sorry Use Note Done Welcome Hmm Oh Wow Alright Exactly Indeed Correct True".split())


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, in order (pure). After a space-followed mark, a sentence starts
    with a letter or digit that is not lower case, after any opening quote or bracket: "e.g.
    this" goes on, "Привет. Как", "Hola. ¿Cómo" and "سأسافر. هل" (a script without case) end;
    no space follows "。", so none is asked for there."""
    out: list[str] = []
    start = 0
    for found in _BREAK.finditer(text):
        if found.lastgroup == "mark" and "\n" not in found.group(0):
            first = text[found.end():found.end() + 2].lstrip(_OPENING)[:1]
            if not first.isalnum() or first.islower():
                continue
        out.append(text[start:found.end()])
        start = found.end()
    out.append(text[start:])
    return [s.strip() for s in out if len(s.strip()) > 1]


def reads_english(text: str) -> bool:
    """Whether ``text`` reads as English (pure): at least :data:`ENGLISH_SHARE` of its words are
    common English ones (:data:`_ENGLISH`), or it has too few words (under four) to tell."""
    said = re.findall(r"[^\W\d_]+(?:'[a-z]+)?", text.lower())
    return len(said) < 4 or sum(w in _ENGLISH for w in said) >= ENGLISH_SHARE * len(said)


def find_entities(text: str) -> list[str]:
    """Capitalised names, in any alphabet, in order, no repeats. A lone capitalised word that
    starts a sentence counts unless it is a common sentence opener ("Nice", "Sure",
    "Understood", adverbs...), and never in a text that does not read as English
    (:func:`reads_english`): "Wir", "Heute", "Hoy" open a sentence there, and no list of
    English openers knows them."""
    out: dict[str, None] = {}
    initial: set[int] = {m.end() for m in _INITIAL.finditer(text)}
    english = reads_english(text)
    for m in _ENTITY.finditer(text):
        word = m.group(0)
        if m.start() in initial and " " not in word and (not english or
                word in _COMMON_CAPS or word.lower() in STOPWORDS or word.lower().endswith(("ly", "ed", "ing"))):
            continue
        words = [w for w in word.split() if w not in _COMMON_CAPS]
        name = " ".join(words).strip(" '-")
        if name and (not name.isupper() or 2 <= len(name) <= 6):
            out.setdefault(name, None)
    return list(out)


def find_ids(text: str) -> list[str]:
    return list(dict.fromkeys(m.group(0).rstrip(".,);") for m in _ID.finditer(text)))


def find_numbers(text: str) -> list[str]:
    return list(dict.fromkeys(m.group(0).strip() for m in _NUMBER.finditer(text)))


def find_dates(text: str) -> list[str]:
    return list(dict.fromkeys(m.group(0) for m in _DATE.finditer(text)))


MIN_CONTENT_WORDS = 3  # a sentence with fewer says little ("That's cool, Jon!"); used only if none has more
UBIQUITOUS_SHARE = 0.3  # a word in more messages than this (a speaker's name, "user") does not mark a topic
_SPEAKER = re.compile(r"^[A-Z][\w'.-]*(?: [A-Z][\w'.-]*)?:\s")  # "Gina: ..." in a transcript
_PHATIC = frozenset(w.lower() for w in _COMMON_CAPS) | frozenset(
    "thank thx lol haha yeah yep yup glad love lovely amazing fantastic wonderful sounds sound fun happy".split())


def salient_sentences(texts: Sequence[str], k: int = 3) -> list[str]:
    """``k`` sentences that together cover the session's most recurrent content words, ids,
    numbers and dates, in their original order (a SumBasic-style greedy pick, pure).

    A word found in more than :data:`UBIQUITOUS_SHARE` of the messages (of five or more) marks
    no topic: in a chat it is a speaker's name, and counting it (or "thanks", "great") made
    the most phatic lines the most "salient"; a leading "Name: " is not counted either, and a
    sentence from the middle of such a message keeps it. Once a sentence is picked, its
    words count half, so the next pick covers something else."""
    said: dict[str, None] = {}  # each sentence once, with its message's speaker label when it lost it
    for t in texts:
        label = _SPEAKER.match(t)
        for s in sentences(t):
            said.setdefault(s if label is None or s.startswith(label.group(0)) else label.group(0) + s, None)
    all_sents = list(said)
    if not all_sents:
        return []
    in_texts = Counter(w for t in texts for w in set(keywords(t)))
    common = _PHATIC | {w for w, n in in_texts.items() if len(texts) >= 5 and n > UBIQUITOUS_SHARE * len(texts)}
    words = [frozenset(keywords(_SPEAKER.sub("", s))) - common for s in all_sents]
    spread = Counter(w for ws in words for w in ws)
    freq: dict[str, float] = {w: float(n) for w, n in spread.items()}
    bonus = [len(find_ids(s)) + len(find_dates(s)) + 0.5 * len(find_numbers(s))
             + 0.5 * len([e for e in find_entities(s) if e.lower() not in common]) for s in all_sents]
    pool = [i for i, ws in enumerate(words) if len(ws) >= MIN_CONTENT_WORDS] or list(range(len(all_sents)))

    def score(i: int) -> float:
        if not words[i]:
            return float(bonus[i])
        base = sum(freq[w] for w in words[i]) / math.sqrt(len(words[i]))
        return (base + bonus[i]) * (0.5 if all_sents[i].rstrip().endswith("?") else 1.0)

    best: list[int] = []
    while pool and len(best) < k:
        pick = max(pool, key=lambda i: (score(i), -i))
        best.append(pick)
        pool.remove(pick)
        for w in words[pick]:
            freq[w] /= 2
    return [all_sents[i] for i in sorted(best)]


_DECISION = re.compile(
    r"\b(?:we|i)\s+(?:have\s+)?(?:decided|agreed|chose|settled on|will go with)\b|\blet'?s go with\b"
    # the noun where it states one ("Decision: ...", "the decision was to ...", "made the decision
    # to ..."), not wherever it stands ("a tough decision", "we haven't made a decision")
    r"|\bdecision\s*:|\bdecision (?:is|was) to\b|\bmade (?:a|the|our) decision to\b|\bwe'll use\b", re.I)
# a word just before the speaker that makes what follows asked or supposed, not said: "Do I like
# jazz?", "Have we decided on the venue?", "If I live in Canada, ...", "not sure whether we agreed"
_ASKED = re.compile(r"\b(?:do|does|did|would|should|could|can|will|shall|might|must|have|has|had|am|are|were"
                    r"|if|unless|whether)\s+$", re.I)
# a sentence that says there is no decision ("No decision yet", "we decided nothing")
_UNDECIDED = re.compile(r"\bno decision\b|\b(?:not|never|un)\s*decided\b|\bdecided (?:nothing|anything)\b"
                        r"|\b(?:haven't|hasn't|have not|has not)\s+(?:decided|agreed)\b", re.I)


def said(sentence: str, found: re.Match[str]) -> bool:
    """Is what a rule found in ``sentence`` stated, not asked or supposed (pure)?"""
    return _ASKED.search(sentence[:found.start()]) is None


def asked(sentence: str) -> bool:
    """Does ``sentence`` end as a question ("Let's go with Lisbon?", "So we agreed on Friday?")
    (pure)? A decision put as one is proposed or checked, not made."""
    return sentence.rstrip(" \"')]\u00bb\u201d\u2019").endswith(("?", "\uff1f"))


def decided(sentence: str) -> bool:
    """Does ``sentence`` state a decision (pure)? Not a question about one, nor "no decision yet"."""
    found = _DECISION.search(sentence)
    return (found is not None and said(sentence, found) and _UNDECIDED.search(sentence) is None
            and not asked(sentence))


_TODO = re.compile(r"\b(?:todo|to do|need to (?:figure out|check|find out|decide)|open question|not sure)\b", re.I)


MAX_SENTENCE_CHARS = 300  # a "sentence" past this is a paste (a log, code): its start stands for it


def clip(sentence: str, limit: int = MAX_SENTENCE_CHARS) -> str:
    """``sentence``, or its first ``limit`` characters cut at a word, marked with an ellipsis (pure);
    never inside an emoji sequence or a letter and its accent (:func:`~..graphemes.cut_point`)."""
    if len(sentence) <= limit:
        return sentence
    cut = sentence[:cut_point(sentence, limit - 1)]
    return (cut.rsplit(None, 1)[0] if " " in cut.strip() else cut).rstrip() + "\u2026"


#: whose sentences an episode quotes (summary, decisions, key facts): the conversation. A quoted
#: sentence shows without its speaker ("Relevant past sessions"), so an app's system prompt
#: ("You are Ava", "Always answer in French") would read as said in the session, and a tool's
#: output (a page, a record, JSON) as said by someone; the assistant's reply says what it used
QUOTED_ROLES = frozenset({"user", "assistant"})
#: whose names and ids an episode lists: a tool's too (what a lookup returned is the session's
#: data), after the conversation's own; never a system prompt's
NAMED_ROLES = QUOTED_ROLES | {"tool"}
#: whose first-person statements become facts about the user, and whose questions are open
FACT_ROLES = frozenset({"user"})
#: an episode's summary when the session has no sentence to quote (only system or tool messages)
NOTHING_SAID = "No conversation to summarise: only system or tool messages."


def read_by(messages: Sequence[StoredMessage], roles: frozenset[str]) -> list[StoredMessage]:
    """The ``messages`` of ``roles``, in order (pure); a role outside them, one other code stored
    included, is not read."""
    return [m for m in messages if m.role in roles]


MAX_ENTITIES = 20  # an episode's entities, and of each of its other lists at most MAX_POINTS (an LLM's too)
MAX_POINTS = 10


def extract_episode(messages: Sequence[StoredMessage], *, max_summary_sentences: int = 3) -> EpisodeDraft:
    """An episode from rules: salient sentences, entities, decisions, open questions, key facts.
    Each sentence it quotes is clipped (:func:`clip`): a session of one long paste would otherwise
    be summarised as the whole paste, which no context budget holds. Sentences are quoted from
    :data:`QUOTED_ROLES` only, names and ids listed from :data:`NAMED_ROLES`."""
    spoken = read_by(messages, QUOTED_ROLES)
    texts = [m.content for m in spoken]
    joined = "\n".join(texts)
    summary = " ".join(clip(s) for s in salient_sentences(texts, k=max_summary_sentences))
    data = "\n".join(m.content for m in read_by(messages, NAMED_ROLES - QUOTED_ROLES))
    named = find_entities(joined) + find_ids(joined) + find_entities(data) + find_ids(data)
    entities = list(dict.fromkeys(clip(e) for e in named))[:MAX_ENTITIES]
    decisions = list(dict.fromkeys(clip(s) for t in texts for s in sentences(t) if decided(s)))[:MAX_POINTS]
    questions: list[str] = []
    for i, m in enumerate(spoken):
        if m.role not in FACT_ROLES:
            continue
        answered = any(n.role == "assistant" for n in spoken[i + 1:])
        for s in sentences(m.content):
            if (s.endswith("?") and not answered) or _TODO.search(s):
                questions.append(clip(s))
    key_facts = [c.text for c in extract_fact_candidates(messages)]
    key_facts += [clip(s) for s in sentences(joined) if (find_dates(s) or find_ids(s)) and s not in key_facts]
    return EpisodeDraft(summary=summary or clip(joined) or NOTHING_SAID, entities=entities, decisions=decisions,
                        open_questions=list(dict.fromkeys(questions))[:MAX_POINTS],
                        key_facts=list(dict.fromkeys(key_facts))[:MAX_POINTS])


_OBJ = r"(?P<x>[^.!?\n;]{2,80}?)"
_NAME = r"(?P<x>[A-Z][\w'-]+(?:\s+[A-Z][\w'-]+){0,2})"
_PLACE = r"(?P<x>[A-Z][\w'-]+(?:(?:\s+|,\s*)(?:de |da |do )?[A-Z][\w'-]+){0,3})"
# where an object ends: a sentence mark, a clause joined by a conjunction, a new clause after a
# comma ("all the yellow leaves, it looks...") or a dash ("assistant manager- it's like...")
_END = (r"(?=\s+(?:now|anymore|these days|lately|a lot|very much|so much|too)\b|[.!?;\n]|,\s*(?:but|and|so)\b"
        r"|\s+(?:and|but|so|because)\s|,\s*(?:it|it's|that|that's|this|which|they|they're|i|i'm|we|he|she"
        r"|you|do|does|did|don't|isn't|aren't|right)\b"
        r"|\s*[-\u2013\u2014]\s|$)")
_RULES: list[tuple[str, re.Pattern[str], str, str, int]] = [
    # (type, pattern, text template, key template, polarity)
    ("fact", re.compile(rf"\b[Mm]y name is {_NAME}"), "User's name is {x}", "name", 1),
    ("fact", re.compile(rf"\b[Cc]all me {_NAME}"), "User's name is {x}", "name", 1),
    ("fact", re.compile(rf"\bI (?:live|am living|'m living) in {_PLACE}"), "User lives in {x}", "residence", 1),
    ("fact", re.compile(rf"\bI (?:just |recently )?moved to {_PLACE}"), "User lives in {x}", "residence", 1),
    ("fact", re.compile(rf"\bI work (?:at|for) {_PLACE}"), "User works at {x}", "employer", 1),
    ("fact", re.compile(rf"\bi(?: am|'m) (?P<a>an?) {_OBJ}{_END}", re.I), "User is {a} {x}", None, 1),  # type: ignore[list-item]
    ("constraint", re.compile(rf"\bi(?: am|'m) allergic to {_OBJ}{_END}", re.I), "User is allergic to {x}", "allergy:{x}", 1),
    ("constraint", re.compile(rf"\bi (?:can't|cannot|can not|don't|do not|never) eat {_OBJ}{_END}", re.I), "User does not eat {x}", "diet:{x}", 1),
    ("constraint", re.compile(rf"\bi(?: am|'m) (?P<x>{DIETS})\b", re.I), "User is {x}", "diet:{x}", 1),
    ("preference", re.compile(rf"\bi (?:really )?(?:don't|do not) like {_OBJ}{_END}", re.I), "User dislikes {x}", "pref:{x}", -1),
    ("preference", re.compile(rf"\bi (?:really )?(?:hate|dislike|can't stand|cannot stand) {_OBJ}{_END}", re.I), "User dislikes {x}", "pref:{x}", -1),
    ("preference", re.compile(rf"\bi (?:really )?(?:like|love|enjoy|adore) {_OBJ}{_END}", re.I), "User likes {x}", "pref:{x}", 1),
    ("preference", re.compile(rf"\bi (?:usually |really |would )?prefer {_OBJ}{_END}", re.I), "User prefers {x}", "prefer:{x}", 1),
    ("preference", re.compile(rf"\bmy favou?rite (?P<what>[a-z ]{{2,30}}?) is {_OBJ}{_END}", re.I), "User's favourite {what} is {x}", "favourite:{what}", 1),
    ("relationship", re.compile(
        rf"\b[Mm]y (?P<rel>{RELATIONS})(?:'s name)?(?:\s+(?:is\s+)?(?:named|called)|\s+is|,)?\s+(?P<x>[A-Z][\w'-]+(?: [A-Z][\w'-]+)?)"),
        "User's {rel} is {x}", "rel:{rel}", 1),
    ("decision", re.compile(rf"\bwe (?:have )?(?:decided|agreed) (?:to |on |that )?{_OBJ}{_END}", re.I), "Decided: {x}", None, 1),  # type: ignore[list-item]
    ("decision", re.compile(rf"\blet'?s go with {_OBJ}{_END}", re.I), "Decided: go with {x}", None, 1),  # type: ignore[list-item]
]


_FIRST_PERSON = {"my": "their", "me": "them", "mine": "theirs", "myself": "themselves", "i": "they",
                 "i'm": "they're", "i've": "they've", "i'll": "they'll", "i'd": "they'd"}
_FIRST_PERSON_WORD = re.compile(r"\b(?:" + "|".join(sorted(map(re.escape, _FIRST_PERSON), key=len, reverse=True))
                                + r")\b(?!')", re.I)


def third_person(text: str) -> str:
    """The user's own words about themselves as said of "User": "running my own studio" ->
    "running their own studio" (pure)."""
    return _FIRST_PERSON_WORD.sub(lambda m: _FIRST_PERSON[m.group(0).lower()], text)


_PRONOUNS = frozenset("it that this them these those him her one there here so".split())


_DANGLING = frozenset("of to a an the for with in on at from by about as and or but than that this it them".split())


def dangling(obj: str, *, name: bool = False) -> bool:
    """Does a rule's object stop where its sentence cannot (pure)? On a word that needs one
    after it ("a part of", "a huge fan of it"), or, for a ``name``, on a possessive ("my
    daughter is Sara's age": a shop may be called "Trader Joe's", a daughter not)."""
    words = obj.lower().split()
    return not words or words[-1] in _DANGLING or (name and words[-1].endswith(("'s", "\u2019s")))


def extract_fact_candidates(messages: Sequence[StoredMessage]) -> list[FactCandidate]:
    """Rule-based fact candidates from the user's messages (:data:`FACT_ROLES`; first person
    only), in order: a system prompt's "my name is Ava" is the app's, a tool's the tool's."""
    out: dict[str, FactCandidate] = {}
    for m in read_by(messages, FACT_ROLES):
        for sent in sentences(m.content):
            for ftype, pattern, template, key_t, polarity in _RULES:
                for found in pattern.finditer(sent):
                    if not said(sent, found) or (ftype == "decision" and (_UNDECIDED.search(sent) or asked(sent))):
                        continue  # "Do I like jazz?", "If I live in Canada", "We decided nothing yet", "Let's go with X?"
                    groups = {k: v.strip().rstrip(",") for k, v in found.groupdict().items() if v}
                    if "a" in groups:  # the article said ("I'm An engineer"), as it goes mid-sentence
                        groups["a"] = groups["a"].lower()
                    if not groups.get("x") or groups["x"].lower() in _PRONOUNS:
                        continue  # "I love it": the object is elsewhere; a rule cannot resolve it
                    if dangling(groups["x"], name=ftype == "relationship"):
                        continue  # "I'm a part of": the sentence went on where the rule cannot follow
                    text = template.format(**{k: third_person(v) for k, v in groups.items()})
                    key = normalize_key(key_t.format(**groups)) if key_t else None
                    out.setdefault(text.lower(), FactCandidate(
                        type=ftype, text=text, confidence=0.6, source_ids=(m.id,), key=key,
                        polarity=polarity))
    return list(out.values())
