"""Names that the grammar of a casual message puts in a person's place: the subject of a
verb ("what if jake loses the card", "i think todd stole my card", "brad keeps using my
card"), the subject of a question ("can paige use my card", "did wes get the money"), the
first object of a verb of giving ("i gave eve my old card") and a name said to the reader
("ok ben thanks").

What: ``clause_name_spans(text)`` returns the PERSON spans of these clauses. The
word must be a first name somewhere (best rank 1000 or better in the shipped name table)
and rare enough in English (Zipf under 4.7: "jake", "todd", "ben", not "bill", "mark",
"will", "june") and no common English word ("grace", "pin", "visa": any word the
lexicon holds in lower case), never a function word, a bank, a place or a month; the
grammar is read from the same lexicon, ``pii/data/lexicon.tsv.gz`` (``tools/pii_lexicon.py``
trims it from lemminflect's):

* *subject*: at the message's start, after a pause (",", ".", "!", "?", ";", ":"),
  after a word that opens a clause ("if", "that", "think", "so", "and", "ok", ...) or
  after a noun for a person ("babysitter paige needs paying"), and
  followed (maybe after one adverb: "just", "never", "accidentally") by a finite verb: an
  auxiliary ("is", "can't", "didn't") or a 3rd person singular or past form ("loses",
  "stole", "got"; "needs" and "keeps", also nouns, count too);
* *question*: after an auxiliary that opens a clause ("can", "does", "did", "is", "has")
  and before a verb that is no noun ("allowed", "get", "seen") or any verb with its object
  ("use my card");
* *first object*: after a verb of giving ("gave", "sent", "lent", "bought", "show") and
  before a determiner ("my", "the", "a", "some", "back");
* *added*: after "add", "remove", "authorise" and before "to" or "as" ("add megan to my
  account");
* *apposition*: between commas after a noun for a person ("the plumber, wes, wants cash");
* *address*: after "ok", "thanks", "cheers", "lol", ... and before a pause, the message's
  end or a sign-off ("ok ben thanks"); after a greeting and before "here", "speaking", a
  comma or the end ("hey, dylan here"); right after the greeting that opens a message
  ("hello jake can you help");
* *talked to*: after "spoke to", "talked with", "met with" ("spoke to jake yesterday");
* *speaker*: before a colon at a line's start ("jake: hi, i need help");
* *relation after*: before "(my son)", ", my brother," ("jake (my son) needs a card");
* *cued* (``_cued_names``): any name, one the name table does not hold too, right after
  a verb of saying ("said elbek", "said bela to wes"), a role ("producer nate p. sage",
  "tennis player aislinn de meer"), "featuring", "my kid", "was called", before "'s
  kid" ("waltruda's kid"); a name the table holds after "directed by", "it's
  under", "change it to", "add ... as", "had given ... his", or between a comma and a
  sentence's end ("don't go to town, megan!"); each with the family name and middle
  initials after it.

The most common given names ("john", "mary": Zipf 4.7 and more, though no English word)
are candidates too (``_COMMON_GIVEN``).

Why rules: the token model learns a name's context from the words around it in its
training data; a verb it has not seen ("loses", "stole") says nothing to it, while the
grammar does for any verb of the lexicon. Written from English grammar and the project's
own probes, not from the evaluation sets (docs/BENCHMARKS.md says how they were scored).
"""

from __future__ import annotations

import functools
import gzip
import re
from pathlib import Path

from pii.addresses import _country_names
from pii.casing import Words, _is_caseless, message_words
from pii.model import _NEVER_NAMES, table
from pii.phrases import _POSS, _RELATION_SET

LEXICON = Path(__file__).resolve().parent / "data" / "lexicon.tsv.gz"

