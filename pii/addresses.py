"""Rule-based ADDRESS spans: a house number, street words and a street type (USPS
Publication 28 suffixes and British types; French voie types; German ``-straße``/``-weg``/...
compounds), unit prefixes (Flat, Apt., Suite, Studio) and an optional trailing city.

The ADDRESS token model (``pii.model``) reads these spans as a feature, and
``pii.detector`` keeps them on their own in text with case (without case only those with a
street name besides the type). ``rule_address_spans`` is the entry point for training;
``_address_rules`` (gated by ``_street_starts``) and ``_may_hold_address`` (whether the
model need read a message at all) are what ``detect`` runs."""

from __future__ import annotations

import functools
import re

from pii.casing import Words, _by_first_char, _case_forms, _lower_is_ignorecase, message_words
from pii.names import _STOP_LOWER

# --------------------------------------------------------------------------- addresses

# USPS Publication 28, Appendix C1 street suffixes (primary names, common abbreviations and
# the plurals in use), and British street types.
_EN_STREET = """
alley aly anex annex arcade avenue ave av bayou beach bend bluff bluffs bottom boulevard
blvd branch bridge brook brooks burg burgs bypass camp canyon cape causeway center
centre centers circle cir circles cliff cliffs club common commons corner corners course
court ct courts cove coves creek crescent crest crossing crossroad crossroads curve dale
dam divide drive dr drives estate estates expressway extension extensions fall falls
ferry field fields flat flats ford fords forest forge forges fork forks fort freeway
garden gardens gateway glen glens green greens grove groves harbor harbors haven heights
highway hwy hill hills hollow inlet island islands isle junction junctions key keys
knoll knolls lake lakes land landing lane ln light lights loaf lock locks lodge loop
mall manor manors meadow meadows mews mill mills mission motorway mount mountain
mountains neck orchard oval overpass park parks parkway parkways pass passage path pike
pine pines place pl plain plains plaza point points port ports prairie radial ramp ranch
rapid rapids rest ridge ridges river road rd roads route row rue run shoal shoals shore
shores skyway spring springs spur spurs square squares station stravenue stream street
st streets summit terrace ter throughway trace track trafficway trail trailer tunnel
turnpike underpass union unions valley valleys via viaduct view views village villages
ville vista walk walks wall way ways well wells close gate gates wharf yard quay
parade vale croft approach broadway embankment esplanade promenade wynd brae
""".split()
_FR_VOIE = ["rue", "avenue", "av.", "boulevard", "bd", "place", "chemin", "allée", "allee", "impasse", "quai", "route", "cours", "square", "passage", "voie", "sentier", "rond-point"]  # fmt: skip
_DE_SUFFIX = ["straße", "strasse", "str.", "weg", "gasse", "platz", "allee", "ring", "damm", "ufer", "chaussee", "steig", "pfad", "markt", "berg", "hof", "garten"]  # fmt: skip
_UNIT = _by_first_char(["flat", r"apt\.?", "apartment", "suite", r"ste\.?", "unit", "studio", "room", "#"])  # fmt: skip
_UNIT_FIRST = _by_first_char(["flat", r"apt\.?", "apartment", "suite", "unit", "studio"])
_VOIE_BARE = _by_first_char(["rue", "avenue", "boulevard", "chemin", "allée", "impasse", "quai"])
_WORD = r"[^\W\d_][\w'’-]*+"  # any word (caseless texts); possessive: see pii.names._TOK1
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'’-]*+"  # a capitalized word
_SUFFIX_EN = f"(?i:{_by_first_char(map(re.escape, sorted(_EN_STREET, key=len, reverse=True)))})"
_VOIE_FR = f"(?i:{_by_first_char(map(re.escape, _FR_VOIE))})"
_DE_END = f"(?i:{_by_first_char(map(re.escape, _DE_SUFFIX))})"


