"""Names that casual phrasings introduce: "call me will", "i go by brad", "hi, i'm john",
"my husband, will, ...", "text bob the code", "send $20 to steve's account".

What: ``phrase_name_spans(text)`` returns the PERSON spans these phrasings put a name in,
in text with or without case. Each phrasing says how sure it is that a name follows, and
the word there must be as name-like as that requires, read from the trimmed name table of
``pii.model`` (best first-name rank in any country, English Zipf frequency):

* *naming* phrasings ("call me", "i go by", "known as", "named", "named him"): any word
  that is a first name somewhere, however common in English ("call me will", "i go by
  hope"), or a word the table does not hold (a rare name: "kem", "bex"); never a function
  word, a pronoun or a way of travelling ("call me back", "i go by bus");
* *name kinds* ("my last name is", "maiden name was", "surname:", "first name?"): for a
  family name, any family name somewhere ("wall", "hague"), for a first name as above;
* *greetings* ("hi i'm faith", "this is june, ...", "it's kemal"): a first name, not a
  very common English word, after a greeting or at the message's start and followed by a
  pause (a comma, the end, "here");
* *relations* ("my husband, will, ...", "my grandson max"): a first name after a
  relationship noun; between commas any first name, else one not common in English;
* *person objects* ("text bob", "remind jim", "i owe kofi 30", "said hudson") and
  *payees* ("sent money to paulo", "transferred 50 to kwame", no country): a first name
  that is rare as an English word (Zipf under 4.7: "bob", "jim", not "bill" or "mark");
* *possessives* ("steve's account", "jess's card"): a first name, not common in English,
  before 's and an account word.

``list_name_spans(text, names)`` adds the other words of a list ("Zweig, Coleman and
Gray") at least half of whose words are names found already.

Why rules and not the token model alone: the model learns a context from the phrasings
its training data holds, and a short common name ("bob", "will") needs the context to be
found; these phrasings are the ways people name someone in a chat, written from English
usage (the issue's list and grammar), not fitted to the evaluation sets (see
docs/BENCHMARKS.md for how they were measured: the held-back halves were scored once).
"""

from __future__ import annotations

import functools
import re

from pii.addresses import _country_names
from pii.casing import Words, _is_caseless, message_words
from pii.model import _NEVER_NAMES, table
from pii.names import _STOP_LOWER

# Words that follow these phrasings and are no names.
_STOP = _STOP_LOWER | _NEVER_NAMES | frozenset("""
back later soon again asap anytime tomorrow tonight if when whenever after before on at
in please pls plz now ur your my a an the this that it him her them us everyone someone
anyone anybody nobody somebody everybody sir madam maam ma'am mate dude bro babe love honey
hun darling buddy pal guys bus ferry car train taxi cab bike bicycle foot plane air tube
metro boat coach subway tram road sea rail post mail email phone text name nickname
myself yourself himself herself themselves whatever what which who whoever mr mrs ms dr
miss mister first last full real middle new old fine good well here there out up down off
over into onto not only just even still also too very really so quite pretty
aud gbp usd eur cad chf jpy nzd sek nok dkk pln huf czk ron bgn try rub inr cny hkd sgd zar
mxn brl thb
""".split())
# After a phrasing that names someone ("call me will", "my husband, will,"), the modal and
# the months that are given names are names.
_STOP_NAMING = _STOP - {"will", "may", "april", "june", "august"}
_RELATIONS = """
husband wife partner spouse son daughter mother father mum mom mam dad mummy daddy brother
sister friend mate colleague coworker boss manager landlord landlady tenant flatmate roommate
housemate neighbour neighbor girlfriend boyfriend fiance fiancé fiancee fiancée grandson
granddaughter grandma grandpa grandmother grandfather gran granny nan nana uncle aunt auntie
nephew niece cousin kid kids child children baby stepson stepdaughter stepmum stepmom stepdad
carer nanny babysitter cleaner twin
""".split()
_OBJECT_VERBS = """
text texted texting remind reminded reminding tell told telling ask asked asking owe owes
owed owing pay paid paying message messaged email emailed thank thanked ping pinged invite
invited lend lent said says
""".split()
_ACCOUNT_WORDS = """
account acct card cards bank number details name phone iban wallet profile savings balance
""".split()