# Words after which a clause starts: its subject follows.
_OPENERS = frozenset("""
if when whenever because cause cuz cos coz since until unless that though although while
think thought know knew guess believe suspect sure wonder wondering maybe perhaps so and
but or ok okay lol yes yeah yep no nope why how where then now also plus apparently cuz
yesterday today tonight tomorrow earlier later recently
""".split())
# Finite auxiliaries and modals: "jake is", "todd can't", "wes didn't".
_AUX = frozenset("""
is was has had does did can could will would should may might must isn't wasn't hasn't
hadn't doesn't didn't can't cannot couldn't won't wouldn't shouldn't isnt wasnt hasnt
doesnt didnt cant couldnt wont wouldnt shouldnt
""".split())
# Auxiliaries that open a question: "can paige use my card", "did wes get it".
_INVERTING = frozenset("can could does did will would should is was has may might".split())
# Adverbs between a subject and its verb: "jake just sent", "todd never got".
_ADVERBS = frozenset("""
just still never always already also accidentally actually apparently finally really only
probably definitely mistakenly somehow again even
""".split())
# Verbs whose first object is the person given to: "i gave eve my old card".
_GIVING = frozenset("""
give gives gave giving send sends sent sending lend lends lent lending show shows showed
buy buys bought hand handed handing pass passed offer offered promise promised wire wired
pay pays paid paying refund refunds refunded owe owes owed transfer transferred
""".split())
# Verbs of talking, before "to" or "with" and the person: "spoke to jake yesterday".
_TALKING = frozenset("""
spoke speak speaks speaking talk talks talked talking chat chats chatted chatting met meet
meeting dealt deal dealing
""".split())
# What starts the second object: "gave eve *my* card", "sent ben *the* money".
_OBJECT_START = frozenset("my the a an his her our their your some any this that back".split())
# Words after which a verb's object follows: "use *my* card", "get *the* money".
_OBJECTS = _OBJECT_START | frozenset("me it us them him money cash".split())
# Said to the reader: "ok ben thanks", "thanks tom", "lol ok sue".
_ADDRESS_BEFORE = frozenset("ok okay thanks thx ty cheers bye lol haha cool great perfect".split())
_ADDRESS_AFTER = frozenset("thanks thank thx ty cheers bye".split())
# Nouns for a person: before a name as a title ("babysitter paige needs paying"), or in
# apposition ("the plumber, wes, wants cash").
_PERSON_NOUNS = _RELATION_SET | frozenset("""
plumber electrician builder gardener driver accountant lawyer solicitor doctor dentist
tutor teacher coach mechanic contractor decorator handyman cleaner caretaker housekeeper
assistant secretary advisor adviser agent client customer tenant lodger student pupil
""".split())
# Verbs that put a person on an account: "add paige to my account", "add wes as a user".
_ADDING = frozenset("add adding added remove removing removed authorise authorize".split())
_GREETINGS = frozenset("hi hey hello hiya yo".split())
# Words the name table holds as given names somewhere that are something else in a
# message: banks, payment networks and brands ("chase refunds", "swift transfers take",
# "sony charged me"); places, peoples, faiths ("sydney is", "irish banks"); months and
# days ("jan", "mon"); chat and old words ("kinda", "haha", "thee"); amounts ("max is 500").
_NOT_PERSONS = frozenset("""
chase ally wells citi swift sepa bacs chaps sony nike mercedes fifa nato cia isis manga
etf ira isa
asia iran sydney francisco hong kong carolina jordan roman santa dallas berlin melbourne
singapore chelsea rio cleveland brooklyn denver barcelona phoenix maine costa kenya sri
richmond dublin milan denmark orlando adelaide nebraska stanford vienna venice jamaica
ghana penn yemen panama alberta brighton nepal libya wellington geneva florence virginia
georgia madrid hindu muslim islam irish swiss danish afghan mediterranean nazi
jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu thur thurs fri sat sun
kinda haha bro thee unto amid amen que est gal mic med gen del ave les von hon min max
mac alpha venus destiny rand ria lira yen
""".split())
# Function words and other words the table holds as rare given names: never a subject here.
# Its own list, not the phrase rules' wider ``_STOP``: that one also holds currency codes
# that are given names ("ron", the Romanian leu's code), which a verb's subject is not;
# taking it changed a held-back detection (2026-12-07).
_STOP = frozenset("""
i me my you your he him his she her we us our they them their it its this that these those
there here who what which when where why how all any some each every no not one none
please pls ok okay yes yeah no lol thanks hi hey hello bye sir madam man guys
ive im ill id hes shes youre theyre thats whats dont wont cant isnt
""".split())
_PAUSES = ",.!?;:"
_PAUSE_SET = frozenset(_PAUSES)


# Given names so common that their Zipf in English is 4.7 or more, though no English word
# ("john" 5.4): grammar candidates too, beside the rarer names ``_candidate`` passes.
_COMMON_GIVEN = frozenset("""
john david james michael george paul william robert thomas chris richard joe mary charles
henry scott steve louis peter daniel sarah
""".split())