def _address_res(word: str, caseless: bool) -> tuple[re.Pattern[str], ...]:
    city = r"(?:,\s*(?!I\b)" + word + r"(?:\s+(?!I\b)" + word + r"){0,2})?"
    en = re.compile(
        rf"(?<![\w-])(?:(?i:{_UNIT})\s*[0-9]{{1,4}}[A-Za-z]?,?\s+)?[0-9]{{1,6}}[A-Za-z]?\s+"
        rf"(?:{word}\s+){{0,3}}{_SUFFIX_EN}\b\.?"
        rf"(?:,?\s+(?i:{_UNIT})\s*[0-9]{{1,5}}[A-Za-z]?)?{city}"
    )
    # Unit first ("Flat 17 Janet Meadows"): the unit number, then street words and a suffix.
    en_unit = re.compile(
        rf"(?<![\w-])(?i:{_UNIT_FIRST})\s*[0-9]{{1,4}}[A-Za-z]?,?\s+"
        rf"(?:{word}\s+){{1,3}}{_SUFFIX_EN}\b\.?{city}"
    )
    particle = r"(?:(?:de la|de l'|du|des|de|d'|la|le|l')\s*)?"
    w = rf"(?!I\b|I['’]){word}"
    fr_body = rf"{_VOIE_FR}\s+{particle}{w}(?:\s+{particle}{w}){{0,3}}"
    bare = rf"(?i:{_VOIE_BARE})\s+{particle}{w}(?:\s+{particle}{w}){{0,3}}"
    number = r"[0-9]{1,4}(?:\s?(?:bis|ter))?,?\s+"
    fr = re.compile(rf"(?<![\w-])(?:{number}{fr_body}" + ("" if caseless else rf"|{bare}") + ")")
    de_name = r"[^\W\d_][\w'’-]*?" if caseless else r"[A-ZÄÖÜ][\w'’-]*?"
    de = re.compile(
        rf"(?<![\w-])(?:(?!I\b){de_name}[ -]){{0,{0 if caseless else 2}}}?(?:{de_name}-)*{de_name}{_DE_END}\s*[0-9]{{1,4}}[a-zA-Z]?(?:\s?[-/]\s?[0-9]{{1,4}})?"
        r"(?![\w])"
    )
    return en, en_unit, fr, de


_ADDRESS_CASED = _address_res(_CAP, caseless=False)
_ADDRESS_CASELESS = _address_res(_WORD, caseless=True)


# Searched in the lower-cased text: Python's re tries a case-insensitive alternation at
# every position (5 us a message); a case-sensitive one is found by a literal-prefix scan.
_VOIE_HINT_RE = re.compile(r"(?:rue|avenue|boulevard|chemin|all[ée]e|impasse|quai)\s")
# A German street suffix before a house number ("hauptstr. 5"), in the lower case.
_DE_HINT_RE = re.compile("(?:" + "|".join(map(re.escape, _DE_SUFFIX)) + r")\s*[0-9]")
_EN_STREET_SET = frozenset(_EN_STREET)
_LETTER_RUN_RE = re.compile(r"[^\W\d_]+")
_UNIT_SET = frozenset(("flat", "apt", "apartment", "suite", "unit", "studio"))  # en_unit's
# A house or unit number before a space ("12b ", "12, ", "12bis "): in every match of the
# English patterns and of the French one but its bare form ("rue de ...").
_HOUSE_NUMBER_RE = re.compile(r"[0-9](?:[a-z]|bis|ter)?,?\s")
# The first run of letters of each French voie type ("av." -> "av", "rond-point" -> "rond").
_FR_VOIE_SET = frozenset(re.match(r"[^\W\d_]+", v).group() for v in _FR_VOIE)
_STREET_WORDS = _EN_STREET_SET | _UNIT_SET | _FR_VOIE_SET
# Every byte but the ASCII letters -> a space: letter runs by one table pass and a split.
_LETTERS_ONLY = bytes(b if b < 128 and chr(b).isalpha() else 32 for b in range(256))


