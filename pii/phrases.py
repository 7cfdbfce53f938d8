"""Names that casual phrasings introduce: "call me will", "i go by brad", "hi, i'm john",
"my husband, will, ...", "text bob the code", "send $20 to steve's account".

What: ``phrase_name_spans(text)`` returns the PERSON spans these phrasings put a name in,
in text with or without case. Each phrasing says how sure it is that a name follows, and
the word there must be as name-like as that requires, read from the trimmed name table of
``pii.model`` (best first-name rank in any country, English Zipf frequency):

* *naming* phrasings ("call me", "i go by", "known as", "named"): any word that is a
  first name somewhere, however common in English ("call me will", "i go by hope"), or a
  word the table does not hold (a rare name: "kem", "bex"); never a function word, a
  pronoun or a way of travelling ("call me back", "i go by bus");
* *greetings* ("hi i'm faith", "this is june, ...", "it's kemal"): a first name, not a
  very common English word, after a greeting or at the message's start and followed by a
  pause (a comma, the end, "here");
* *relations* ("my husband, will, ...", "my grandson max"): a first name after a
  relationship noun; between commas any first name, else one not common in English;
* *person objects* ("text bob", "remind jim", "i owe kofi 30"): a first name that is rare
  as an English word (Zipf under 4.7: "bob", "jim", not "bill" or "mark");
* *possessives* ("steve's account", "jess's card"): a first name, not common in English,
  before 's and an account word.

Why rules and not the token model alone: the model learns a context from the phrasings
its training data holds, and a short common name ("bob", "will") needs the context to be
found; these phrasings are the ways people name someone in a chat, written from English
usage (the issue's list and grammar), not fitted to the evaluation sets (see
docs/BENCHMARKS.md for how they were measured: the held-back halves were scored once).
"""

from __future__ import annotations

import functools
import re

from pii.casing import _is_caseless
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
invited lend lent
""".split()
_ACCOUNT_WORDS = """
account acct card cards bank number details name phone iban wallet profile savings balance
""".split()

_NAMING_VERBS = frozenset(("call", "calls", "called"))
_GO_SUBJECTS = frozenset(("i", "we", "he", "she", "they", "friends", "everyone", "people"))
_GREETINGS = frozenset("hi hey hello hiya heya morning evening afternoon yo".split())
_I_AM = frozenset(("i'm", "i’m", "im", "it's", "it’s", "its", "name's", "name’s"))
_AFTER_GREETING = frozenset(("here", "speaking", "from", "and"))
_RELATION_SET = frozenset(_RELATIONS)
_OBJECT_SET = frozenset(_OBJECT_VERBS)
_ACCOUNT_SET = frozenset(_ACCOUNT_WORDS)
_SELF = frozenset(("me", "i", "myself"))
_AND = frozenset(("and", "&"))
# Every phrasing holds one of these words (or a possessive): most messages hold none, and a
# set test on the message's words (0.5 us) skips them.
_CUE_WORDS = (_NAMING_VERBS | {"by", "known", "named", "nicknamed", "am", "this"} | _I_AM | _RELATION_SET
              | _OBJECT_SET | _AND | {"with"})
_SPLIT_RE = re.compile(r"[^\w'’&]+")
# Words (letters, inner apostrophes) and "&", with their offsets.
_TOKEN_RE = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*|&")
_PAUSE = frozenset(",.!?;:)")


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


def phrase_name_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each name a phrasing above introduces, in order."""
    low = text.lower()
    words = _SPLIT_RE.split(low)
    if _CUE_WORDS.isdisjoint(words) and "'s " not in low and "’s " not in low:
        return []
    toks = [(m.start(), m.end(), m.group().lower()) for m in _TOKEN_RE.finditer(text)]
    caseless = _is_caseless(text)
    out = []
    n = len(toks)
    for i, (s, e, w) in enumerate(toks):
        if w.endswith(("'s", "’s")):
            if i + 1 < n and toks[i + 1][2] in _ACCOUNT_SET and _name_like(w[:-2], 5.0, False):
                out.append((s, e - 2))  # "steve's account"
            w = w[:-2]
        if not i:
            continue
        p1 = toks[i - 1][2]
        p2 = toks[i - 2][2] if i > 1 else ""
        level = None
        if (p1 == "me" and p2 in _NAMING_VERBS) or p1 in ("named", "nicknamed") or (
                p1 == "as" and p2 == "known") or (
                p1 == "by" and p2 in ("go", "goes") and i > 2 and toks[i - 3][2] in _GO_SUBJECTS):
            level = (99.0, True)  # "call me will", "i go by hope"
        elif p1 in _I_AM or (p1 == "am" and p2 == "i") or (p1 == "is" and p2 in ("this", "name")):
            at = i - (2 if p1 in ("am", "is") else 1)  # where the phrase starts
            if at > 0 and toks[at][2] in ("name", "name's", "name’s") and toks[at - 1][2] == "my":
                at -= 1  # "my name's ...", "my name is ..."
            greeted = at > 0 and toks[at - 1][2] in _GREETINGS
            start = at == 0 or (at == 1 and toks[0][2] in _GREETINGS)
            rest = text[e:].lstrip()
            paused = not rest or rest[0] in _PAUSE or (i + 1 < n and toks[i + 1][2] in _AFTER_GREETING
                                                      and toks[i + 1][0] == len(text) - len(rest))
            if greeted or (start and paused):
                level = (5.6, False)  # "hi i'm brad", "this is june, ..."
        elif p1 in _RELATION_SET and p2 in ("my", "our"):
            boxed = "," in text[toks[i - 1][1]:s] and text[e:].lstrip().startswith(",")
            level = (99.0 if boxed else 5.0, False)  # "my husband, will,", "my grandson max"
        elif p1 in _OBJECT_SET:
            level = (4.7, False)  # "text bob", "i owe kofi"
        elif p1 == "with" and caseless:
            level = (4.0, False)  # "a joint account with leilani"
        if level is not None and _name_like(w, *level):
            out.append((s, s + len(w)))
    for i in range(1, n - 1):  # "me and tom", "jack and grace"
        if toks[i][2] not in _AND:
            continue
        a, b = toks[i - 1][2], toks[i + 1][2]
        if (i > 1 and toks[i - 2][2] in _STOP and toks[i - 2][2] not in _SELF
                and not text[toks[i - 2][1]:toks[i - 1][0]].strip()):
            continue  # "on holiday and i", "the cash and card": not a name in front
        if a in _SELF and _name_like(b, 5.2, False):
            out.append(toks[i + 1][:2])
        elif b in _SELF and _name_like(a, 5.2, False):
            out.append(toks[i - 1][:2])
        elif _name_like(a, 5.0, False) and _name_like(b, 5.0, False):
            out += [toks[i - 1][:2], toks[i + 1][:2]]
    return sorted(set(out))