@functools.cache
def lexicon() -> dict[str, str]:
    """A lower-case English word form -> its tags: Z (VBZ), D (VBD), N (VBN), G (VBG), B
    (VB) for a verb's forms; n, a, r, x for a noun, adjective, adverb, auxiliary."""
    out = {}
    with gzip.open(LEXICON, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or line.startswith("form\t"):
                continue
            form, tags = line.rstrip("\n").split("\t")
            out[form] = tags
    return out


@functools.cache
def _lexicon_words() -> frozenset[str]:
    return frozenset(lexicon())


def _candidate(low: str) -> bool:
    """A first name somewhere (rank 1000 or better), under Zipf 4.7 in English and no
    common English word (not in the lexicon: "jake", not "grace", "pin" or "visa"), no
    function word or bank."""
    if len(low) < 3 or low in _STOP or low in _NOT_PERSONS or low in lexicon() or "-" in low:
        return False
    if low in _country_names():
        return False
    hit = table().get(low)
    return hit is not None and 0 < hit[0] <= 1000 and (hit[2] < 4.7 or low in _COMMON_GIVEN)


def _finite(w: str) -> bool:
    if w in _AUX:
        return True
    tags = lexicon().get(w, "")
    return "Z" in tags or "D" in tags


def _verb(w: str, nxt: str) -> bool:
    """A verb after a question's subject: one that is no noun ("allowed", "seen"), or any
    verb before its object ("use my card")."""
    tags = lexicon().get(w)
    if not tags or w in _AUX:
        return False
    return "n" not in tags or nxt in _OBJECTS


@functools.cache
def _candidates() -> tuple[frozenset[str], frozenset[str]]:
    """The words ``_candidate`` passes, and the given names that are common English words
    (``_WORD_NAMES``), for a set test on a message's words (``_candidate``'s tests, inline:
    this runs over the whole name table once per process); and those with the words a cue
    of ``_cued_names`` is read after (one set test for the messages that hold neither)."""
    lex, countries = lexicon(), _country_names()
    cands = _WORD_NAMES | frozenset(
        w for w, (first, _, zipf) in table().items()
        if 0 < first <= 1000 and (zipf < 4.7 or w in _COMMON_GIVEN) and len(w) >= 3 and "-" not in w
        and w not in _STOP and w not in _NOT_PERSONS and w not in lex and w not in countries
    )  # fmt: skip
    return cands, cands | _CUE_TRIGGERS


# Given names in English that are common words too ("will", "mark", "hope"): a name only
# where the word's other readings cannot stand: the subject of a verb only people do ("will
# said", "mark told me"), the object of one before what is told ("tell mark the money is
# there", "ask will about it"), and after thanks and a comma at the end ("thanks, will").
# Not the words a bank's customer writes of things ("bill says 40 is due", "chip works
# now", "sky charged me twice"): "bill", "chip", "sky", "rich" are left to the model.
_WORD_NAMES = frozenset("""
will mark hope june april grace rose jack joy faith summer dawn ray frank guy art pat sue
rob nick hunter autumn ivy lily daisy holly iris violet ruby amber pearl crystal drew penny
sunny gene jean miles lance wade chuck dean earl carol christian harry jade hazel heather
robin sandy glen cliff bob
""".split())
# Verbs only people (and pets) do, in a finite form: "will said", "hope told me".
_PERSON_VERBS = frozenset("""
said says told tells asked asks wants wanted thinks thought knows knew stole steals
borrowed borrows lent lends owes owed promised promises texted texts called calls emailed
emails messaged helped helps forgot forgets lives lived works worked loves loved hates
hated agreed agrees refused refuses claims claimed insists insisted mentioned mentions
suggested suggests reckons reckoned
""".split())
# Verbs whose object is the person told: "tell mark the money is there", "ask will about".
_TELLING = frozenset("""
tell told telling ask asked asking text texted remind reminded thank thanked email emailed
message messaged
""".split())
# What follows the person told: what is told or asked, or when.
_TOLD_NEXT = frozenset("""
the a an my your his her our about to that if when what how why i we it you for back again
tomorrow later now
""".split())
_THANKS = frozenset("thanks thank thx ty cheers regards bye love".split())
_DETERMINERS = frozenset("the a an this that my your his her our their its".split())


def _word_name(
    text: str, ws: list[str], offs: list[tuple[int, int]], i: int, caseless: bool
) -> bool:
    """Whether word ``i``, a given name that is also a common word ("will", "mark"),
    stands where only a person can (see ``_WORD_NAMES``)."""
    n = len(ws)
    s, e = offs[i]
    if not caseless and not text[s].isupper():
        return False  # in text with case, "will" is the word and "Will" the name
    before = text[offs[i - 1][1] : s] if i else ""
    after = text[e : offs[i + 1][0]] if i + 1 < n else text[e:]
    p1 = ws[i - 1] if i else ""
    nxt = ws[i + 1] if i + 1 < n else ""
    joined = not before.strip()
    if not after.strip() and nxt in _PERSON_VERBS:  # "will said", "so mark told me"
        return not i or any(c in before for c in _PAUSES) or (joined and p1 in _OPENERS)
    if p1 in _TELLING and joined and not after.strip():  # "tell mark the money is there"
        return nxt in _TOLD_NEXT and (i < 2 or ws[i - 2] not in _DETERMINERS)
    return i + 1 == n and p1 in _THANKS and before.strip() == ","  # "thanks, will"


# Words right after which a person's name stands, whatever the name: "said elbek",
# "producer nate p. sage", "tennis player aislinn de meer", "starring ompoly boros".
# A name of any country counts here (one the name table does not hold too), as long as
# it is no English word (``_open_name``).
_SAYING = frozenset("said says asked asks replied replies told tells texted".split())
_ROLE_NOUNS = frozenset("""
player producer commenter director singer songwriter author writer actor actress founder
cofounder ceo chairman chairwoman president manager engineer teacher guardian captain
coach artist painter poet novelist composer drummer guitarist rapper comedian journalist
reporter editor photographer designer architect professor economist spokesman spokeswoman
spokesperson senator governor mayor minister assistant
""".split())
_FEATURING = frozenset("featuring features starring starred feat".split())
_BE = frozenset("is was are were be been being it's its".split())
_CHANGING = frozenset("change changed changing update updated updating correct".split())
# Family names that are English words too, after a name found: "kaya smith", "jo brown".
_WORD_SURNAMES = frozenset("smith brown martin khan lee white green king young hall wood".split())
# A word between a comma and the sentence's end: said to the reader ("see you, megan!").
_VOCATIVE_RE = re.compile(r",[ \t]*[^\W\d_]+[ \t]*[!?.]")
_GIVEN_FORMS = frozenset(("given", "shown", "handed"))
# The words right before a name that ``_cued_names`` reads.
_AFTER_CUE = (
    _SAYING | _ROLE_NOUNS | _FEATURING | _RELATION_SET | _GIVING | _GIVEN_FORMS | _ADDING
    | frozenset(("to", "by", "under", "called"))
)
# Works named after their author: "unlike the Rasmussen novel", "a kasai film".
_WORKS = frozenset("novel novels film films movie movies song songs album albums poem poems memoir biography".split())
_ARTICLES = frozenset(("the", "a", "an"))
# The words around which ``_cued_names`` takes any name, one the table does not hold too.
_STRONG_CUES = _SAYING | _ROLE_NOUNS | _FEATURING | _RELATION_SET | _WORKS | frozenset(("called",))
_CUE_TRIGGERS = (
    _SAYING | _ROLE_NOUNS | _FEATURING | _GIVEN_FORMS | _RELATION_SET | _ADDING | _WORKS
    | frozenset(("by", "under", "called")) | _CHANGING
)


@functools.lru_cache(maxsize=65536)
def _open_name(low: str, unknown_ok: bool) -> bool:
    """A word a cue may put as a name: letters only, a given or family name somewhere (with
    ``unknown_ok`` also a word the name table does not hold: "khasanbek"), no English word
    (the lexicon, or Zipf 4.7 and more in the name table unless a common given name), no
    function word, bank, place or country."""
    if (
        len(low) < 3 or not low.isalpha() or low in _STOP or low in _NOT_PERSONS
        or low in lexicon() or low in _NEVER_NAMES
    ):  # fmt: skip
        return False
    hit = table().get(low)
    if hit is None:
        if not unknown_ok:
            return False
    elif hit[2] >= 4.7 and low not in _COMMON_GIVEN:
        return False
    elif not (hit[0] or hit[1]) and not (unknown_ok and hit[2] < 3.0):
        return False  # an English word only, unless a rare one after a strong cue ("pomeroy")
    return low not in _country_names()


def _surname_next(
    text: str, ws: list[str], offs: list[tuple[int, int]], j: int, caseless: bool
) -> bool:
    """Whether word ``j`` continues a name found before it: after a space (or a middle
    initial's period), a family name or a word the table does not hold, no English word
    but after a middle initial ("nate p. sage"), capitalized in text with case."""
    gap = text[offs[j - 1][1] : offs[j][0]]
    initial_before = offs[j - 1][1] - offs[j - 1][0] == 1
    if gap != " " and not (gap == ". " and initial_before):
        return False
    s, e = offs[j]
    w = ws[j]
    if not caseless and not text[s].isupper():
        return False
    if e - s == 1:  # a middle initial ("nate p. sage", "Greg K Kerr"): a name follows it
        marked = text[e : e + 1] == "." or (not caseless and w not in ("a", "i"))
        return marked and j + 1 < len(ws) and _surname_next(text, ws, offs, j + 1, caseless)
    if initial_before and gap == ". " and w in lexicon():  # any word after "p." ("sage")
        return w.isalpha() and w not in _STOP and w not in _NEVER_NAMES
    return _family_word(w, True)


def _family_word(w: str, unknown_ok: bool) -> bool:
    """A family name somewhere (the commonest also when common in English: "jones"), one
    of the English words that are family names too ("smith"), or with ``unknown_ok`` a word
    the name table does not hold; never a function word."""
    if not w.isalpha() or w in _STOP or w in _NEVER_NAMES:
        return False
    if w in lexicon():
        return w in _WORD_SURNAMES
    hit = table().get(w)
    if hit is None:
        return unknown_ok
    return hit[1] > 0 and (hit[2] < 4.7 or hit[1] <= 20)


# The particles of family names, any case: "van der Torre", "De Luca", "bin Salman".
_SURNAME_PARTICLES = (
    r"(?:van|von|de|der|den|di|da|du|del|della|dos|das|la|le|ter|ten|bin|ibn|al|el)"
)
_SURNAME_AFTER_RE = re.compile(
    rf" ((?i:{_SURNAME_PARTICLES} ){{0,3}})([^\W\d_][\w'’-]*)"
)


def family_name_after(text: str, end: int, caseless: bool) -> int:
    """Where a name found to end at ``end`` ends with the family name after it, on the
    same line after one space: a family name somewhere (``_surname_next``'s test, but no
    word the table does not hold), capitalized in text with case ("kira mitchell" where a
    model found "kira"); after particles ("Roxy van der Torre", "Narciso De Luca", also
    where the name found ends in one: "Roxy van") any word that is no English or function
    word; ``end`` if none follows."""
    m = _SURNAME_AFTER_RE.match(text, end)
    if m is None or (not caseless and not m.group(2)[0].isupper()):
        return end
    w = m.group(2).lower()
    particles = bool(m.group(1)) or text[max(0, end - 4) : end].lower() in (" van", " von")
    if particles and w in _STOP:
        return end
    ok = _family_word(w, particles) and w not in _NOT_PERSONS and w not in _country_names()
    return m.end() if ok else end


def _cued_names(
    text: str, ws: list[str], offs: list[tuple[int, int]], caseless: bool, words: set[str]
) -> list[tuple[int, int]]:
    """Names after a cue, with the family name and initials after them. Any name (one the
    table does not hold too) after a verb of saying, a role ("producer"), "featuring", "my
    son"; a name the table holds after "directed by", "had given ... his", or
    said to the reader at a sentence's end ("don't go to town, megan!"). ``words``: the
    words of ``ws`` that ``_open_name`` passes (with any name where a strong cue is in the
    message), a possessive's name for those that end in "'s"."""
    n = len(ws)
    out = []
    for i in range(n):
        w = ws[i]
        if w not in words:
            continue
        work = 0 < i < n - 1 and ws[i - 1] in _ARTICLES and ws[i + 1] in _WORKS  # "the X novel"
        cue_before = i and (
            work or ws[i - 1] in _AFTER_CUE or "," in text[offs[i - 1][1] : offs[i][0]]
        )
        if i and not cue_before and not (w.endswith(_POSS) and i + 1 < n):
            continue  # most words: nothing before them says a name follows
        s, e = offs[i]
        if not caseless and not text[s].isupper():
            continue  # in text with case a name is capitalized
        if w.endswith(_POSS) and i + 1 < n and ws[i + 1] in _PERSON_NOUNS:
            if _open_name(w[:-2], True):  # "waltruda's kid", "jake's wife"
                out.append((s, e - 2))
            continue
        if not i:
            continue
        p1 = ws[i - 1]
        p2 = ws[i - 2] if i > 1 else ""
        p3 = ws[i - 3] if i > 2 else ""
        before = text[offs[i - 1][1] : s]
        joined = not before.strip()
        strong = joined and (
            p1 in _SAYING or p1 in _ROLE_NOUNS or p1 in _FEATURING
            or (p1 == "to" and (p2 in _SAYING or p3 in _SAYING or p2 in _ROLE_NOUNS))
            or (p1 in _RELATION_SET and p2 in ("my", "our"))  # "my kid pomeroy"
            or (p1 == "called" and p2 in _BE)  # "she was called kirie takuda"
            or (work and text[e : offs[i + 1][0]] == " ")  # "unlike the Rasmussen novel"
        )  # fmt: skip
        if strong:
            if not _open_name(w, True):
                continue
        else:
            after = text[e : offs[i + 1][0]] if i + 1 < n else text[e:]
            tail = after.strip()[:1]
            if not (
                (joined and p1 == "by" and "N" in lexicon().get(p2, "") and p2 not in _AUX)
                or (joined and p1 == "under" and p2 in _BE)  # "it's under murron simpson"
                or (joined and p1 == "to" and p2 in ("it", "name") and p3 in _CHANGING)
                or (joined and p1 in _ADDING)  # "add lauchlan duncan as guardian" (see below)
                or (  # "had given lois his address"
                    joined and (p1 in _GIVING or p1 in _GIVEN_FORMS) and not tail
                    and i + 1 < n and ws[i + 1] in _OBJECT_START
                )
                or (  # "don't go to town, megan!"
                    before.strip() == "," and tail in ("!", "?", ".") and (i + 1 == n or tail == "!")
                )
            ) or not _open_name(w, False):
                continue
        j = i
        while j + 1 < n and _surname_next(text, ws, offs, j + 1, caseless):
            j += 1
        if p1 in _ADDING and (j + 1 >= n or ws[j + 1] not in ("to", "as")):
            continue
        out.append((s, offs[j][1]))
    return out


# What follows a sentence's subject when the subject is someone: "Ushurma is from ...",
# "but Lothair just has to ...", "Rościsław had given ...".
_SUBJECT_VERBS = frozenset(
    "is was has had said says lives lived works worked wants wanted called sent paid just".split()
)


def _unknown_subjects(text: str, src: str, token_re, ws: list[str]) -> list[tuple[int, int]]:
    """A word the name table does not hold (and no English, function or place word) as a
    sentence's subject: at its start, after a pause or "but", "and", "so", right before
    a verb of ``_SUBJECT_VERBS``; capitalized in text with case."""
    t = table()
    found = [
        i for i in range(len(ws) - 1)
        if ws[i + 1] in _SUBJECT_VERBS and ws[i] not in t and _open_name(ws[i], True)
    ]  # fmt: skip
    if not found:
        return []  # most messages: no such word before such a verb
    offs = [m.span() for m in token_re.finditer(src)]
    caseless = _is_caseless(text)
    out = []
    for i in found:
        s, e = offs[i]
        if i and ws[i - 1] not in ("but", "and", "so") and not any(
            c in text[offs[i - 1][1] : s] for c in _PAUSES
        ):
            continue
        if text[e : offs[i + 1][0]] == " " and (caseless or text[s].isupper()):
            out.append((s, e))
    return out


def clause_name_spans(text: str, words: Words | None = None) -> list[tuple[int, int]]:
    """The (start, end) of each name the clauses above put in a person's place. ``words``:
    ``text``'s ``message_words``, when the caller has them."""
    _, src, token_re, ws = words or message_words(text)
    out = _clause_names(text, src, token_re, ws)
    if not _SUBJECT_VERBS.isdisjoint(ws) and (subjects := _unknown_subjects(text, src, token_re, ws)):
        return subjects + out
    return out


def _clause_names(text: str, src: str, token_re, ws: list[str]) -> list[tuple[int, int]]:
    """``clause_name_spans`` but the unknown subjects."""
    cands, gate = _candidates()
    vocative = "," in src and _VOCATIVE_RE.search(src) is not None
    if gate.isdisjoint(ws) and not vocative:
        return []  # most messages: no first name rare in English, no cue
    cued: set[str] = set()  # the words a cue may put as a name (no English words)
    if vocative or not _CUE_TRIGGERS.isdisjoint(ws):
        any_name = not _STRONG_CUES.isdisjoint(ws)  # else only names the table holds
        cued = {
            w for w in set(ws).difference(_lexicon_words())
            if _open_name(w[:-2] if w.endswith(_POSS) else w, any_name)
        }  # fmt: skip
    if not cued and cands.isdisjoint(ws):
        return []
    offs = [m.span() for m in token_re.finditer(src)]
    n = len(ws)
    caseless = None  # read once, when a common-word name needs it
    out = []
    if cued:
        caseless = _is_caseless(text)
        out += _cued_names(text, ws, offs, caseless, cued)
    for i, w in enumerate(ws):
        if w not in cands:
            continue
        s, e = offs[i]
        if w in _WORD_NAMES:
            if caseless is None:
                caseless = _is_caseless(text)
            if _word_name(text, ws, offs, i, caseless):
                out.append((s, e))
            continue
        if e - s > 1 and text[s:e].isupper() and not text.isupper():
            continue  # an acronym in text with case ("SWIFT")
        before = text[offs[i - 1][1] : s] if i else ""
        p1 = ws[i - 1] if i else ""
        nxt = ws[i + 1] if i + 1 < n else ""
        after = text[e : offs[i + 1][0]] if i + 1 < n else text[e:]
        verb, obj = nxt, ws[i + 2] if i + 2 < n else ""
        if after.strip():  # a pause or a sign right after: no verb follows
            verb = obj = ""
        elif nxt in _ADVERBS and i + 2 < n and not text[offs[i + 1][1] : offs[i + 2][0]].strip():
            verb, obj = ws[i + 2], ""  # "jake just sent"
        joined = not before.strip()  # no pause between the word before and this one
        opens = (
            not i or any(c in before for c in _PAUSES)
            or (joined and (p1 in _OPENERS or p1 in _PERSON_NOUNS))
        )  # fmt: skip
        asks = (
            p1 in _INVERTING and joined
            and (i == 1 or ws[i - 2] in _OPENERS
                 or any(c in text[offs[i - 2][1] : offs[i - 1][0]] for c in _PAUSES))
        )  # fmt: skip
        if (
            (opens and verb and _finite(verb))  # "what if jake loses the card"
            or (asks and verb and _verb(verb, obj))  # "can paige use my card"
            or (p1 in _GIVING and joined and not after.strip() and nxt in _OBJECT_START)
            or (p1 in _ADDING and joined and not after.strip() and nxt in ("to", "as"))
            or (  # "the plumber, wes, wants cash"
                p1 in _PERSON_NOUNS and before.strip() == "," and after.strip()[:1] == ","
            )
            or (  # "hey, ben here"
                p1 in _GREETINGS and not before.strip(" ,")
                and (i + 1 == n or nxt in ("here", "speaking") or after.strip()[:1] == ",")
            )
            or (  # "ok ben thanks"
                p1 in _ADDRESS_BEFORE and joined
                and (i + 1 == n or after.strip()[:1] in _PAUSE_SET or nxt in _ADDRESS_AFTER)
            )
            or (i == 1 and p1 in _GREETINGS)  # "hello jake can you help"
            or (  # "spoke to jake yesterday", "i talked with wes"
                p1 in ("to", "with") and joined and i > 1 and ws[i - 2] in _TALKING
                and not text[offs[i - 2][1] : offs[i - 1][0]].strip()
            )
            or (  # "jake: hi, i need help" (a chat's speaker), at a line's start
                after.strip() == ":" and (not i or "\n" in before)
            )
            or (  # "jake (my son) needs a card", "wes, my brother, paid"
                after.strip() in ("(", ",", "-") and i + 2 < n and nxt in ("my", "our")
                and ws[i + 2] in _PERSON_NOUNS
            )
        ):
            out.append((s, e))
    return sorted(set(out)) if cued else out