_NAMING_VERBS = frozenset(("call", "calls", "called"))
_OBJECT_PRONOUNS = frozenset(("him", "them", "me", "us"))  # not "her": "named her cat"
_FAMILY_KINDS = frozenset(("last", "family", "maiden", "surname"))
_NAME_KINDS = _FAMILY_KINDS | frozenset(("first", "given", "middle"))
_GO_SUBJECTS = frozenset(("i", "we", "he", "she", "they", "friends", "everyone", "people"))
_GREETINGS = frozenset("hi hey hello hiya heya morning evening afternoon yo".split())
_I_AM = frozenset(("i'm", "i’m", "im", "it's", "it’s", "its", "name's", "name’s"))
_AFTER_GREETING = frozenset(("here", "speaking", "from", "and", "again"))
# Words before "to" that make the next word a payee: "sent money to paulo", "transferred
# 50 to kwame", "a payment to olumide" (numbers are no words here: "sent £20 to dave").
_PAYEE_BEFORE = frozenset("""
send sends sent sending transfer transfers transferred transferring wire wired pay paid
paying give gave lend lent refund refunded money cash funds it quid pounds euros dollars
bucks payment payments
""".split())
# Who else money goes to: no names ("the payment sent to seller").
_NOT_PAYEES = frozenset("""
seller sellers merchant merchants vendor vendors shop store company companies bank banks
someone somebody anyone anybody recipient recipients beneficiary payee payees supplier
contractor agent owner buyer customer client charity family friends people account
""".split())
_RELATION_SET = frozenset(_RELATIONS)
_OBJECT_SET = frozenset(_OBJECT_VERBS)
_ACCOUNT_SET = frozenset(_ACCOUNT_WORDS)
_SELF = frozenset(("me", "i", "myself"))
_AND = frozenset(("and", "&"))
# Every phrasing holds one of these words (or a possessive): most messages hold none, and a
# set test on the message's words skips them.
_CUE_WORDS = (
    _NAMING_VERBS
    | {"by", "known", "named", "nicknamed", "am", "this", "surname"}
    | _NAME_KINDS
    | _I_AM
    | _RELATION_SET
    | _OBJECT_SET
    | _AND
    | {"with"}
)
_PAUSE = frozenset(",.!?;:)")
_POSS = ("'s", "’s")
# The last word of every phrasing above: the word after one of these is a name candidate.
_P1_TRIGGERS = frozenset((
    "me", "named", "nicknamed", "as", "by", "am", "is", "with", "was", "surname", "name",
    "name's", "name’s",
)) | _OBJECT_PRONOUNS | _I_AM | _RELATION_SET | _OBJECT_SET  # fmt: skip


@functools.lru_cache(maxsize=65536)
def _name_like(low: str, max_zipf: float, unknown_ok: bool) -> bool:
    """A first name somewhere (best rank 1000 or better) that is no more common in English
    than ``max_zipf`` (99: any); with ``unknown_ok`` also a word the table does not hold."""
    if low in (_STOP_NAMING if max_zipf >= 99 else _STOP) or len(low) < 2:
        return False
    if low.endswith(("'s", "’s")):
        low = low[:-2]
    hit = table().get(low)
    if hit is None:
        return unknown_ok and low.isalpha()
    first, _, zipf = hit
    return 0 < first <= 1000 and zipf < max_zipf


@functools.lru_cache(maxsize=65536)
def _surname_like(low: str) -> bool:
    """A family name somewhere (best rank 5000 or better) or a word the table does not
    hold; never a function word ("my last name is too long")."""
    if low in _STOP_NAMING or len(low) < 2:
        return False
    hit = table().get(low)
    if hit is None:
        return low.isalpha()
    return 0 < hit[1] <= 5000