# The gates below only skip work: each returns False only when its patterns cannot match
# (tests/test_pii.py checks detections with every gate open). _street_starts, like
# pii.names._cue_starts, reads the lower case, so it stays open where that does not match
# like re.IGNORECASE.


def _words(text: str, low: str) -> list[str]:
    """The lower-cased words (runs of letters) the gates below look up."""
    if text.isascii():
        return low.encode().translate(_LETTERS_ONLY).decode().split()
    return _LETTER_RUN_RE.findall(low)


_NO_STREET = (None, None, None, None)


def _street_starts(
    text: str, low: str, caseless: bool, digits: tuple[int, int] | None
) -> tuple[int | None, ...]:
    """Where each address pattern (en, en_unit, fr, de) can first match; None: nowhere.
    Each needs its street word, a whole word for the English and French ones (spaces or a
    word's end around it) and for German a word ending before a house number ("hauptstr.
    5"); en_unit also a unit word; all but the bare French form (only in text with case)
    a house number. ``digits``: where the first and the last ASCII digit are ((0,
    len(text)) if unknown), None if there is none."""
    if not _lower_is_ignorecase(text):
        return 0, 0, 0, 0
    if digits is None:  # only the bare French form can match, with a voie type ("rue de ...")
        return (None, None, 0, None) if not caseless and _VOIE_HINT_RE.search(low) else _NO_STREET
    first_digit, last_digit = digits
    # German: a suffix, spaces, a digit. The suffix ends where the spaces before some digit
    # start, so not before they start in front of the first one; it has 8 letters at most.
    de_from = max(len(low[:first_digit].rstrip()) - 8, 0)
    de = _DE_HINT_RE.search(low, de_from, last_digit + 1) is not None
    house = _HOUSE_NUMBER_RE.search(low, first_digit, last_digit + 6)  # 6 characters at most
    if house is None:
        fr = not caseless and _VOIE_HINT_RE.search(low) is not None
        return None, None, 0 if fr else None, 0 if de else None
    hits = _STREET_WORDS.intersection(_words(text, low))  # most messages hold none
    en = not hits.isdisjoint(_EN_STREET_SET)
    en_unit = en and not hits.isdisjoint(_UNIT_SET)
    fr = not hits.isdisjoint(_FR_VOIE_SET)
    # An English match starts at its first number (at most 5 digits before the house hint
    # of its last one) or at a unit word before it: 9 letters at most, and spaces.
    first = max(len(low[: max(house.start() - 5, 0)].rstrip()) - 9, 0)
    return first if en else None, first if en_unit else None, 0 if fr else None, 0 if de else None


def _address_rules(
    text: str, scan: str, low: str, caseless: bool, digits: tuple[int, int] | None
) -> list[tuple[int, int]]:
    """The spans the address patterns match (a feature of the address model)."""
    street = _street_starts(text, low, caseless, digits)
    if street is _NO_STREET:
        return []
    out = []
    for rx, start in zip(_ADDRESS_CASELESS if caseless else _ADDRESS_CASED, street, strict=True):
        if start is None:
            continue
        for m in rx.finditer(scan, start):
            if not caseless or not _STOP_LOWER.intersection(m.group().split()):
                out.append(m.span())
            elif (cut := m.group().rfind(",")) > 0 and not _STOP_LOWER.intersection(
                m.group()[:cut].split()
            ):
                out.append((m.start(), m.start() + cut))  # without the town ("london")
    return out


def rule_address_spans(text: str) -> list[tuple[int, int]]:
    """The spans the address patterns match in ``text`` (for training the address model)."""
    caseless, scan, low = _case_forms(text)
    return _address_rules(text, scan, low, caseless, (0, len(text)))


# A number that can be a house number: 1 to 6 digits, not an amount ("$20", "12.50",
# "1,250", "15%"). A superset of the numbers pii_model.candidates reads as house numbers
# (which also skips those after a currency sign and a space).
_HOUSE_NUMBER_HINT_RE = re.compile(r"(?<![0-9.,$£€¥₹])[0-9]{1,6}(?![0-9%]|[.,][0-9])")


