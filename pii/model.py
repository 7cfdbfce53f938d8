"""The learned part of PERSON and ADDRESS detection: logistic token models.

What: ``TokenModel.load(kind=...).spans(text, caseless, rule_spans, blocked, toks)``
returns the person names (``kind="PERSON"``) or street addresses (``"ADDRESS"``) in one
message. Every candidate token is scored on its own and in its context by a logistic
regression; tokens over the threshold, and their neighbours over a lower ``join``
threshold, make the spans ("anna kowalski", "Francesca J Freeman", "14 elm grove").

PERSON features:

* how much of a name the word is: its best rank as a first and as a last name in any
  country (names-dataset), and how common it is as an English word (wordfreq), read from
  the trimmed table ``data/names.tsv.gz`` (``tools/pii_tables.py`` builds it; the
  packages themselves hold 3 GB per process); in text without case, a name ranked 4,001
  to 20,000 that the table does not hold (``data/rare_names.npz``, 700,000 names as
  hashes) counts as a name ranked over 1,000;
* its shape in text with case (capitalized, upper, lower, an initial; sentence start);
* the words around it ("call me ___", "___'s account") and how name-like its neighbours
  are, also across a list ("reid, fletcher and smith");
* whether the cue rules of ``pii.detector`` ("my name is", "regards,", titles) cover it;
* optionally (``tools/pii_token_models.py --vector-dims``; the shipped weights have none:
  measured and not kept, docs/BENCHMARKS.md "Word-piece embeddings in the name model"),
  what the word and the two words on each side of it mean: the offline MiniLM's input
  (word-piece) embeddings, which place "said" near "told" and "remarked", "novel" near
  "book", "sarah" near "rebecca", so that a context or a name the training text never
  held still scores like the ones it did. The model is linear in them, so the trainer
  folds its weights into one number per word piece and position
  (``vectors.pieces``): at run time a word's value is the mean over its word pieces, a
  table look-up, and no embedding or network is loaded.

ADDRESS features: the token itself and its suffix (-straat, -gatan, -katu), whether it is
a street word of one of many languages, its shape (a house number, a year, a postcode,
an alphanumeric unit), the tokens around it, how far the nearest number and street word
are, a line break before it, and whether the address patterns of ``pii.detector`` cover
it. Only tokens near a number that can be a house number are scored.

Why: cue rules miss names after the hundreds of ways people introduce themselves ("i go
by brad", "send $20 to steve's account") and mask the common words that follow a cue
("signed up", "thanks, bye"); a prior of how often a word is a name against how often it
is an English word separates "liisa" from "kindly". Address patterns knew three countries'
shapes. Why not an NER model: none installs offline here (spaCy and Hugging Face models
download at run time), and a transformer per message would cost a hundred times the rest
of the detector.

The weights (``data/token_models.json.gz``) are trained by
``tools/pii_token_models.py`` on the tuned halves of the evaluation sets
(``data/pii_eval``), the raw-data builder's output and Banking77's training messages (as
negatives); the held-back halves were never used for training. The shipped weights date
from before 2026-12-06's narrower candidates (no single letters without case, no amounts
or counts as house numbers), which only drop words from scoring; a retrain with them was
scored once on the held-back halves, made more false detections on Banking77's test split
and the casual set's addresses, and was not kept (docs/BENCHMARKS.md): that choice is the
one use of the held-back halves in model selection.

Each message is scored alone, so its result does not depend on the messages beside it.
The caches (words classified, own scores) only skip repeated work; they hold words of
messages, so they live in the process that masks (the desensitize stage, before anything
downstream sees the text) and are never written anywhere.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import hashlib
import json
import math
import re
import unicodedata
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TABLE = DATA / "names.tsv.gz"
RARE = DATA / "rare_names.npz"
MODEL = DATA / "token_models.json.gz"

# A word (letters, inner apostrophes and hyphens: o'neill, jean-luc), a number, or one
# other non-space character.
_WORD = r"[^\W\d_]+(?:['’][^\W\d_]+)*(?:-[^\W\d_]+)*"
_TOKEN_RE = re.compile(rf"{_WORD}|\d+|[^\w\s]")
_WORD_RE = re.compile(_WORD)  # the words of _TOKEN_RE, as findall finds them
# The same on ASCII text, where they match alike and run faster (no Unicode classes).
_WORD_ASCII = r"[A-Za-z]+(?:'[A-Za-z]+)*(?:-[A-Za-z]+)*"
_TOKEN_ASCII_RE = re.compile(rf"{_WORD_ASCII}|[0-9]+|[^A-Za-z0-9_\s]")
_WORD_ASCII_RE = re.compile(_WORD_ASCII)
_SHORT_NUMBER_RE = re.compile(r"(?<!\d)\d{1,6}(?!\d)")
# The positions the word-piece values are kept for: the word itself, two words before
# and two after (``TokenModel.word_values``).
VECTOR_POSITIONS = ("o", "p2", "p1", "n1", "n2")
VECTOR_OFFSETS = (0, -2, -1, 1, 2)
_NO_VALUES = (0.0,) * len(VECTOR_POSITIONS)
_POSSESSIVE = ("'s", "’s")
_SENT_END = frozenset(".!?;\n")
_LIST_JOINS = frozenset((",", "and", "or", "&", "/"))
# Closed classes that name lists hold (a given name somewhere) but messages never use as
# names: weekdays, greetings and sign-off words, fillers ("thanks, bye", "due friday"),
# function words no one is named ("none of the payments", "nor do i"; not "will", "may"),
# and the card schemes, payment services and banks a bank's customers name ("amex").
_NEVER_NAMES = frozenset("""
monday tuesday wednesday thursday friday saturday sunday bye goodbye hi hello hey hiya
thanks thank thx cheers regards ok okay yes yeah yep no nope please pls sorry um uh erm
hmm lol yo heya howdy
none nor neither yours hers ours theirs whom whereas whilst hence thus therefore otherwise
beneath beside beyond throughout underneath amid onto toward unless
amex mastercard maestro paypal venmo zelle revolut monzo klarna alipay wechat cashapp gpay
transferwise barclays natwest santander hsbc
cardholder cardholders accountholder accountholders payslip payslips homeowner homeowners
username usernames passcode passcodes password passwords paycheck paychecks chargeback
chargebacks cashback topup topups contactless payee payees payer payers remitter remitters
overdraft overdrafts chequebook chequebooks checkbook checkbooks login logins signup ewallet
e-wallet fintech neobank
""".split())  # (the banking words above: Zipf under 5, so candidates otherwise)


# Street types that name no street before another: unit words ("flat 2 ..."; "flat" is a
# USPS street type too), "a 2 way street".
_NO_STREET_NAMES = frozenset(("flat", "apt", "apartment", "suite", "unit", "studio", "room", "way"))


@functools.cache
def table() -> dict[str, tuple[int, int, float]]:
    """token -> (best first-name rank, best last-name rank, English Zipf frequency)."""
    out = {}
    with gzip.open(TABLE, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or line.startswith("token\t"):
                continue
            tok, fr, lr, z = line.rstrip("\n").split("\t")
            out[tok] = (int(fr), int(lr), float(z))
    return out


def rare_key(low: str) -> int:
    """The key of a lower-cased word in ``rare_names()``: the first 8 bytes of its BLAKE2b
    digest, an unsigned integer (stable across processes, unlike ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(low.encode("utf-8"), digest_size=8).digest(), "little")