def _name_kind(ws: list[str], i: int, text: str, at) -> str | None:
    """The kind of name ("last", "first", "surname") a phrasing asks for right before word
    ``i``: "last name is ___", "maiden name was ___", "surname: ___", "first name? ___"."""
    p1 = ws[i - 1]
    if p1 in ("is", "was", "'s", "’s"):
        if i < 3:
            return None
        noun, kind = ws[i - 2], ws[i - 3]
    else:
        noun, kind = p1, ws[i - 2] if i > 1 else ""
        if noun != "surname" and kind not in _NAME_KINDS:
            return None
        if text[at(i - 1)[1] : at(i)[0]].strip() not in (":", "?", "-"):
            return None  # "my surname wall" is no phrasing
    if noun == "surname":
        return "surname"
    if noun in ("name", "name's", "name’s") and kind in _NAME_KINDS:
        return kind
    return None


def phrase_name_spans(text: str, words: Words | None = None) -> list[tuple[int, int]]:
    """The (start, end) of each name a phrasing above introduces, in order. ``words``:
    ``text``'s ``message_words``, when the caller has them."""
    low, src, token_re, ws = words or message_words(text)
    if (
        _CUE_WORDS.isdisjoint(ws)
        and "'s " not in low
        and "’s " not in low
        and ("to" not in ws or _PAYEE_BEFORE.isdisjoint(ws))
    ):
        return []  # most messages
    n = len(ws)
    offs: list[tuple[int, int]] = []

    def at(i: int) -> tuple[int, int]:
        if not offs:
            offs.extend([m.span() for m in token_re.finditer(src)])
        return offs[i]

    # Only the word after a phrasing's last word, and a possessive, can be a name.
    cands = {
        j + 1
        for j in range(n - 1)
        if ws[j] in _P1_TRIGGERS or (ws[j] == "to" and j and ws[j - 1] in _PAYEE_BEFORE)
    }
    if "'" in low or "’" in low:
        cands.update(i for i, w in enumerate(ws) if w.endswith(_POSS))
    out = []
    for i in sorted(cands):
        w = ws[i]
        if w.endswith(_POSS):
            if i + 1 < n and ws[i + 1] in _ACCOUNT_SET and _name_like(w[:-2], 5.0, False):
                s, e = at(i)
                out.append((s, e - 2))  # "steve's account"
            w = w[:-2]
        if not i:
            continue
        p1 = ws[i - 1]
        p2 = ws[i - 2] if i > 1 else ""
        level = None
        if (
            (p1 == "me" and p2 in _NAMING_VERBS)
            or p1 in ("named", "nicknamed")
            or (p1 == "as" and p2 == "known")
            or (p1 == "by" and p2 in ("go", "goes") and i > 2 and ws[i - 3] in _GO_SUBJECTS)
            or (p1 in _OBJECT_PRONOUNS and p2 in ("named", "nicknamed"))
        ):
            level = (99.0, True)  # "call me will", "i go by hope", "she named him bobby"
        elif kind := _name_kind(ws, i, text, at):  # "my maiden name is hague", "surname: wall"
            if _surname_like(w) if kind in _FAMILY_KINDS else _name_like(w, 99.0, True):
                s = at(i)[0]
                out.append((s, s + len(w)))
            continue
        elif p1 in _I_AM or (p1 == "am" and p2 == "i") or (p1 == "is" and p2 in ("this", "name")):
            if not _name_like(w, 5.6, False):
                continue
            j = i - (2 if p1 in ("am", "is") else 1)  # where the phrase starts
            if j > 0 and ws[j] in ("name", "name's", "name’s") and ws[j - 1] == "my":
                j -= 1  # "my name's ...", "my name is ..."
            greeted = j > 0 and ws[j - 1] in _GREETINGS
            start = j == 0 or (j == 1 and ws[0] in _GREETINGS)
            if not greeted and start:
                rest = text[at(i)[1] :].lstrip()
                greeted = (
                    not rest
                    or rest[0] in _PAUSE
                    or (
                        i + 1 < n
                        and ws[i + 1] in _AFTER_GREETING
                        and at(i + 1)[0] == len(text) - len(rest)
                    )
                )
            if greeted:
                level = (5.6, False)  # "hi i'm brad", "this is june, ..."
        elif p1 in _RELATION_SET and p2 in ("my", "our"):
            if not _name_like(w, 99.0, False):  # the weaker of the two tests below
                continue
            s, e = at(i)
            boxed = "," in text[at(i - 1)[1] : s] and text[e:].lstrip().startswith(",")
            level = (99.0 if boxed else 5.0, False)  # "my husband, will,", "my grandson max"
        elif p1 in _OBJECT_SET:
            level = (4.7, False)  # "text bob", "i owe kofi"
        elif (
            p1 == "to" and p2 in _PAYEE_BEFORE and w not in _NOT_PAYEES
            and w not in _country_names()
        ):
            level = (4.7, False)  # "sent money to paulo", not "send money to kenya"
        elif p1 == "with" and _is_caseless(text):
            level = (4.0, False)  # "a joint account with leilani"
        if level is not None and _name_like(w, *level):
            s = at(i)[0]
            out.append((s, s + len(w)))
    ands = [i for i in range(1, n - 1) if ws[i] in _AND] if "and" in ws or "&" in ws else ()
    for i in ands:  # "me and tom", "jack and grace"
        a, b = ws[i - 1], ws[i + 1]
        if a in _SELF:
            names = [i + 1] if _name_like(b, 5.2, False) else []
        elif b in _SELF:
            names = [i - 1] if _name_like(a, 5.2, False) else []
        else:
            names = [i - 1, i + 1] if _name_like(a, 5.0, False) and _name_like(b, 5.0, False) else []
        if names and not (
            i > 1 and ws[i - 2] in _STOP and ws[i - 2] not in _SELF
            and not text[at(i - 2)[1] : at(i - 1)[0]].strip()
        ):  # not "on holiday and i", "the cash and card": no name in front
            out += [at(j) for j in names]
    return sorted(set(out))