def _may_hold_address(text: str, found: list[tuple[int, int, str]]) -> bool:
    """Whether some number of ``text`` can be a house number outside the identifiers
    found: the address model reads no other message."""
    for m in _HOUSE_NUMBER_HINT_RE.finditer(text):
        p = m.start()
        if not any(s <= p < e for s, e, _ in found):
            return True
    return False


# --------------------------------------------------------------------------- address parts
# Parts of a postal address the patterns and the model leave out, read only in a message
# where an address was found: the postcode on a country's line ("France 31786"), a first
# number before the found one ("998 5 rue de Raymond Poincaré": building and house), the
# second street of an intersection ("86 Pavlou Drandaki St. and Luke Throughway"), and the
# town after a comma that the name model read as a name ("12 rue Nationale, Paris").

# A line's end: a line break, the two characters "\n" of an escaped export, or the end.
_LINE_END = r"[ \t]*(?=\n|\\n|$)"
_POSTCODE_LINE_RE = re.compile(
    r"([^\W\d_][^\W\d_ .'-]*(?:[ .'-]+[^\W\d_]+){0,3})[ \t,]+(\d{4,6})" + _LINE_END
)
_COMMA_RE = re.compile(r"[ \t]*,[ \t]*")
_TOWN_END_RE = re.compile(r"[ \t]*(?:[.,;!?)]|\n|\\n|\d|$)")
_NUMBER_BEFORE_RE = re.compile(r"(?:^|(?<=[\s(:>}]))(\d{1,5})[ \t]+$")
_SECOND_STREET_RE = re.compile(
    r"[ \t.,]*(?:st\.?|street)?[ \t]*(?:and|&)[ \t]+((?:[^\W\d_][\w'’.-]*[ \t]+){1,3}?(?:"
    + "|".join(sorted(map(re.escape, _EN_STREET), key=len, reverse=True))
    + r"))(?![\w'’-])",
    re.IGNORECASE,
)


# A postal address's lines after its street: line breaks (as written or escaped "\\n",
# which upper-casing makes "\\N"), then what a form or an export puts in front ("}} ").
_NEXT_LINE_RE = re.compile(r"[ \t,]*(?:(?:\n|\\[nN])[ \t]*)+[^\w\n\\]{0,4}")
_LINE_STOP_RE = re.compile(r"[ \t]*(?:\n|\\[nN]|$)")
_UNIT_LINE_RE = re.compile(
    r"(?i:suite|ste\.?|apt\.?|apartment|unit|flat|room|floor|p\.?\s?o\.?\s?box)\s*#?\d{1,5}[A-Za-z]?"
)
# A town: one to six words of letters (inner hyphens, apostrophes, slashes, a dot after an
# abbreviation), the first a capital in text with case, then maybe a region code and a
# postcode ("San Giovanni Di Casarsa PN 33072", "Vale Covo LE 2540-742").
_POSTCODE = r"(?:\d{4,6}(?:-\d{3,4})?|[A-Z]{1,2}\d[A-Z\d]?\s?\d[A-Z]{2})"
_TOWN_LINE_RE = re.compile(
    r"([^\W\d_][\w'’./-]*(?:[ \t]+[^\W\d_][\w'’./-]*){0,5}?)(?:[ \t,]+([A-Z]{2,3}[ \t]+)?("
    + _POSTCODE
    + "))?"
)