@functools.cache
def rare_names() -> tuple[object, object]:
    """The names ranked 4,001 to 20,000 in some country that ``table()`` does not hold
    (``data/rare_names.npz``, 700,000, from names-dataset by ``tools/pii_tables.py``): their
    keys (``rare_key``) sorted, and a code per key: 1 a first name, 2 a last name, 4 times
    the Zipf bucket. Two numpy arrays, 9 bytes a name (6 MB), not a dict of strings: that
    would cost several times ``table()``'s 90 MB in every process that masks. Two different
    words share a key with a chance of about 1 in 10^13."""
    import numpy as np

    with np.load(RARE) as z:
        return z["keys"], z["codes"]


def _rare(low: str) -> tuple[str, str, str] | None:
    """``word_class`` of a name of ``rare_names()``: ranked over 1,000 ("e") as a first or
    a last name, with its Zipf bucket; None for a word that is none."""
    keys, codes = rare_names()
    k = rare_key(low)
    i = int(keys.searchsorted(k))
    if i == len(keys) or int(keys[i]) != k:
        return None
    c = int(codes[i])
    return "e" if c & 1 else "0", "e" if c & 2 else "0", str(c >> 2)


def _rank_bucket(r: int) -> str:
    if not r:
        return "0"
    return "a" if r <= 10 else "b" if r <= 50 else "c" if r <= 200 else "d" if r <= 1000 else "e"


def _fold(low: str) -> str:
    if low.isascii():
        return low
    return unicodedata.normalize("NFKD", low).encode("ascii", "ignore").decode()


@functools.lru_cache(maxsize=65536)
def word_class(low: str, rare: bool = False) -> tuple[str, str, str]:
    """(first-rank bucket, last-rank bucket, Zipf bucket) of a lower-cased word; the Zipf
    bucket is "u" for a word the table does not hold. ``rare``: a name of ``rare_names()``
    is a name ranked over 1,000 (the name model's features of text without case: there no
    capital says that a word is a proper noun; in text with case the rare names, as often
    a company's or a place's word as a person's, cost more precision than they gained
    recall on the tuned folds, docs/BENCHMARKS.md)."""
    t = table()
    hit = t.get(low) or t.get(_fold(low))
    if hit is None:
        return (rare and (_rare(low) or _rare(_fold(low)))) or ("0", "0", "u")
    fr, lr, z = hit
    return _rank_bucket(fr), _rank_bucket(lr), str(min(int(z * 2), 14))