# A list of three or more single words: "Schutt, Garner and Thornton", "dam, taylor and moore".
_LIST_RE = re.compile(
    r"(?<![\w'’-])[^\W\d_]+(?:[ \t]*,[ \t]*[^\W\d_]+)+,?[ \t]+(?:and|&)[ \t]+[^\W\d_]+(?![\w'’-])",
    re.IGNORECASE,
)
_LIST_ITEM_RE = re.compile(r"[^\W\d_]+")
# People named as a group just before a list: "our 3 founders: Zweig, Coleman and Gray",
# "my kids are ana, joe and sam", "the trustees, Peres, Powers and King".
_LIST_CUE_RE = re.compile(
    r"\b(?:co-?)?(?:founders|partners|owners|authors|directors|members|guests|speakers"
    r"|attendees|participants|kids|children|sons|daughters|siblings|brothers|sisters|friends"
    r"|colleagues|coworkers|co-workers|flatmates|roommates|housemates|trustees|executors"
    r"|beneficiaries|signatories|parents|grandchildren|nephews|nieces|cousins)"
    r"(?:[ \t]+(?:are|were|is|was))?[ \t]*[:,]?[ \t]*$",
    re.IGNORECASE,
)


def _family_names(items: list[tuple[int, int, str]], hits: list) -> bool:
    """Whether every word of a list is a family name somewhere (rank 2,000 or better, Zipf
    under 5.5) or a word the table does not hold (a rare name: "Adomo"), at least half of
    them family names and half rare in English (Zipf under 4.5, or not in the table)."""
    family = rare = 0
    for h, (*_, w) in zip(hits, items, strict=True):
        if w.lower() in _STOP:
            return False
        if h is None or (not h[0] and not h[1] and h[2] < 3):  # unknown, or a rare word only
            if len(w) < 3:
                return False
            rare += 1
        elif 0 < h[1] <= 2000 and h[2] < 5.5:
            family += 1
            rare += h[2] < 4.5
        else:
            return False
    return family * 2 >= len(items) and rare * 2 >= len(items)


def _cued_list_word(w: str, hit) -> bool:
    """A word of a list of people ("founders: ..."): a first or family name somewhere
    (rank 5,000 or better), or a word the table does not hold or holds as a rare word;
    no function word and no common English word that is no name."""
    low = w.lower()
    if len(w) < 2 or low in _STOP:
        return False
    if hit is None:
        return True
    return (0 < hit[0] <= 5000 or 0 < hit[1] <= 5000) if hit[0] or hit[1] else hit[2] < 3