# What follows a street on the same line: a direction ("w"), then after a comma a town of
# up to three words and a region code before a postcode ("10 downing st, london sw1a
# 2aa", "88 queen st w, toronto on m5h 2n2", "1600 amphitheatre pkwy, mountain view, ca
# 94043"), or the postcode first ("hauptstrasse 5, 10115 berlin"). The postcode (US ZIP,
# British, Canadian, or 4 to 6 digits after a town) anchors it: a town alone is left out.
_TOWN_WORD = (
    r"(?!(?i:and|or|to|but|then|so|please|instead|because|not|my|your|our|is|are|was|it|at"
    r"|call|ring|phone|tel|mobile|number|text)\b)[^\W\d_][\w'’-]*"
)
_TAIL_POSTCODE = (
    r"(?:[0-9]{5}(?:-[0-9]{4})?|[A-Za-z]{1,2}[0-9][A-Za-z0-9]?[ \t]?[0-9][A-Za-z]{2}"
    r"|[A-Za-z][0-9][A-Za-z][ \t]?[0-9][A-Za-z][0-9]|[0-9]{4,6})"
)
_TAIL_RE = re.compile(
    r"(?i:[ \t]+(?:n|s|e|w|ne|nw|se|sw|north|south|east|west)\b\.?)?"
    rf"[ \t]*,[ \t]*(?:{_TOWN_WORD}(?:[ \t]+{_TOWN_WORD}){{0,2}}[ \t]*,?[ \t]+"
    rf"(?:[A-Za-z]{{2,3}}[ \t]+)?{_TAIL_POSTCODE}|[0-9]{{4,6}}[ \t]+{_TOWN_WORD})(?![\w-])"
)
# A British postcode's second half after a span that ends with its first ("... sw1a").
_OUTWARD_END_RE = re.compile(r"(?<![\w-])[A-Za-z]{1,2}[0-9][A-Za-z0-9]?$")
_INWARD_RE = re.compile(r"[ \t]?[0-9][A-Za-z]{2}(?![\w-])")


# A town alone after a street and a comma: up to three words, the longest run that the
# place names of libphonenumber's geocoder hold ("42 mg road, bangalore", "12 oak st,
# mountain view").
_TOWN_TAIL_RE = re.compile(
    r"[ \t]*,[ \t]*([^\W\d_][\w'’-]*)(?:[ \t]+([^\W\d_][\w'’-]*))?(?:[ \t]+([^\W\d_][\w'’-]*))?"
)


@functools.cache
def _place_names() -> frozenset[str]:
    """The English place names of libphonenumber's geocoder (its areas' descriptions,
    "Bangalore", "Mountain View, CA": each part, lower case; 36,000), without English
    words ("reading", "bath", "mobile": the lexicon of ``pii.clauses``)."""
    from phonenumbers.geodata import GEOCODE_DATA

    from pii.clauses import lexicon

    lex = lexicon()
    out = set()
    for names in GEOCODE_DATA.values():
        for part in names.get("en", "").split(","):
            if (p := part.strip().lower()) and p not in lex and not p[:1].isdigit():
                out.add(p)
    return frozenset(out)


def _street_tail(text: str, e: int, taken: list[tuple[int, int]]) -> int:
    """Where an address that ends at ``e`` ends with its town and postcode on the same
    line (see ``_TAIL_RE``), with its postcode's second half, or with a town the geocoder
    knows (``_TOWN_TAIL_RE``); not over another type's span (``taken``: "12 oak st, london
    020 7946 0958" ends before the phone number)."""
    m = _INWARD_RE.match(text, e) if _OUTWARD_END_RE.search(text, max(e - 4, 0), e) else None
    if m is None and (m := _TAIL_RE.match(text, e)) is None:
        if (m := _TOWN_TAIL_RE.match(text, e)) is None:
            return e
        places = _place_names()
        words = [w for w in m.groups() if w]
        end = next(
            (m.end(k + 1) for k in range(len(words) - 1, -1, -1)
             if " ".join(words[: k + 1]).lower() in places),
            None,
        )  # fmt: skip
        if end is None:
            return e
        return e if any(ts < end and e < te for ts, te in taken) else end
    return e if any(ts < m.end() and e < te for ts, te in taken) else m.end()