def piece_tokenizer(vocab: list[str]):
    """BERT's uncased WordPiece tokenizer over ``vocab`` (the offline MiniLM's), built with
    the ``tokenizers`` library from the pieces alone, so the detector needs no model files:
    ``piece_tokenizer(vocab)(word)`` -> the word's pieces (lower case, accents stripped,
    punctuation and CJK characters split off; "[UNK]" for a word that cannot be cut)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tk = Tokenizer(models.WordPiece({p: i for i, p in enumerate(vocab)}, unk_token="[UNK]",
                                    max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return lambda word: tk.encode(word, add_special_tokens=False).tokens


def _shape(tok: str, caseless: bool) -> str:
    if caseless:
        return "n"
    if len(tok) == 1:
        return "I" if tok.isupper() else "x"
    if tok.isupper():
        return "U"
    if tok[0].isupper():
        return "C"
    return "l" if tok.islower() else "m"


def _ctx(tok: str | None) -> str:
    if tok is None:
        return "^"
    if tok[0].isdigit():
        return "0"
    return tok.lower()


def tokenize(text: str) -> list[tuple[int, int, str]]:
    """(start, end, token); a possessive "'s" is split off its word."""
    rx = _TOKEN_ASCII_RE if text.isascii() else _TOKEN_RE
    toks = [(m.start(), m.end(), m.group()) for m in rx.finditer(text)]
    if "'" not in text and "’" not in text:  # no possessive (most messages)
        return toks
    out = []
    for s, e, tok in toks:
        if len(tok) > 3 and tok[-2:].lower() in _POSSESSIVE:
            out.append((s, e - 2, tok[:-2]))
            out.append((e - 2, e, "'s"))
        else:
            out.append((s, e, tok))
    return out


@functools.lru_cache(maxsize=131072)
def person_own(tok: str, caseless: bool, bos: bool) -> tuple[str, ...]:
    """The PERSON features of a word by itself (cached: words repeat)."""
    low = tok.lower()
    fb, lb, zb = word_class(low, caseless)
    sh = _shape(tok, caseless)
    own = (
        f"f:{fb}", f"l:{lb}", f"z:{zb}", f"fz:{fb}{zb}", f"lz:{lb}{zb}", f"fl:{fb}{lb}",
        f"s:{sh}", f"sz:{sh}{zb}", f"sf:{sh}{fb}", f"sl:{sh}{lb}", f"b:{sh}{int(bos)}",
        f"sfz:{sh}{fb}{zb}", f"slz:{sh}{lb}{zb}", f"sfl:{sh}{fb}{lb}",
        f"len:{min(len(tok), 9)}",
    )  # fmt: skip
    if zb in ("u", "0", "1", "2", "3", "4", "5"):
        own += (f"suf:{low[-3:]}",)
    return own


@functools.lru_cache(maxsize=131072)
def person_candidate(low: str) -> bool:
    """Whether the PERSON model scores a word at all: not a common English word (Zipf
    under 5: "card", "the", "transfer" are out), unless it is a common first or last name
    somewhere (best rank 200 or better: "will", "mark", "green"); not a compound of common
    words, nor a typo of a common word (``swapped_common_word``). Training sees the same
    words."""
    if "'" in low or "’" in low:  # "didn't", "i'm", "you're": contractions are no names
        tail = low.replace("’", "'").rsplit("'", 1)[1]
        if tail in ("t", "m", "ve", "d", "ll", "re", "s"):
            return False
    if low in _NEVER_NAMES:
        return False
    fb, lb, zb = word_class(low)
    if zb == "u" and "-" in low:
        # A compound of common English words the table does not hold as a whole
        # ("co-owner", "follow-up", "self-employed", "e-mail"): no name, unless a part
        # is a top-10 name somewhere ("smith-jones", "jean-luc") or rarer in English.
        parts = [word_class(p) for p in low.split("-") if p]
        if parts and all(z != "u" and int(z) >= 9 and "a" not in (f, la) for f, la, z in parts):
            return False
    if zb == "u" and len(low) >= 4 and swapped_common_word(low):
        return False
    return zb == "u" or int(zb) < 10 or fb in ("a", "b", "c") or lb in ("a", "b", "c")


@functools.lru_cache(maxsize=65536)
def swapped_common_word(low: str) -> bool:
    """Whether swapping two neighbouring letters of ``low`` gives a common English word
    (Zipf 4.5 or more): "crad", "accpeted", "tarnsfer" are typos. Asked only of words the
    name table does not hold, so a rare name the table knows is never taken for one."""
    for i in range(len(low) - 1):
        if low[i] == low[i + 1] or not (low[i].isalpha() and low[i + 1].isalpha()):
            continue
        _, _, zb = word_class(low[:i] + low[i + 1] + low[i] + low[i + 2:])
        if zb != "u" and int(zb) >= 9:
            return True
    return False


def token_features(
    toks: list[tuple[int, int, str]], i: int, caseless: bool, in_rule: bool
) -> tuple[tuple[str, ...], list[str]]:
    """(the word's own features, its context features) for token ``i``."""
    return person_own_at(toks, i, caseless), person_context(toks, i, caseless, in_rule)


def person_own_at(toks: list[tuple[int, int, str]], i: int, caseless: bool) -> tuple[str, ...]:
    prev = toks[i - 1][2] if i else None
    return person_own(toks[i][2], caseless, prev is None or prev in _SENT_END)


def person_context(
    toks: list[tuple[int, int, str]], i: int, caseless: bool, in_rule: bool
) -> list[str]:
    tok = toks[i][2]
    prev = toks[i - 1][2] if i else None
    sh = _shape(tok, caseless)
    p1 = _ctx(prev)
    p2 = _ctx(toks[i - 2][2]) if i > 1 else "^"
    nxt = toks[i + 1][2] if i + 1 < len(toks) else None
    n1 = _ctx(nxt) if nxt is not None else "$"
    n2 = _ctx(toks[i + 2][2]) if i + 2 < len(toks) else "$"
    ctx = [f"p1:{p1}", f"p2:{p2} {p1}", f"n1:{n1}", f"n2:{n1} {n2}"]
    if prev is not None and prev[0].isalpha():
        pf, pl, pz = word_class(prev.lower(), caseless)
        ctx.append(f"pn:{pf}{pl}{pz}{_shape(prev, caseless)}{sh}")
    if nxt is not None and nxt[0].isalpha() and nxt != "'s":
        nf, nl, nz = word_class(nxt.lower(), caseless)
        ctx.append(f"nn:{nf}{nl}{nz}{_shape(nxt, caseless)}{sh}")
    # Lists ("reid, fletcher and smith"): the word across a comma or "and".
    if p1 in _LIST_JOINS and i > 1 and toks[i - 2][2][0].isalpha():
        ctx.append(f"pl:{''.join(word_class(toks[i - 2][2].lower(), caseless))}{sh}")
    if n1 in _LIST_JOINS and i + 2 < len(toks) and toks[i + 2][2][0].isalpha():
        ctx.append(f"nl:{''.join(word_class(toks[i + 2][2].lower(), caseless))}{sh}")
    if in_rule:
        ctx.append(f"r:{sh}")
    return ctx


# Street words of many languages: the detector's English, French and German lists (read
# from pii.detector) and the commonest street types elsewhere in Europe and Latin America;
# a feature, not a rule (the model learns how much each is worth).
_STREET_EXTRA = """
via viale vicolo piazza piazzale corso largo strada rua avenida avda av travessa largo
praça praca calle carrer carretera ctra paseo plaza camino ronda ul ulica aleja al
út utca ut krt tér ter gatan gata vägen väg vag gränd gade vej veien vei gate gt plass
straat laan weg plein gracht dreef kade katu tie kuja polku cesta ulice trg namesti
náměstí třída trida nábřeží box po pmb psc unit apo fpo dpo usns usnv uss
"""


@functools.cache
def street_words() -> frozenset[str]:
    from pii import detector as pii

    words = set(pii._EN_STREET) | {w.rstrip(".") for w in pii._FR_VOIE}
    words |= {w.rstrip(".") for w in pii._DE_SUFFIX} | set(_STREET_EXTRA.split())
    words |= {"flat", "apt", "apartment", "suite", "ste", "unit", "studio", "room", "floor"}
    return frozenset(words)


def _ashape(tok: str, caseless: bool) -> str:
    if tok.isdigit():
        if len(tok) == 4 and tok[:2] in ("19", "20"):
            return "Y"  # a year, or a house number that looks like one
        return f"D{min(len(tok), 6)}"
    if tok[0].isdigit() or (tok[0].isalpha() and any(c.isdigit() for c in tok)):
        return "A"
    if not tok[0].isalpha():
        return tok[0]
    return _shape(tok, caseless)


@functools.lru_cache(maxsize=131072)
def address_own(tok: str, caseless: bool) -> tuple[str, ...]:
    """The ADDRESS features of a token by itself (cached: tokens repeat)."""
    low = tok.lower()
    sh = _ashape(tok, caseless)
    own: tuple[str, ...] = (f"as:{sh}", f"w:{low}" if not tok[0].isdigit() else f"w:{sh}")
    if tok[0].isalpha():
        _fb, _lb, zb = word_class(low)
        own += (f"z:{zb}", f"suf:{low[-3:]}", f"suf4:{low[-4:]}", f"szb:{sh}{zb}")
        sw = street_words()
        if low.rstrip(".") in sw or _fold(low) in sw:
            own += ("st",)
    return own


def address_features(
    toks: list[tuple[int, int, str]], i: int, caseless: bool, in_rule: bool, text: str,
    info: tuple | None = None,
) -> tuple[tuple[str, ...], list[str]]:
    """(own, context) features of token ``i`` for the ADDRESS model."""
    info = info or address_info(toks, caseless)
    return address_own(toks[i][2], caseless), address_context(toks, i, in_rule, text, info)


def address_info(
    toks: list[tuple[int, int, str]], caseless: bool, around: list[int] | None = None
) -> tuple:
    """Per token, computed once per message: the context word ("0"-like shape for
    numbers), the shape, whether a number, whether a street word. Only within 4 tokens
    of ``around`` (the candidates; all tokens if None): the context reads no further."""
    n = len(toks)
    if around is None:
        idx = range(n)
    else:
        near: set[int] = set()
        for i in around:
            near.update(range(max(i - 4, 0), min(i + 5, n)))
        idx = sorted(near)
    sw = street_words()
    words: list = [None] * n
    shapes: list = [None] * n
    nums = [False] * n
    streets = [False] * n
    for j in idx:
        t = toks[j][2]
        sh = shapes[j] = _ashape(t, caseless)
        if t[0].isdigit():
            words[j] = sh
            nums[j] = True
        else:
            w = words[j] = t.lower()
            streets[j] = w.rstrip(".") in sw
    return words, shapes, nums, streets


def address_context(
    toks: list[tuple[int, int, str]], i: int, in_rule: bool, text: str, info: tuple
) -> list[str]:
    words, shapes, nums, streets = info
    n = len(toks)
    sh = shapes[i]
    ctx = []
    for d, name in ((-2, "p2"), (-1, "p1"), (1, "n1"), (2, "n2")):
        j = i + d
        if 0 <= j < n:
            ctx.append(f"{name}:{words[j]}")
        else:
            ctx.append(f"{name}:^" if d < 0 else f"{name}:$")
    if i:
        ctx.append(f"p1s:{shapes[i - 1]}{sh}")
    if i + 1 < n:
        ctx.append(f"n1s:{shapes[i + 1]}{sh}")
    near_digit = near_street = 9
    for j in range(max(i - 4, 0), min(i + 5, n)):
        if nums[j]:
            near_digit = min(near_digit, abs(j - i))
        elif streets[j]:
            near_street = min(near_street, abs(j - i))
    ctx += [f"dn:{near_digit}{sh}", f"sn:{near_street}{sh}", f"ds:{min(near_digit, 5)}{min(near_street, 5)}"]
    if i and "\n" in text[toks[i - 1][1] : toks[i][0]]:
        ctx.append("nl")
    if in_rule:
        ctx.append(f"r:{sh}")
    return ctx


_CURRENCY = frozenset("$£€¥₹")
# Words after a number that make it an amount, a count or a time, not a house number
# ("30 quid", "20 gbp", "3 days", "top 10 ways").
_NOT_HOUSE_AFTER = frozenset("""
quid pound pounds euro euros dollar dollars bucks cent cents pence grand percent pct
gbp usd eur aud cad chf jpy nzd sek nok dkk pln huf czk inr cny hkd sgd zar mxn brl
day days week weeks month months year years yrs hour hours hr hrs minute minutes min mins
second seconds sec secs time times ways transactions payments attempts tries
hundred thousand million billion mn bn
""".split())
# Words before a number that make it an amount or a count ("withdraw 30", "nearly 13").
_NOT_HOUSE_BEFORE = frozenset("""
withdraw withdrew withdrawn withdrawing send sent sending pay paid paying transfer
transferred spend spent charge charged cost costs owe owed refund refunded deposit
deposited lend lent borrow borrowed exchange exchanged convert converted topped
nearly almost about around approx approximately over under than least only just extra
""".split())
# Right after the digits: an amount ("50p", "30k") or an ordinal ("3rd floor": a street's
# name has those, "3rd Street", never its house number).
_NOT_HOUSE_SUFFIX = frozenset(("p", "k", "st", "nd", "rd", "th"))


def _house_number(toks: list[tuple[int, int, str]], i: int, blocked) -> bool:
    """Whether number token ``i`` can be part of an address: 1 to 6 digits, not inside a
    card, phone, IBAN or other identifier already found (``blocked`` spans), not an amount,
    a count or an ordinal ("$20", "12.50", "15%", "30 quid", "3 days", "withdraw 30", "3rd")."""
    s, e, t = toks[i]
    if len(t) > 6 or any(bs <= s and e <= be for bs, be in blocked):
        return False
    if i and (toks[i - 1][2] in _CURRENCY or toks[i - 1][2].lower() in _NOT_HOUSE_BEFORE):
        return False
    if i + 1 < len(toks):
        nxt = toks[i + 1]
        low = nxt[2].lower()
        if nxt[2] == "%" or low in _NOT_HOUSE_AFTER or (nxt[0] == e and low in _NOT_HOUSE_SUFFIX):
            return False
        if nxt[2] in (".", ",") and nxt[0] == e and i + 2 < len(toks):
            after = toks[i + 2]
            if after[0] == nxt[1] and after[2][0].isdigit():
                return False  # a decimal or a grouped amount
    # the part after the point of a decimal or grouped amount
    return not (
        i > 1 and toks[i - 1][2] in (".", ",") and toks[i - 1][0] == toks[i - 2][1] == s - 1
        and toks[i - 2][2][0].isdigit()
    )


def candidates(
    toks: list[tuple[int, int, str]], kind: str, blocked: list[tuple[int, int]] = (),
    caseless: bool = False,
) -> list[int]:
    """The tokens a model scores; all others are not of its type. PERSON: words that pass
    ``person_candidate``. ADDRESS: tokens at most 3 tokens away from a house number (see
    ``_house_number``; every address has one). Training scores the same tokens."""
    if kind == "PERSON":
        return [
            i for i, (_s, _e, t) in enumerate(toks)
            if t[0].isalpha() and t != "'s" and (person_candidate(t.lower()) or _initial(t, caseless))
        ]  # fmt: skip
    nums = [i for i, (_s, _e, t) in enumerate(toks) if t[0].isdigit()]
    nums = [i for i in nums if _house_number(toks, i, blocked)]
    if not nums:
        return []
    near = set()
    for i in nums:
        near.update(range(max(i - 3, 0), min(i + 4, len(toks))))
    return sorted(near)


# The gap between a given name and a family name that holds a middle initial: " A ",
# " r. ", "  A " (in text with case, an upper-case one).
_INITIAL_GAP_RE = re.compile(r"[ \t]{1,2}([^\W\d_])\.?[ \t]{1,2}")


def _initial(t: str, caseless: bool = False) -> bool:
    """A middle initial, in text with case ("Francesca J Freeman"); without case a single
    letter is as often "u" or "r" (chat for "you", "are") and is no candidate: a name runs
    across it all the same (``_INITIAL_GAP_RE``)."""
    return len(t) == 1 and not caseless and t.isupper() and t not in ("I", "A")


def _strip_punct(run: list[int], scored: list[tuple[int, int, str, float]]) -> list[int]:
    """A run without the punctuation at its ends ("221 Baker Street," -> "221 Baker
    Street"); a "." after a word stays ("Main St.")."""
    lo, hi = 0, len(run)
    while lo < hi and not scored[run[lo]][2][0].isalnum():
        lo += 1
    while hi > lo and not scored[run[hi - 1]][2][0].isalnum() and not (
        scored[run[hi - 1]][2] == "." and hi - 1 > lo and scored[run[hi - 2]][2][0].isalpha()
        and scored[run[hi - 2]][1] == scored[run[hi - 1]][0]
    ):
        hi -= 1
    return run[lo:hi]


def _after_blank_line(
    run: list[int], scored: list[tuple[int, int, str, float]], text: str
) -> list[int]:
    """A run that starts with words and no number before a blank line ("kira
    mitchell\n\n992 ul. zagórna 55 ...": a name line above the address) starts after it;
    a blank line later in a block (before its country line) stays inside."""
    for k in range(1, len(run)):
        if any(scored[i][2][0].isdigit() for i in run[:k]):
            return run
        if text.count("\n", scored[run[k - 1]][1], scored[run[k]][0]) >= 2:
            return run[k:]
    return run


def _after_time(run: list[int], scored: list[tuple[int, int, str, float]], text: str) -> list[int]:
    """A run without its first token when that is a time's minutes ("at 10:02, Carys
    Jones wrote": "02" is no house number)."""
    s = scored[run[0]][0]
    if s >= 2 and text[s - 1] == ":" and text[s - 2].isdigit() and scored[run[0]][2].isdigit():
        return run[1:]
    return run


# The first word of a message's closing line ("Cheers\nBen", "Kind regards,"): an address
# block ends above it.
_CLOSING_WORDS = frozenset("""
cheers thanks thank thx ta regards kind best sincerely yours many love bye warm warmest
""".split())


def _before_closing(
    run: list[int], scored: list[tuple[int, int, str, float]], text: str
) -> list[int]:
    """A run cut before a line that starts with a closing word ("... RG21 5TT\n\nCheers\nBen")."""
    for k in range(1, len(run)):
        if scored[run[k]][2].lower() in _CLOSING_WORDS and "\n" in text[scored[run[k - 1]][1] : scored[run[k]][0]]:
            return run[:k]
    return run


def _address_run(run: list[int], scored: list[tuple[int, int, str, float]], text: str) -> list[int]:
    """An address run trimmed in turn: a time's minutes at its start, a name line above a
    blank line, a closing line and what follows, punctuation at its ends."""
    for trim in (_after_time, _after_blank_line, _before_closing):
        if not run:
            return run
        run = trim(run, scored, text)
    return _strip_punct(run, scored)


def in_spans(toks: list[tuple[int, int, str]], spans: list[tuple[int, int]]) -> set[int]:
    """The indices of the tokens that lie wholly inside one of ``spans`` (the rules'
    matches): by bisection over the token starts, so a message of many matches stays
    linear."""
    if not spans:
        return set()
    starts = [t[0] for t in toks]
    out = set()
    for rs, re_ in spans:
        i = bisect.bisect_left(starts, rs)
        while i < len(toks) and toks[i][1] <= re_:
            out.add(i)
            i += 1
    return out


# Prepositions and conjunctions, which name no street ("at 9 en route", "2 of them"; an
# article can: "5 the paddock").
_FUNCTION_WORDS = frozenset("of to in on at by for from with and or en".split())


_CALENDAR_WORDS = frozenset("""
january february march april may june july august september october november december
jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday
saturday sunday mon tue tues wed thu thur thurs fri sat sun am pm th st nd rd of
""".split())


def address_like(toks: list[str]) -> bool:
    """A number and a word, and a street name besides the street type: some word that is
    not a street type ("12 oak st", "via roma 5"), or one before the last that is ("22
    pine ave", "3 park lane"); not "10 ways" or "2012 ford" (no street name)."""
    from pii import detector as pii

    # (position, word) of the words that can name a street
    named = [
        (i, w) for i, t in enumerate(toks)
        if len(t) > 1 and t[0].isalpha() and (w := t.lower().rstrip(".")) not in _FUNCTION_WORDS
    ]
    words = [w for _, w in named]
    if words and _CALENDAR_WORDS.issuperset(words):
        return False  # a date ("3 Dec", "on 14 March"), not "12 May Street"
    # The street's first word comes after a unit and its number ("flat 2, 9 mill lane").
    street = [
        w for i, w in named
        if not (w in _NO_STREET_NAMES and i + 1 < len(toks) and toks[i + 1][0].isdigit())
    ]
    return any(t[0].isdigit() for t in toks) and (
        any(w not in pii._EN_STREET_SET for w in words)
        or (len(street) >= 2 and street[0] not in _NO_STREET_NAMES)
    )


class TokenModel:
    """A logistic model: the sum of the weights of a word's features, plus a bias."""

    def __init__(
        self, weights: dict[str, float], bias: float, threshold: float, join: float,
        kind: str = "PERSON", gate: float = -math.inf, pieces: dict[str, list[float]] | None = None,
    ) -> None:
        self.kind = kind
        # word piece -> its value at each of VECTOR_POSITIONS (the embedding weights
        # folded in by the trainer); None: a model without them.
        self.pieces = pieces
        self._cut = piece_tokenizer(list(pieces)) if pieces else None
        self._values: dict[str, tuple[float, ...]] = {}
        self.w = weights
        self.bias = bias
        self.threshold = threshold  # on the logit
        self.join = join  # the logit at which a word next to a name joins it
        # Words whose own score is under the gate are not scored in context: measured on
        # the training tokens, the gate skips at most 1% of the words the whole model
        # finds (see tools/pii_token_models.py).
        self.gate = gate
        self._own: dict[tuple[str, ...], float] = {}
        self._tok_score: dict[tuple[str, bool, bool], float] = {}
        self._seen: dict[bool, set[str]] = {False: set(), True: set()}
        self._passing: dict[bool, set[str]] = {False: set(), True: set()}

    @classmethod
    @functools.cache
    def load(cls, path: Path = MODEL, kind: str = "PERSON") -> TokenModel:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            d = json.load(f)[kind]
        vec = d.get("vectors")
        return cls(d["weights"], d["bias"], d["threshold"], d["join"], kind, d["gate"],
                   vec["pieces"] if vec else None)

    def word_values(self, tok: str) -> tuple[float, ...]:
        """A token's embedding terms at each of VECTOR_POSITIONS: the mean of its word
        pieces' values (cached per lower-cased token; zeros without vectors)."""
        if self._cut is None:
            return _NO_VALUES
        low = tok.lower()
        v = self._values.get(low)
        if v is None:
            pieces = self.pieces
            rows = [pieces[p] for p in self._cut(low) or ["[UNK]"]]
            v = tuple(sum(col) / len(rows) for col in zip(*rows, strict=True))
            if len(self._values) > 200_000:
                self._values.clear()
            self._values[low] = v
        return v

    def _context_values(self, toks: list[tuple[int, int, str]], i: int) -> float:
        """The embedding terms of the two tokens on each side of token ``i``."""
        n = len(toks)
        total = 0.0
        for k in range(1, len(VECTOR_OFFSETS)):
            j = i + VECTOR_OFFSETS[k]
            if 0 <= j < n:
                total += self.word_values(toks[j][2])[k]
        return total

    def own_score(self, own: tuple[str, ...]) -> float:
        """The bias plus the weights of a word's own features (cached per feature set)."""
        sc = self._own.get(own)
        if sc is None:
            w = self.w
            sc = self._own[own] = self.bias + sum(w.get(f, 0.0) for f in own)
            if len(self._own) > 200_000:
                self._own.clear()
        return sc

    def _word_passes(self, word: str, caseless: bool) -> bool:
        """Whether a word can pass the gate, wherever it stands."""
        if len(word) > 3 and word[-2:].lower() in _POSSESSIVE:
            word = word[:-2]
        return (person_candidate(word.lower()) or _initial(word, caseless)) and max(
            self.own_score(person_own(word, caseless, bos)) for bos in (False, True)
        ) + self.word_values(word)[0] >= self.gate

    def may_find(self, text: str, caseless: bool) -> bool:
        """False when no token of ``text`` can be scored over the gate: a cheaper test
        than tokenizing, which most messages fail. PERSON: by set operations over the
        message's words against the words seen before (each classified once). ADDRESS: a
        number of 1 to 6 digits (``pii.detect`` asks a finer question first)."""
        if self.kind != "PERSON":
            return _SHORT_NUMBER_RE.search(text) is not None
        words = (_WORD_ASCII_RE if text.isascii() else _WORD_RE).findall(text)
        seen, passing = self._seen[caseless], self._passing[caseless]
        if seen.issuperset(words):  # every word classified before (most messages)
            return not passing.isdisjoint(words)
        if len(seen) > 500_000:  # bounded memory on endless new words
            seen.clear()
            passing.clear()
        for word in set(words) - seen:
            if self._word_passes(word, caseless):
                passing.add(word)
                if len(word) > 3 and word[-2:].lower() in _POSSESSIVE:
                    passing.add(word[:-2])  # the token tokenize makes of it
            seen.add(word)
        return not passing.isdisjoint(words)

    def token_scores(
        self, text: str, caseless: bool, rule_spans: list[tuple[int, int]],
        blocked: list[tuple[int, int]] = (), toks: list[tuple[int, int, str]] | None = None,
    ) -> list[tuple[int, int, str, float]]:
        """(start, end, token, logit) of each candidate word (see ``candidates``);
        ``blocked``: spans of identifiers already found (no address inside them);
        ``toks``: ``tokenize(text)``, when the caller has it (then ``may_find`` was
        asked already)."""
        if toks is None:
            if not self.may_find(text, caseless):
                return []
            toks = tokenize(text)
        if self.kind == "PERSON":
            return self._person_scores(text, caseless, rule_spans, toks)
        cands = candidates(toks, self.kind, blocked)
        if not cands:
            return []
        info = address_info(toks, caseless, cands)
        ruled = in_spans(toks, rule_spans)
        out = []
        w = self.w
        for i in cands:
            s, e, tok = toks[i]
            base = self.own_score(address_own(tok, caseless))
            if base < self.gate:
                continue
            ctx = address_context(toks, i, i in ruled, text, info)
            out.append((s, e, tok, base + sum(w.get(f, 0.0) for f in ctx)))
        return out

    def _person_scores(
        self, text: str, caseless: bool, rule_spans: list[tuple[int, int]],
        toks: list[tuple[int, int, str]],
    ) -> list[tuple[int, int, str, float]]:
        """token_scores for PERSON, the candidates of ``candidates`` found inline: each
        word's own score is looked up once per (word, case, sentence start)."""
        cache = self._tok_score
        if len(cache) > 500_000:
            cache.clear()
        out = []
        w = self.w
        passing = self._passing[caseless]  # see may_find: no other word can be scored
        ruled = in_spans(toks, rule_spans)
        for i, (s, e, tok) in enumerate(toks):
            if tok not in passing:
                continue
            bos = not i or toks[i - 1][2] in _SENT_END
            key = (tok, caseless, bos)
            base = cache.get(key)
            if base is None:
                ok = tok != "'s" and (person_candidate(tok.lower()) or _initial(tok, caseless))
                base = (
                    self.own_score(person_own(tok, caseless, bos)) + self.word_values(tok)[0]
                    if ok else -math.inf
                )
                cache[key] = base
            if base < self.gate:
                continue
            ctx = person_context(toks, i, caseless, i in ruled)
            score = base + sum(w.get(f, 0.0) for f in ctx)
            if self._cut is not None:  # weights with embedding terms
                score += self._context_values(toks, i)
            out.append((s, e, tok, score))
        return out

    def spans(
        self, text: str, caseless: bool, rule_spans: list[tuple[int, int]],
        blocked: list[tuple[int, int]] = (), toks: list[tuple[int, int, str]] | None = None,
    ) -> list[tuple[int, int]]:
        """Spans: runs of tokens over the threshold. Names: words separated by spaces only
        (or by the period of an initial: "J. Freeman"); addresses: tokens separated by
        spaces, line breaks, commas or periods, with a number and a street name. A token
        next to a run joins it at a lower threshold (``join``): "Tamila Musliyevich",
        where the rare family name alone is not convincing."""
        scored = self.token_scores(text, caseless, rule_spans, blocked, toks)
        n = len(scored)
        # No token of an identifier found before joins a run: the phone number on the
        # line after a postal address ("Canada 55559\n613-249-4460") is not its postcode.
        free = [not any(bs <= s and e <= be for bs, be in blocked) for s, e, *_ in scored] if blocked else None
        keep = [sc >= self.threshold for *_, sc in scored]

        person = self.kind == "PERSON"

        def adjacent(i: int, j: int) -> bool:
            gap = text[scored[i][1] : scored[j][0]]
            if person:  # on one line ("McDonald\n\nPodsreda" are two), or across a middle
                # initial ("Julio A McDonald", "anna r shah": "A", "I" and, without case,
                # every single letter are no candidates, so the initial is in the gap)
                if len(gap) <= 3 and (gap.isspace() or gap in (". ", ".")):
                    return "\n" not in gap
                m = _INITIAL_GAP_RE.fullmatch(gap)
                return m is not None and (caseless or m.group(1).isupper())
            return not gap or gap.isspace() or (len(gap) <= 3 and not gap.strip(" ,.\n"))

        # Grow each run by its neighbours over the join threshold: rightwards in one sweep,
        # leftwards in another (linear, however long the run).
        for i in range(1, n):
            if not keep[i] and keep[i - 1] and scored[i][3] >= self.join and adjacent(i - 1, i):
                keep[i] = True
        for i in range(n - 2, -1, -1):
            if (
                not keep[i] and keep[i + 1] and scored[i][3] >= self.join and adjacent(i, i + 1)
                # An address grows to the lines below it (town, country), not up onto the
                # line above ("Mia Lund\n12 Storgata 5": the addressee is no address).
                and (person or "\n" not in text[scored[i][1] : scored[i + 1][0]])
            ):
                keep[i] = True
        if free is not None:
            keep = [k and f for k, f in zip(keep, free, strict=True)]
        runs: list[list[int]] = []
        for i in range(n):
            if not keep[i]:
                continue
            if runs and runs[-1][-1] == i - 1 and adjacent(i - 1, i):
                runs[-1].append(i)
            else:
                runs.append([i])
        if not person:  # an address has a number and a word ("12 oak st", "via roma 5")
            runs = [_address_run(r, scored, text) for r in runs]
            runs = [r for r in runs if r and address_like([scored[i][2] for i in r])]
        return [(scored[r[0]][0], scored[r[-1]][1]) for r in runs]



