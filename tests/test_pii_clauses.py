"""The grammar rules for names (pii/clauses.py): the shipped lexicon they read, which words
may be a name there, and which clauses put one in a person's place. The per-phrasing table
of tests/test_pii_eval.py holds whole messages through ``pii.detect``."""

from __future__ import annotations

import pytest

from pii import clauses as C
from pii import detector as pii


def test_the_lexicon_reads_a_words_grammar() -> None:
    lex = C.lexicon()
    assert "Z" in lex["loses"] and "D" in lex["stole"] and "D" in lex["got"]
    assert "B" in lex["use"] and "n" in lex["use"]  # a verb and a noun
    assert "n" in lex["grace"] and "a" in lex["harsh"] and "x" in lex["can"]
    assert "jake" not in lex and "todd" not in lex  # names are no English words
    assert all(form == form.lower() and form.isalpha() for form in lex)


def test_the_candidate_set_is_what_candidate_passes() -> None:
    """``_candidates`` inlines ``_candidate``'s tests (for speed): they must agree."""
    from pii.model import table

    slow = frozenset(w for w in table() if C._candidate(w)) | C._WORD_NAMES
    assert C._candidates()[0] == slow


@pytest.mark.parametrize("word", ["jake", "todd", "paige", "wes", "kofi", "ben"])
def test_a_first_name_rare_in_english_is_a_candidate(word: str) -> None:
    assert C._candidate(word) and word in C._candidates()[0]


@pytest.mark.parametrize(
    "word",
    [
        "will", "mark", "june",  # too common in English
        "grace", "pin", "visa", "harsh",  # English words (in the lexicon)
        "chase", "swift", "sydney", "kenya", "jan", "max",  # banks, networks, places, ...
        "ive", "haha", "g-lack",  # chat, a hyphenated fragment
    ],
)  # fmt: skip
def test_a_common_word_bank_place_or_month_is_no_candidate(word: str) -> None:
    """Not for the rules of rare names; the given names among them ("will", "grace") only
    for the stricter rules of ``_word_name``."""
    assert not C._candidate(word)
    assert (word in C._candidates()[0]) == (word in C._WORD_NAMES)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("what if jake loses the card", ["jake"]),
        ("i know that todd never got it", ["todd"]),  # an adverb before the verb
        ("todd, the card, and a fee", []),  # a pause: no verb follows
        ("jake", []),  # no clause
        ("did paige get paid", ["paige"]),
        ("paige get paid", []),  # a base form is no finite verb
        ("can paige limit my card", ["paige"]),  # a verb and a noun, before its object
        ("can paige limit", []),
        ("i sent wes the money", ["wes"]),
        ("i sent wes home", []),
        ("add wes as a user", ["wes"]),
        ("lol ok wes", ["wes"]),
        ("ok wes is fine", ["wes"]),  # a subject after "ok"
        ("hey, wes here", ["wes"]),
        ("the cleaner, wes, is late", ["wes"]),
        ("I think Jake stole it", ["Jake"]),  # with case too
        ("we talked with wes", ["wes"]),
        ("we walked with wes", []),  # not a verb of talking
        ("hey wes", ["wes"]),
        ("fine\nwes: hi", ["wes"]),
        ("i typed wes: hi", []),  # not at a line's start
        ("i said wes: hi", ["wes"]),  # after a verb of saying (``_cued_names``)
        ("wes, my brother, paid", ["wes"]),
        ("wes, my card", []),
    ],
)
def test_clauses(text: str, names: list[str]) -> None:
    assert [text[s:e] for s, e in C.clause_name_spans(text)] == names


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("so mark told me", ["mark"]),
        ("the mark told me", []),  # a determiner: the word
        ("will says hi", ["will"]),
        ("will pay later", []),  # a modal before its verb
        ("Will said hi", ["Will"]),
        ("I will said nothing", []),  # with case, "will" is the word
        ("ask will about it", ["will"]),
        ("ask will", []),  # nothing told after it
        ("remind the bill to", []),
        ("thanks, grace", ["grace"]),
        ("thanks grace period", []),
    ],
)
def test_given_names_that_are_common_words(text: str, names: list[str]) -> None:
    assert [text[s:e] for s, e in C.clause_name_spans(text)] == names


def test_each_clause_detection_names_its_source() -> None:
    assert [(d.value, d.source) for d in pii.detect("i think todd stole my card")] == [
        ("todd", "name-clause")
    ]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        # any name (one the name table does not hold too) after a strong cue
        ("i'm so jealous! said khasanbek to jessica", ["khasanbek", "jessica"]),
        ("i said to wes that it is fine", ["wes"]),
        ("producer nate p. sage explained it", ["nate p. sage"]),
        ("Tennis player Aislinn de Meer was detained", ["Aislinn"]),
        ("the film, starring ompoly boros, is out", ["ompoly boros"]),
        ("i want to remove my kid pomeroy from the account", ["pomeroy"]),
        ("my great grandmother was called kirie takuda", ["kirie takuda"]),
        ("between him and waltruda's kid", ["waltruda"]),
        ("Yesterday John called me", ["John"]),  # a common given name as a subject
        # a name the table holds after a weaker cue
        ("the song was sung by layla gairbekov in 1982", ["layla gairbekov"]),
        ("maybe it's under olga petrova", ["olga petrova"]),
        ("please change it to kaya smith", ["kaya smith"]),
        ("we need to add maria lopez as guardian", ["maria lopez"]),
        ("gerald had given marilyn his address", ["gerald", "marilyn"]),
        ("Don't go to town, Megan!", ["Megan"]),
        # and not
        ("the song was sung by salarymen", []),  # no name the table holds
        ("why is verifaction required", []),  # a typo, not a name
        ("add cashback to my card", []),
        ("we need to add lauchlan duncan as guardian", []),  # no name the table holds
        ("change it to gbp", []),
        ("i was told by support to wait", []),
        ("my wife's card was declined", []),
        ("the payee was called starbucks", []),
        ("thanks, bye!", []),
        ("great service, thanks!", []),
        ("i'm buying my son bertie a starter home", ["bertie"]),  # "a" is no initial
        ("tennis player Madeline macmahon", ["Madeline"]),  # with case, a lower word is no name
    ],
)
def test_names_after_a_cue(text: str, names: list[str]) -> None:
    assert [text[s:e] for s, e in C.clause_name_spans(text)] == names