def _line_at(text: str, pos: int) -> tuple[int, int] | None:
    """The next line after ``pos`` (past the line breaks and a form's marks), if ``pos``
    ends a line."""
    if (m := _NEXT_LINE_RE.match(text, pos)) is None or m.end() == pos:
        return None
    end = _LINE_STOP_RE.search(text, m.end()).start()
    return (m.end(), end) if end > m.end() else None


def _block_end(text: str, e: int) -> int:
    """Where the postal address that ends a line at ``e`` ends: past its unit line, and
    past its town line when a country's line follows it or the town carries a postcode,
    and past that country's line ("178 Klímova 702\n Apt. 908\n Vlastejovice\n Czech
    Republic 40036"). A line that is none of these ends it."""
    line = _line_at(text, e)
    if line and _UNIT_LINE_RE.fullmatch(text, *line):
        e, line = line[1], _line_at(text, line[1])
    if line is None or not (town := _TOWN_LINE_RE.fullmatch(text, *line)):
        return e
    if _is_country_line(text, *line):
        return line[1]
    if (after := _line_at(text, line[1])) and _is_country_line(text, *after):
        return after[1]
    return line[1] if town.group(3) else e


def _is_country_line(text: str, s: int, e: int) -> bool:
    """A country's name alone on its line, or followed by a postcode ("Czech Republic
    40036")."""
    words = text[s:e].rstrip(" \t.0123456789-").lower().split()
    return 0 < len(words) <= 4 and " ".join(words) in _country_names()


# "the corner of Mariatal 2 St. and Oskar Lane St.": both streets of an intersection, the
# second ending in a street type.
_CORNER_RE = re.compile(
    r"\bcorner[ \t]+of[ \t]+([^\n]{1,60}?[ \t]+(?:and|&)[ \t]+(?:[^\W\d_][\w'’.-]*[ \t]+){0,3}?(?:"
    + "|".join(sorted(map(re.escape, _EN_STREET), key=len, reverse=True))
    + r")\b\.?(?:[ \t]+st\b\.?)?)",
    re.IGNORECASE,
)


def corner_spans(text: str) -> list[tuple[int, int]]:
    """The intersections a message names ("the corner of 86 Pavlou Drandaki St. and Luke
    Throughway"): from the first street to the second's type."""
    return [m.span(1) for m in _CORNER_RE.finditer(text)]


@functools.cache
def _country_names() -> frozenset[str]:
    """The English names of the regions libphonenumber's geocoder knows (lower case)."""
    from phonenumbers.geocoder import _region_display_name
    from phonenumbers.geodata.locale import LOCALE_DATA

    names = {_region_display_name(code, "en") for code in LOCALE_DATA}
    return frozenset(n.lower() for n in names if n)