def list_name_spans(
    text: str, names: list[tuple[int, int]], caseless: bool | None = None
) -> list[tuple[int, int]]:
    """The other words of a list most of whose words are names found already ("founders:
    Zweig, Coleman and Gray" with Zweig and Coleman found): each a first or last name
    somewhere and no function word; in text with case, capitalized. And a list all of
    whose words are family names (rank 2,000 or better somewhere, Zipf under 5.5, at least
    half of them rare in English, Zipf under 4: "reid, fletcher and smith"), found or not."""
    if "," not in text or not ("and" in text or "&" in text or "AND" in text or "And" in text):
        return []  # a list needs both (a quick test before the pattern)
    if not _LIST_RE.search(text):
        return []
    caseless = _is_caseless(text) if caseless is None else caseless
    t = table()
    out = []
    for m in _LIST_RE.finditer(text):
        items = [(w.start(), w.end(), w.group()) for w in _LIST_ITEM_RE.finditer(m.group())]
        items = [(m.start() + s, m.start() + e, w) for s, e, w in items if w.lower() not in _AND]
        hits = [t.get(w.lower()) for *_, w in items]
        cased_ok = caseless or all(w[0].isupper() for *_, w in items)
        if cased_ok and (_family_names(items, hits) or _LIST_CUE_RE.search(text, max(0, m.start() - 40), m.start())
                         and all(_cued_list_word(w, h) for (*_, w), h in zip(items, hits, strict=True))):
            out += [(s, e) for s, e, _ in items]
            continue
        found = [any(ns <= s and e <= ne for ns, ne in names) for s, e, _ in items]
        if sum(found) * 2 < len(items):
            continue
        for (s, e, w), f, hit in zip(items, found, hits, strict=True):
            if f or w.lower() in _STOP or hit is None or not (hit[0] or hit[1]):
                continue
            if caseless or w[0].isupper():
                out.append((s, e))
    return out


# A word of a name and where it ends: letters with inner apostrophes or hyphens.
_NAME_WORD_RE = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")
# Where a sentence starts: the text's start or after ". ", "! ", "? ", a line break.
_SENTENCE_START_RE = re.compile(r"(?:^|[.!?:;\n]\s*|\\[nN]\s*)$")


def repeated_name_spans(
    text: str, names: list[tuple[int, int]], caseless: bool | None = None
) -> list[tuple[int, int]]:
    """The other mentions of a name found once ("Toby West ... West was influenced", "Luis
    Castro ... Castro's song", "hi, i'm anna kowalski ... anna"): each word of at least
    three letters of a name span, wherever else in the message it stands as a word of its
    own (a possessive "'s" may follow). In text with case, only as written, capitalized,
    and a word common in English (Zipf 4.5 or more: "West", "Will") not at a sentence's
    start; without case, only words rare in English ("toby west ... west" stays). Not
    next to a name found ("Bora Bora": the model took one word of a place's name)."""
    if not names:
        return []
    caseless = _is_caseless(text) if caseless is None else caseless
    words: dict[str, bool] = {}  # the word as matched -> common in English
    for s, e in names:
        for m in _NAME_WORD_RE.finditer(text, s, e):
            w = m.group()
            low = w.lower()
            if len(w) < 3 or low in _STOP or (not caseless and not w[0].isupper()):
                continue
            hit = table().get(low)
            common = hit is not None and hit[2] >= 4.5
            if caseless and common:
                continue
            words[low if caseless else w] = common
    scan = text.lower() if caseless else text
    words = {w: c for w, c in words.items() if scan.count(w) > 1}  # most: said once
    if not words:
        return []
    out = []
    for m in _NAME_WORD_RE.finditer(text):
        s, e = m.span()
        if text.endswith(("'s", "’s", "'S", "’S"), s, e):
            e -= 2  # "Castro's song"
        word = text[s:e].lower() if caseless else text[s:e]
        if (common := words.get(word)) is None or (s and text[s - 1] in "-'’"):
            continue
        if any(ns < e and s < ne for ns, ne in names) or any(
            (ne <= s and not text[ne:s].strip()) or (e <= ns and not text[e:ns].strip())
            for ns, ne in names
        ):  # inside a name, or next to one ("Bora Bora": the model took one word)
            continue
        if common and _SENTENCE_START_RE.search(text, max(s - 4, 0), s):
            continue
        out.append((s, e))
    return out