def address_parts(text: str, found: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """``found`` with the address parts above added (new spans) or joined (the number
    before an address that starts with one); unchanged without an ADDRESS in it."""
    addresses = [(s, e) for s, e, ent in found if ent.startswith("ADDRESS")]
    if not addresses:
        return found
    taken = [(s, e) for s, e, ent in found if not ent.startswith("ADDRESS")]  # other types
    # Spans an address's tail may not run over: not names, which an address beats anyway
    # ("12 oak st, sydney" where "sydney" was read as a name).
    hard = [(s, e) for s, e, ent in found if not ent.startswith(("ADDRESS", "PERSON"))]
    names = {s: e for s, e, ent in found if ent == "PERSON~name-model"}
    towns = set()
    out = []
    for s, e, ent in found:
        if ent.startswith("PERSON") and (s, e) in towns:
            continue
        if ent.startswith("ADDRESS"):
            e = _block_end(text, _street_tail(text, e, hard))  # town, postcode, next lines
            # The town after the street, read as a name ("12 rue X, Paris"): the address's.
            if (m := _COMMA_RE.match(text, e)) and (te := names.get(m.end())) and _TOWN_END_RE.match(
                text, te
            ):
                towns.add((m.end(), te))
                e = te
            m = _NUMBER_BEFORE_RE.search(text, max(s - 8, 0), s) if text[s].isdigit() else None
            if m and not any(ts < s and m.start(1) < te for ts, te in taken):
                s = m.start(1)
            if (m := _SECOND_STREET_RE.match(text, e)) and not any(
                ts < m.end(1) and m.start(1) < te for ts, te in taken
            ):
                out.append((m.start(1), m.end(1), "ADDRESS~address-parts"))
        out.append((s, e, ent))
    if "\n" in text or "\\n" in text or text.rstrip()[-1:].isdigit():
        countries = _country_names()
        for m in _POSTCODE_LINE_RE.finditer(text):
            words = m.group(1).lower().split()
            if any(" ".join(words[-k:]).strip(".") in countries for k in range(1, 4)) and not any(
                ts < m.end(2) and m.start(2) < te for ts, te in taken
            ):
                out.append((m.start(2), m.end(2), "ADDRESS~address-parts"))
    return _joined_addresses(out)


def _joined_addresses(found: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Overlapping ADDRESS spans as one (the union; the source of the longest): two
    readings of one address, one of which reaches its building number and the other its
    last line."""
    if sum(ent.startswith("ADDRESS") for *_, ent in found) < 2:
        return found
    out = [d for d in found if not d[2].startswith("ADDRESS")]
    joined: list[list] = []  # [start, end, source, longest]
    # By start; on a tie, in the order found (the model's reading before the pattern's).
    for s, e, ent in sorted((d for d in found if d[2].startswith("ADDRESS")), key=lambda d: d[0]):
        if joined and s < joined[-1][1]:
            last = joined[-1]
            last[1] = max(last[1], e)
            if e - s > last[3]:
                last[2:] = [ent, e - s]
        else:
            joined.append([s, e, ent, e - s])
    return out + [(s, e, ent) for s, e, ent, _ in joined]


# --------------------------------------------------------------------------- cued addresses

# Phrases that say a postal address follows: where someone lives ("i live at", "we're
# now on", "my address is", "moved to", "my new place is") or where something is sent
# ("send it to", "deliver the card to", "post it to"). In any case.
_RESIDENCE_CUE = (
    r"(?:i|we|they|he|she|mum|mom|dad)\s+(?:now\s+|still\s+|currently\s+)?"
    r"(?:live|lives|living|stay|stays|staying|reside|resides)\s+(?:at|on|in)"
    r"|(?:i['’]?m|we['’]?re|i\s+am|we\s+are)\s+(?:now\s+)?(?:at|on)"
    r"|address\s+(?:is\s+now|is|now|changed\s+to|has\s+changed\s+to)|address\s*:"
    r"|(?:moved|moving|move)\s+(?:house\s+)?to"
    r"|(?:place|house|flat|home|apartment)\s+is\s+(?:on|at)?"
)
_SENDING_CUE = (
    r"(?:send|sent|deliver|delivered|post|posted|ship|shipped|mail|mailed|forward|redirect)"
    r"\s+(?:it\s+|them\s+|this\s+|my\s+(?:new\s+)?card\s+|the\s+(?:new\s+)?card\s+)?to"
)
_NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).replace(" ", "|")
# A house number: "12", "12a", "23-25", "1/23", "no. 7", "twelve"; maybe a comma after.
_CUE_HOUSE = (
    rf"(?:no\.?\s*)?(?:[0-9]{{1,5}}[a-z]?(?:\s?[-/]\s?[0-9]{{1,5}}[a-z]?)?|(?:{_NUMBER_WORDS}))"
    r",?\s+"
)
# Street words: not a function word, a number or a pause
# ("at 9 en route": a time, and French "en" no street's word).
_CUE_WORD = (
    r"(?!(?:the|a|an|my|our|your|this|that|and|or|to|of|in|on|at|for|from|with|by|it|en)\b)"
    r"[^\W\d_][\w'’-]*"
)
# The street types that name a street without a number after a residence cue ("i live on
# maple street"): the common ones, not "park", "station", "way", "centre", "view" ...
_PLAIN_TYPES = (
    "street|st|road|rd|avenue|ave|lane|ln|drive|dr|close|crescent|grove|terrace|boulevard"
    "|blvd|court|ct|gardens|mews"
)
# Read in the lower case (a case-sensitive pattern runs several times faster than an
# IGNORECASE one), or, where lower-casing moves offsets ("İ"), in the text, ignoring case.
_CUE_SRC = rf"(?<![\w'’])(?:({_RESIDENCE_CUE})|{_SENDING_CUE})\s+(?:the\s+)?"
# Words that end a message after a named close, not its own ("5 the crescent now").
_END_WORDS = (
    r"(?:now|today|tonight|yesterday|tomorrow|please|thanks|too|again|already|anymore"
    r"|instead|though|sorry)\b"
)
# A house number and a street ending in a street type ("19 station approach") or a named
# close ("5 the paddock"), before a pause, the end or one of those words.
_CUED_BODY_SRC = (
    rf"{_CUE_HOUSE}(?:the\s+{_CUE_WORD}(?:\s+(?!{_END_WORDS}){_CUE_WORD})?"
    rf"(?=\s*(?:[,.!?;)]|$|\n)|\s+{_END_WORDS})"
    rf"|(?:{_CUE_WORD}\s+){{0,3}}{_SUFFIX_EN}\b\.?)"
)
# After where someone lives, a street without a number: "i live on maple street".
_STREET_BODY_SRC = rf"(?:{_CUE_WORD}\s+){{1,3}}(?:{_PLAIN_TYPES})\b\.?(?![\w'’-])"
_CUE_RES = {
    flags: (re.compile(_CUE_SRC, flags), re.compile(_CUED_BODY_SRC, flags),
            re.compile(_STREET_BODY_SRC, flags))
    for flags in (0, re.IGNORECASE)
}  # fmt: skip
# The words of the cues above, and what a match needs besides: a number (a digit or a
# number word) or a common street type.
_CUE_WORDS = frozenset("""
live lives living stay stays staying reside resides address moved moving move place house
flat home apartment send sent deliver delivered post posted ship shipped mail mailed forward
redirect i'm i’m im we're we’re am are
""".split())  # fmt: skip
_NUMBER_OR_TYPE = frozenset(_NUMBER_WORDS.split("|")) | frozenset(_PLAIN_TYPES.split("|"))
_DIGIT_RE = re.compile(r"[0-9]")


def cued_address_spans(
    text: str, low: str, has_digit: bool | None = None, words: Words | None = None
) -> list[tuple[int, int]]:
    """Addresses a phrase announces, which the patterns above leave out: a house number
    and a street whose words are all street types ("19 station approach"), a named close
    ("5 the paddock"), a number range, word or "no." ("23-25 high street", "twelve oak
    road", "no. 7 mill lane"), a comma after the number ("12, green street"); and, after
    where someone lives, a street without a number ("i live on maple street"; common
    street types only). ``low``: ``text``'s lower case; ``has_digit``: whether ``text``
    holds an ASCII digit, and ``words`` its ``message_words``, when the caller knows."""
    words = (words or message_words(text))[3]
    if _CUE_WORDS.isdisjoint(words):
        return []  # most messages
    if has_digit is None:
        has_digit = _DIGIT_RE.search(text) is not None
    if not has_digit and _NUMBER_OR_TYPE.isdisjoint(words):
        return []
    src, flags = (low, 0) if len(low) == len(text) else (text, re.IGNORECASE)
    cue_re, body_re, street_re = _CUE_RES[flags]
    out = []
    for m in cue_re.finditer(src):
        b = body_re.match(src, m.end())
        if b is None and m.group(1):  # where someone lives: maybe a street alone
            b = street_re.match(src, m.end())
        if b is not None:
            out.append(b.span())
    return out