# A first name, maybe a middle initial, and a family name, in text without case.
_PAIR_RE = re.compile(
    r"(?<![\w'’-])([^\W\d_]{2,})(?:[ \t]+(?![ai]\b)[^\W\d_]\.?)?[ \t]+"
    r"([^\W\d_]{2,}(?:-[^\W\d_]{2,})?)(?![\w'’-])"
)
# Particles of place and company names that name lists hold as given names ("san
# lorenzo", "du morbihan", "al maghrib").
_NOT_FIRST = frozenset("""
al el la le las los de del della di da das do dos du des van von der den ter san santa
santo sao são saint st ste port fort mount lake long par man big little north south east
west new old great upper lower
""".split())


def name_pair_spans(text: str, low: str | None = None) -> list[tuple[int, int]]:
    """Full names in text without case ("change it to virginia adkins", "producer jay
    blackwell explained", "anna r shah"): a word that is a common first name somewhere
    (rank 300 or better in some country) and not a very common English word (Zipf under
    6), then a family name (rank 2,000 or better) rare as an English word (Zipf under 4;
    not a word the table does not hold: typos are as common). Function words, greetings,
    the words that follow a naming phrasing and the particles of place names ("san",
    "du") are neither. In text with case, capitals already say this
    (the token model reads them)."""
    if low is None:  # the caller passes the lower case of a text it knows has no case
        if not _is_caseless(text):
            return []
        low = text.lower()
    firsts, lasts = _pair_words()
    words = set(_PAIR_WORD_RE.findall(low))
    if firsts.isdisjoint(words) or lasts.isdisjoint(words):
        return []  # most messages: no first name, or no family name (a set look-up each)
    out = []
    pos = 0
    while m := _PAIR_RE.search(text, pos):
        pos = m.end(1) + 1  # pairs may share a word ("anna maria lopez")
        if m.group(1).lower() in firsts and m.group(2).lower() in lasts:
            out.append(m.span())
    return out


_PAIR_WORD_RE = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+)*")  # the words _PAIR_RE reads


@functools.cache
def _pair_words() -> tuple[frozenset[str], frozenset[str]]:
    """The words ``name_pair_spans`` takes as a first name and as a family name."""
    firsts, lasts = set(), set()
    for w, (first, last, zipf) in table().items():
        if w in _STOP:
            continue
        if 0 < first <= 300 and zipf < 6.0 and w not in _NOT_FIRST:
            firsts.add(w)
        if 0 < last <= 2000 and zipf < 4.0:
            lasts.add(w)
    return frozenset(firsts), frozenset(lasts)


# A title and a name in text without case: "mr. bumgarner", "mrs beet", "dr. anna shah".
# "dr" and "prof" need their period ("12 oak dr"); "miss" is a verb as often ("i miss work").
_TITLE_CASELESS_RE = re.compile(
    r"(?<![\w'’-])(?:mrs?\.?|ms\.?|mx\.?|dr\.|prof\.)[ \t]+([^\W\d_][\w'’-]+)(?:[ \t]+([^\W\d_][\w'’-]+))?",
    re.IGNORECASE,
)


def title_name_spans(text: str) -> list[tuple[int, int]]:
    """Names after a title in text without case (in text with case the cue rules of
    ``pii.names`` find them): the word after it, and the next one when that is a family
    name somewhere and no function word ("dr. anna shah"); never a function word."""
    out = []
    t = table()
    for m in _TITLE_CASELESS_RE.finditer(text):
        first, second = m.group(1), m.group(2)
        if first.lower() in _STOP:
            continue
        end = m.end(1)
        if second and second.lower() not in _STOP and (h := t.get(second.lower())) and h[1]:
            end = m.end(2)
        out.append((m.start(1), end))
    return out
