"""The PII detector on text nobody here wrote for it (data/pii_eval/SOURCE.md): the
held-back halves of the independent evaluation sets, per phrasing tables, false detections
on real Banking77 messages, and determinism.

The held-back halves were never tuned on. The floors below are the issue's targets where
the detector meets them; where it does not yet (see docs/BENCHMARKS.md, "PII on text
nobody here wrote"), the floor is the figure measured when the detector was last trained,
less a small margin, so that a regression fails the suite and the gap stays visible.
"""

from __future__ import annotations

import pytest

from pii import detector as pii
from pii import evaluation as E

TYPES = ("PERSON", "ADDRESS", "PHONE", "CARD", "EMAIL", "IBAN", "US_SSN", "IP_ADDRESS")
TARGET = {"PERSON": (0.95, 0.95), "ADDRESS": (0.90, 0.95), "PHONE": (0.95, 0.95),
          "CARD": (0.95, 0.95)}  # fmt: skip
TARGET_OTHER = (0.99, 0.99)  # EMAIL, IBAN, US_SSN, IP_ADDRESS


# Per phrasing, found and not found: the failures that opened this work (a cue verb's
# particle masked, names missed after casual phrasings, numbers before street words,
# national phone formats). (phrasing, text, expected detections as (type, value))
PHRASINGS = [
    ("call me", "you can call me sarah", [("PERSON", "sarah")]),
    ("call me", "please call me bob", [("PERSON", "bob")]),
    ("call me", "my friends call me sam", [("PERSON", "sam")]),
    ("i go by", "i go by brad", [("PERSON", "brad")]),
    ("i'm", "hi, i'm john", [("PERSON", "john")]),
    ("this is", "this is priya, my card is blocked", [("PERSON", "priya")]),
    ("it's ... here", "it's oluwaseun here", [("PERSON", "oluwaseun")]),
    ("'s account", "send $20 to steve's account", [("PERSON", "steve")]),
    ("sign-off", "ok thanks, ngozi", [("PERSON", "ngozi")]),
    ("relative", "my husband kemal lost his card", [("PERSON", "kemal")]),
    ("verb object", "please email ingrid the statement", [("PERSON", "ingrid")]),
    ("full name", "the account is under anna kowalski", [("PERSON", "anna kowalski")]),
    ("cased", "Hi, I'm Sarah and my card was stolen", [("PERSON", "Sarah")]),
    ("upper", "MY NAME IS JOHN SMITH", [("PERSON", "JOHN SMITH")]),
    ("signed", "i signed up last week", []),
    ("signed", "i signed off the payment", []),
    ("thanks", "thank you kindly", []),
    ("thanks", "thanks, bye", []),
    ("thanks", "i can not thank you enough", []),
    ("miss", "i had to miss work for this", []),
    ("number + street word", "7 ways to save", []),
    ("number + street word", "top 10 ways to budget", []),
    ("number + street word", "my 2012 ford was towed", []),
    ("name-like word", "will it arrive today", []),
    ("name-like word", "mark it as fraud", []),
    ("name-like word", "may i change my pin", []),
    ("name-like word", "hope you can help", []),
    ("this is", "this is urgent, i am stuck abroad", []),
    # The phrasing rules (pii/phrases.py): names that are English words after a phrasing
    # that names someone, common short names as objects, relations between commas, pairs.
    ("call me", "call me will and yes i tried restarting the app", [("PERSON", "will")]),
    ("i go by", "i go by hope on here", [("PERSON", "hope")]),
    ("relative", "my husband, will, topped up my card", [("PERSON", "will")]),
    ("verb object", "can you text bob the code", [("PERSON", "bob")]),
    ("verb object", "remind jim he owes me 20", [("PERSON", "jim")]),
    ("verb object", "i owe kofi 30 quid", [("PERSON", "kofi")]),
    ("pair", "jack and grace want to open a joint account", [("PERSON", "jack"), ("PERSON", "grace")]),
    ("with", "a joint account with leilani", [("PERSON", "leilani")]),
    ("call me", "call me back please", []),
    ("call me", "can you call me when it arrives", []),
    ("i go by", "i go by bus so i need contactless", []),
    ("i go by", "i go by train to work", []),
    ("i'm", "hi i'm having trouble with my card", []),
    ("i'm", "i'm on holiday and i need cash", []),
    ("verb object", "how do i pay bills online", []),
    ("verb object", "can you tell me my balance", []),
    ("with", "i want to pay with apple pay", []),
    ("with", "exchange from aud to gbp with my card", []),
    ("pair", "visa and mastercard both fail", []),
    ("possessive", "what is today's rate", []),
    # Names around a middle initial, before an address line, in lists, after a name kind.
    ("middle initial", "Maybe it's under Julio A McDonald", [("PERSON", "Julio A McDonald")]),
    ("middle initial", "the account is under anna r. shah", [("PERSON", "anna r. shah")]),
    ("middle initial", "i gave anna a card", [("PERSON", "anna")]),
    ("name line", "Julio Banks\nSlovakia", [("PERSON", "Julio Banks")]),
    (
        "name, then address",
        "Mrs. Renee Wuori Apt. 3 9176 Rosemont Avenue",
        [("PERSON", "Mrs. Renee Wuori"), ("ADDRESS", "Apt. 3 9176 Rosemont Avenue")],
    ),
    (
        "street named after someone",
        "the office is at Joaquin Suarez 2906, Montevideo",
        [("ADDRESS", "Joaquin Suarez 2906, Montevideo")],
    ),
    (
        "list",
        "our founders: Mattsson, Miller and Fields",
        [("PERSON", "Mattsson"), ("PERSON", "Miller"), ("PERSON", "Fields")],
    ),
    ("list", "i bought eggs, milk and bread", []),
    ("name kind", "what's your last name? wall", [("PERSON", "wall")]),
    ("name kind", "her maiden name is hague", [("PERSON", "hague")]),
    ("name kind", "my last name is too long for the form", []),
    ("named", "she named him marsilius", [("PERSON", "marsilius")]),
    ("named", "she named her cat after me", []),
    ("compound", "I am the Co-owner of the account", []),
    ("compound", "please ask Jean-Luc Picard", [("PERSON", "Jean-Luc Picard")]),
    ("said", "said hudson to me", [("PERSON", "hudson")]),
    ("said", "it said declined", []),
    (
        "address parts",
        "send it to 5 rue de la Paix, Paris. France 75002",
        [("ADDRESS", "5 rue de la Paix, Paris"), ("ADDRESS", "75002")],
    ),
    (
        "address parts",
        "she lives at 8826 482 Protea St, Middelburg",
        [("ADDRESS", "8826 482 Protea St, Middelburg")],
    ),
    (
        "address parts",
        "stop at the corner of 86 Pavlou Drandaki St. and Luke Throughway St.",
        [("ADDRESS", "86 Pavlou Drandaki St. and Luke Throughway St.")],
    ),
    ("address parts", "we moved to France 2024", []),
    # a town and postcode after the street, on its line (pii.addresses._street_tail)
    ("address tail", "send the card to 10 downing st, london sw1a 2aa",
     [("ADDRESS", "10 downing st, london sw1a 2aa")]),
    ("address tail", "i moved to 88 queen st w, toronto on m5h 2n2",
     [("ADDRESS", "88 queen st w, toronto on m5h 2n2")]),
    ("address tail", "ship it to 1600 amphitheatre pkwy, mountain view, ca 94043",
     [("ADDRESS", "1600 amphitheatre pkwy, mountain view, ca 94043")]),
    ("address tail", "my address is hauptstrasse 5, 10115 berlin",
     [("ADDRESS", "hauptstrasse 5, 10115 berlin")]),
    ("address tail", "Update it to 55 Station Rd, Cambridge CB1 2JW",
     [("ADDRESS", "55 Station Rd, Cambridge CB1 2JW")]),
    ("address tail", "send it to 12 oak st, and pay 10000 now", [("ADDRESS", "12 oak st")]),
    ("address tail", "Send it to 12 Oak St, then 50000 more", [("ADDRESS", "12 Oak St")]),
    ("address tail", "i live at 4 elm road, my number is 07700 900461",
     [("ADDRESS", "4 elm road"), ("PHONE", "07700 900461")]),
    ("address tail", "12 oak st, london 020 7946 0958",  # not over the phone number
     [("ADDRESS", "12 oak st, london"), ("PHONE", "020 7946 0958")]),
    # a town alone that libphonenumber's geocoder knows (no English word: not "reading")
    ("address tail", "i moved to 42 mg road, bangalore last month",
     [("ADDRESS", "42 mg road, bangalore")]),
    ("address tail", "send it to 12 oak st, thanks", [("ADDRESS", "12 oak st")]),
    # a street named by a street type ("pine", "park") before its own
    ("street type as name", "we moved from 14 oak ave to 22 pine ave",
     [("ADDRESS", "14 oak ave"), ("ADDRESS", "22 pine ave")]),
    ("street type as name", "i live at 3 park lane", [("ADDRESS", "3 park lane")]),
    ("street type as name", "it's a 2 way street", []),
    # a name line above an address block, a blank line between (the address starts after it)
    ("name above address", "kira mitchell\n\n992 ul. zagórna 55\n suite 502\n warszawa",
     [("PERSON", "kira mitchell"), ("ADDRESS", "992 ul. zagórna 55\n suite 502\n warszawa")]),
    # the family name after a name found
    ("family name after", "ask sarah brown about it", [("PERSON", "sarah brown")]),
    ("family name after", "i paid jake monday", [("PERSON", "jake")]),
    ("family name after", "text bob asap", [("PERSON", "bob")]),
    ("place", "my friend lives in stora vika", []),
    ("place", "we moved here from são paulo", []),
    ("place", "a trip to see anna", [("PERSON", "anna")]),
    ("function word", "none of the payments have gone through", []),
    ("function word", "nor do i remember the company", []),
    ("phone", "mobile: 730 064 218", [("PHONE", "730 064 218")]),
    ("phone", "call (73) 4746-3459", [("PHONE", "(73) 4746-3459")]),
    ("phone", "my number is 96 466712", [("PHONE", "96 466712")]),
    ("phone", "ring me on 07700 900461", [("PHONE", "07700 900461")]),
    ("amount", "i paid 1 250 euros on 12/03", []),
    ("address", "i live at 14 elm grove", [("ADDRESS", "14 elm grove")]),
    ("address", "send it to via roma 12, milano", [("ADDRESS", "via roma 12, milano")]),
    ("address", "The bus station is on Via Giberti 75", [("ADDRESS", "Via Giberti 75")]),
    # A name's other mentions, company names, postal address blocks, intersections, full
    # names and titles without case, lists of family names, amounts and brands.
    (
        "repeated",
        "Toby West called back, and then West said the card never came",
        [("PERSON", "Toby West"), ("PERSON", "West")],
    ),
    ("repeated", "Toby West called. West of here the card works", [("PERSON", "Toby West")]),
    (
        "repeated",
        "i'm anna kowalski, the card is for anna's flat",
        [("PERSON", "anna kowalski"), ("PERSON", "anna")],
    ),
    ("company", "I work for Johnson Matthey PLC", []),
    ("company", "paid Samuel Heath and Sons Ltd twice", []),
    ("company", "a refund from biofrontera ag", []),
    ("company", "tickets for Blink-182", []),
    (
        "address block",
        "Apt. 908\n178 Klímova 702\nVlastejovice\nCzech Republic 40036",
        [("ADDRESS", "Apt. 908\n178 Klímova 702\nVlastejovice\nCzech Republic 40036")],
    ),
    (
        "address block",
        "1367 Via Nuova del Campo 85\nSuite 994\nMessina\nItaly 99631\nthanks",
        [("ADDRESS", "1367 Via Nuova del Campo 85\nSuite 994\nMessina\nItaly 99631")],
    ),
    ("address block", "my address is 12 Elm Street\nthanks", [("ADDRESS", "12 Elm Street")]),
    (
        "corner",
        "meet me at the corner of main street and 5 oak lane",
        [("ADDRESS", "main street and 5 oak lane")],
    ),
    (
        "full name",
        "please change it to virginia adkins",
        [("PERSON", "virginia adkins")],
    ),
    ("full name", "the max top-up is what", []),
    ("title", "mr. bumgarner flew home on monday", [("PERSON", "bumgarner")]),
    ("title", "12 oak dr is my address", [("ADDRESS", "12 oak dr")]),
    (
        "list",
        "founders: adomo, rhodes and wilson",
        [("PERSON", "adomo"), ("PERSON", "rhodes"), ("PERSON", "wilson")],
    ),
    ("brand", "i use visa, mastercard and amex", []),
    ("amount", "i owe 30 quid for the park and ride", []),
    ("amount", "i wanted to withdraw 30 at the atm", []),
    ("amount", "the atm on the 3rd floor ate my card", []),
    ("single letter", "CAN U CALL ME AT 9:30", []),
    ("payee", "i sent money to paulo yesterday", [("PERSON", "paulo")]),
    ("payee", "the payment sent to seller came back", []),
    ("payee", "i need to send money to kenya", []),
    ("payee", "i am sending it to will", []),
    # The grammar of a clause (pii/clauses.py): a first name as a verb's subject, a
    # question's subject, a first object, said to the reader, in apposition; not a common
    # word, a bank, a payment network, a place, a month or an amount in the same place.
    ("subject", "what if jake loses the card", [("PERSON", "jake")]),
    ("subject", "i think todd stole my card", [("PERSON", "todd")]),
    ("subject", "brad keeps using my card", [("PERSON", "brad")]),
    ("subject", "babysitter paige needs paying", [("PERSON", "paige")]),
    ("subject", "so wes just sent it back", [("PERSON", "wes")]),
    ("question", "can wes use my card", [("PERSON", "wes")]),
    ("first object", "i gave tyler my old card", [("PERSON", "tyler")]),
    ("said to", "ok ben thanks", [("PERSON", "ben")]),
    ("apposition", "the plumber, wes, wants cash", [("PERSON", "wes")]),
    ("subject", "what if max is reached", []),
    ("subject", "if swift transfers take longer", []),
    ("subject", "SWIFT transfers can take up to five days", []),
    ("subject", "so pin is blocked now", []),
    ("subject", "ive tried 5 times", []),
    ("subject", "if sydney is closed", []),
    ("subject", "my etf is down", []),
    ("question", "can visa refund me", []),
    ("question", "does chase charge fees", []),
    ("talked to", "i spoke to tyler yesterday", [("PERSON", "tyler")]),
    ("greeting", "hello kyle can you help", [("PERSON", "kyle")]),
    ("speaker", "megan: hi, my card is blocked", [("PERSON", "megan")]),
    ("relation after", "dylan (my son) needs a card", [("PERSON", "dylan")]),
    ("first object", "i refunded trevor the 20", [("PERSON", "trevor")]),
    ("talked to", "i spoke to someone yesterday", []),
    ("speaker", "note: my card is blocked", []),
    ("greeting", "hello there can you help", []),
    # Given names that are common words, where only a person can stand.
    ("word name", "will said the card was declined", [("PERSON", "will")]),
    ("word name", "tell mark the money is there", [("PERSON", "mark")]),
    ("word name", "ask hope about the refund", [("PERSON", "hope")]),
    ("word name", "thanks, june", [("PERSON", "june")]),
    ("word name", "thanks, will do", []),
    ("word name", "the bill said 40 pounds", []),
    ("word name", "your text will be sent", []),
    ("word name", "i will tell you the code", []),
    # Addresses a phrase announces (pii.addresses.cued_address_spans), and where none is.
    ("address cue", "send it to 5 the paddock, york", [("ADDRESS", "5 the paddock, york")]),
    ("address cue", "post it to 19 station approach", [("ADDRESS", "19 station approach")]),
    ("address cue", "i live at no. 7 mill lane", [("ADDRESS", "no. 7 mill lane")]),
    ("address cue", "i'm at 23-25 high street", [("ADDRESS", "23-25 high street")]),
    ("address cue", "i live at twelve oak road", [("ADDRESS", "twelve oak road")]),
    ("address cue", "i live on maple street", [("ADDRESS", "maple street")]),
    ("address cue", "I live on Maple Street", [("ADDRESS", "Maple Street")]),
    ("address cue", "i'm on my way", []),
    ("address cue", "i live in the city centre", []),
    ("address cue", "i'm at central station", []),
    ("address cue", "send it to 3 different accounts", []),
    ("address cue", "i live 5 minutes from main street", []),
    ("phone", "my number is 98765 43210", [("PHONE", "98765 43210")]),
    ("phone", "order 98765 43210 arrived", []),
    # a family name's particles (pii.clauses.family_name_after)
    ("family-name particle", "please transfer it to Roxy van der Torre today",
     [("PERSON", "Roxy van der Torre")]),
    ("family-name particle", "the card belongs to Narciso De Luca", [("PERSON", "Narciso De Luca")]),
    ("family-name particle", "send it to marieke van den berg", [("PERSON", "marieke van den berg")]),
    ("family-name particle", "send it to tom de facto", [("PERSON", "tom")]),
    # people named as a group before a list (pii.phrases._LIST_CUE_RE)
    ("people before a list", "our partners: Okafor, Lindqvist and Brandt",
     [("PERSON", "Okafor"), ("PERSON", "Lindqvist"), ("PERSON", "Brandt")]),
    ("people before a list", "our partners: banks, shops and cafes", []),
    # a work named after its author (pii.clauses._WORKS)
    ("the X novel", "have you read the okonkwo novel yet", [("PERSON", "okonkwo")]),
    ("the X novel", "I watched the Netflix film", []),
    # a place's or a thing's noun after a word that looks like a name
    ("place or thing after", "Kalinowo bridge is closed again", []),
    ("place or thing after", "Zentrix is a small design agency in Leeds", []),
    ("place or thing after", "Ellie is a film director", [("PERSON", "Ellie")]),
    ("people's adjective", "we had great Icelandic food there", []),
    ("people's adjective", "tell Gareth food is ready", [("PERSON", "Gareth")]),
    # a word the name table does not hold as a sentence's subject (pii.clauses._unknown_subjects)
    ("unknown subject", "zuberi said it was fine", [("PERSON", "zuberi")]),
    ("unknown subject", "the app froze, but Oyelaran just has to wait", [("PERSON", "Oyelaran")]),
    ("unknown subject", "Revolut is down again", []),
    ("unknown subject", "klarna is charging me", []),
    # an export's escaped line break ("\\n" as two characters) before a word
    ("escaped line break", "mia lund\\n\\nanna berg", [("PERSON", "mia lund"), ("PERSON", "anna berg")]),
    ("escaped line break", "mia lund\\n\\noslo\\nnorway", [("PERSON", "mia lund")]),
    # a first name ranked 4,001 to 20,000 in its country (pii.model.rare_names), without case
    ("rare name", "can mstislav use my card", [("PERSON", "mstislav")]),
    ("rare name", "please add eufrosina to my account", [("PERSON", "eufrosina")]),
    ("rare name", "transfer 50 euros to lauchlan please", [("PERSON", "lauchlan")]),
    ("rare name", "why did costante get a refund and i did not", [("PERSON", "costante")]),
    ("rare name", "CAN MSTISLAV USE MY CARD", [("PERSON", "MSTISLAV")]),
    ("rare name", "i have a topup problem", []),  # names-dataset's run-together words are out
    ("rare name", "isok if i pay later", []),
    # a company's legal form after one or two words, or glued on ("co.ltd.", "HoldingsLtd.")
    ("legal form", "my employer is nordvik holdingsltd.", []),
    ("legal form", "she works at mareva chemical co.ltd. now", []),
    ("legal form", "i work at torvane capital inc. since march", []),
    ("legal form", "i sent it to john at acme inc", [("PERSON", "john")]),
    # a lone letter the name model guessed: a share class, a series, no name
    ("lone letter", "I work for Brackley Land Trust Inc. Pref. Series H", []),
    ("lone letter", "my pension is in the ODEN GLOBAL ETN U", []),
    ("lone letter", "We hold KESTREL RLTY CL L PRF shares", []),
    ("lone letter", "Dr. J. Okafor will call", [("PERSON", "J. Okafor")]),
    # a company's head noun after a name-like word, a legal form before or at its start
    ("company head noun", "vasquez therapeutics charged me twice", []),
    ("company head noun", "Lindgren Capital Partners sent me a letter", []),
    ("company head noun", "my pension sits in the Harlow Quality Municipal Income Fund", []),
    ("company head noun", "please pay Ingrid Holm today", [("PERSON", "Ingrid Holm")]),
    # a unit and its number before the house number: the street's name comes after them
    ("unit first", "we moved to flat 2, 9 mill lane last week", [("ADDRESS", "flat 2, 9 mill lane")]),
    ("unit first", "send it to apartment 5, 14 park road", [("ADDRESS", "apartment 5, 14 park road")]),
    ("unit first", "suite 12 is on the left", []),
    # a postal block's town line (below a name and a blank line, above a country) is no name
    ("town line", "Ines Okafor\n\nVila Nova de Gaia\nPortugal", [("PERSON", "Ines Okafor")]),
    ("town line", "hi\nLayla Bird\nBrazil", [("PERSON", "Layla Bird")]),
    # a named close ends before the word that ends the message
    ("named close", "im at 5 the crescent now", [("ADDRESS", "5 the crescent")]),
    ("named close", "we moved to 12 the green please", [("ADDRESS", "12 the green")]),
    # a title alone is no name ("Mr" was masked, "K" left)
    ("title alone", "Dear Mr K, thanks for the call", []),
    ("title alone", "Dear Mr. Kowalski, thanks for the call", [("PERSON", "Mr. Kowalski")]),
    # a preposition names no street (pii.model.address_like)
    ("preposition before a street type", "we were 9 en route to the airport", []),
    ("preposition before a street type", "i am en route to 14 mill lane", [("ADDRESS", "14 mill lane")]),
    # the name line at the head of an address block (pii.detector._addressees)
    ("addressee line", "Guy Farrowby\n\n22 Rua Augusta 10\n Lisboa",
     [("PERSON", "Guy Farrowby"), ("ADDRESS", "22 Rua Augusta 10\n Lisboa")]),
    ("addressee line", "fern pitkethly\n\n22 rua augusta 10\n lisboa",
     [("PERSON", "fern pitkethly"), ("ADDRESS", "22 rua augusta 10\n lisboa")]),
    ("addressee line", "Card Services\n\n14 Fjordgata 3\n Bergen", [("ADDRESS", "14 Fjordgata 3\n Bergen")]),
    ("addressee line", "New address below\n\n14 Fjordgata 3\n Bergen", [("ADDRESS", "14 Fjordgata 3\n Bergen")]),
    # "it's <name> again" introduces a name at the message's start; a greeting is no name
    ("it's ... again", "its mike again, any update", [("PERSON", "mike")]),
    ("it's ... again", "its declined again", []),
    ("greeting", "yo, this is ravi", [("PERSON", "ravi")]),
    # banking words are no names, whatever the phrasing before them
    ("banking word", "is it possible to add my wife as a second cardholder", []),
    ("banking word", "add magdalena as a cardholder", [("PERSON", "magdalena")]),
    # an address grows down to its town's line, not up onto the addressee's line
    ("address below a name", "}}Brigitte Friedman\n}}Unicycive Therapeutics Inc.\n}}Brigitte Friedman\n"
     "}}636 59 Guild Street\n}}Suite 258\n}}LONDON",
     [("PERSON", "Brigitte Friedman"), ("PERSON", "Brigitte Friedman"),
      ("ADDRESS", "636 59 Guild Street\n}}Suite 258")]),
    # capitals only at sentences' and lines' starts (a phone's keyboard): names in lower case
    ("sentence case", "Hi, my name is john smith", [("PERSON", "john smith")]),
    ("sentence case", "Transfer to joanna kowalska failed. Can you check?", [("PERSON", "joanna kowalska")]),
    ("sentence case", "Name - joanna kowalska\nAddress - 5 elm row edinburgh",
     [("PERSON", "joanna kowalska"), ("ADDRESS", "5 elm row edinburgh")]),
    ("sentence case", "My PIN is blocked. This is mike", [("PERSON", "mike")]),
    ("sentence case", "Thanks, Tom", [("PERSON", "Tom")]),
    ("sentence case", "Hi, I signed up yesterday. Thank you kindly", []),
    # an address block ends above the message's closing line
    ("closing after an address", "my new address is:\n14 Larch Close\nBasingstoke\nRG21 5TT\n\nCheers\nBen",
     [("ADDRESS", "14 Larch Close\nBasingstoke\nRG21 5TT"), ("PERSON", "Ben")]),
    # a date or a time is no address ("On 3 Dec, at 10:02, Carys Jones wrote:")
    ("date or time", "On 3 Dec, at 10:02, Carys Jones wrote:", [("PERSON", "Carys Jones")]),
    ("date or time", "on 14 march i paid twice", []),
    ("date or time", "i live at 12 May Street", [("ADDRESS", "12 May Street")]),
    # an address block's last line, then a phone number: the phone is no postcode
    ("address then phone", "Mia Lund\n\n12 Storgata 5\n Apt. 3\n Oslo\n Norway 0155\n+47 912 34 567",
     [("PERSON", "Mia Lund"), ("ADDRESS", "12 Storgata 5\n Apt. 3\n Oslo\n Norway 0155"),
      ("PHONE", "+47 912 34 567")]),
]


@pytest.mark.parametrize(("phrasing", "text", "expected"), PHRASINGS)
def test_phrasing_table(phrasing: str, text: str, expected: list[tuple[str, str]]) -> None:
    assert [(d.entity, d.value) for d in pii.detect(text)] == expected, phrasing


def test_a_word_starting_with_a_legal_form_leaves_the_name_before_it() -> None:
    """"Co-owner" is no "Co." of a company: the name in front of it stays masked."""
    for text in ("Ask Anna Kowalski, Co-owner of the flat", "ASK ANNA KOWALSKI, AG-LEAD"):
        values = [d.value.lower() for d in pii.detect(text) if d.entity == "PERSON"]
        assert "anna kowalski" in values, (text, values)


def test_each_detection_names_its_source() -> None:
    text = "hi, i'm john, card 5698 2597 9192, mobile 730 064 218, i live at 14 elm grove"
    sources = {d.entity: d.source for d in pii.detect(text)}
    assert sources == {"PERSON": "name-model", "CARD": "card-pattern+luhn+iin",
                       "PHONE": "phone-shapes+libphonenumber", "ADDRESS": "address-model"}


def detect(text: str) -> list[tuple[int, int, str]]:
    return [(d.start, d.end, d.entity) for d in pii.detect(text)]


@pytest.fixture(scope="module")
def heldback() -> dict[str, list[E.Sample]]:
    return {
        "presidio": E.load_presidio(E.EVAL_DIR / "presidio_heldback.jsonl"),
        "casual": E.load_casual(E.EVAL_DIR / "casual_heldback.tsv"),
        "casual-fresh": E.load_casual(E.EVAL_DIR / "casual_fresh.tsv"),
    }


def test_the_sentence_case_variant_capitalizes_as_a_keyboard_does() -> None:
    text = "hi, i'm JOHN smith. my card?\n  thanks\nbob"
    out = E.sentence_case(text)
    assert out == "Hi, I'm john smith. My card?\n  Thanks\nBob" and len(out) == len(text)
    sample = E.Sample(text, [(8, 18, "PERSON")], "g")
    assert E.case_variant([sample], "sentence")[0].spans == sample.spans


@pytest.mark.parametrize(("text", "caseless"), [
    ("Hi, my name is john smith", True), ("My PIN is blocked. This is mike", True),
    ("Name - joanna\nAddress - 5 elm row", True), ("Ms. Paige k. Tardif", True),
    ("Thanks, Tom", False), ("I paid via PayPal", False), ("Dr. J. Okafor will call", False),
    ("où est ma carte? Je suis élodie", True), ("Où est ma carte, Élodie", False),
])
def test_text_with_capitals_at_sentence_starts_only_is_read_without_case(text: str, caseless: bool) -> None:
    from pii.casing import _case_forms, _is_caseless

    assert _is_caseless(text) is caseless and _case_forms(text)[0] is caseless


def test_the_halves_are_apart() -> None:
    """No template, phrasing or message of a held-back set is in a tuned half or in the
    other held-back set."""
    for a, b, load in (("presidio_tuned.jsonl", "presidio_heldback.jsonl", E.load_presidio),
                       ("casual_tuned.tsv", "casual_heldback.tsv", E.load_casual),
                       ("casual_tuned.tsv", "casual_fresh.tsv", E.load_casual),
                       ("casual_heldback.tsv", "casual_fresh.tsv", E.load_casual)):
        tuned, held = load(E.EVAL_DIR / a), load(E.EVAL_DIR / b)
        assert not {s.group for s in tuned} & {s.group for s in held}
        assert not {s.text for s in tuned} & {s.text for s in held}
    for name in ("casual_heldback.tsv", "casual_fresh.tsv"):
        casual = E.load_casual(E.EVAL_DIR / name)
        assert len(casual) >= 200 and len({s.group for s in casual}) >= 15


# Floors per (set, case, type): the target, or the figure measured on the held-back half
# less a margin where the target is not met (those are listed in docs/BENCHMARKS.md).
# Measured 2026-12-06 (evening) with a name's other mentions, company names, address blocks
# and payees (docs/BENCHMARKS.md): presidio PERSON 0.872/0.903 cased, 0.851/0.931 lower,
# 0.851/0.931 upper; ADDRESS 0.944/0.957 cased (the target), 0.942/0.921 without case (one
# detection per whole address now: the false ones are as many as before); casual PERSON
# 0.882/0.968, ADDRESS 0.846/0.917 (13 addresses: one is 0.077). With the grammar rules
# (2026-12-07, later): presidio PERSON 0.876/0.904, 0.856/0.930, 0.856/0.930; casual
# PERSON 0.896/0.968. With names after a cue and an address's town and postcode
# (2026-12-07, night): presidio PERSON 0.880/0.904, 0.860/0.931, 0.860/0.931; casual PERSON
# 0.896/0.960, ADDRESS 0.923/0.923 (12 of 13: the recall target, which the floor now is).
# With the rare names, lone letters and company head nouns (2026-12-07, evening): presidio
# PERSON 0.880/0.909, 0.876/0.929, 0.877/0.929. With capitals at sentences' starts read
# as no case, and the sentence-case variant (2026-12-07, night; first scored then):
# presidio PERSON 0.878/0.907, 0.877/0.926, 0.877/0.926, sentence case 0.877/0.926;
# ADDRESS sentence case 0.941/0.921.
FLOORS: dict[tuple[str, str, str], tuple[float, float]] = {
    ("presidio", "cased", "PERSON"): (0.86, 0.89),
    ("presidio", "lower", "PERSON"): (0.86, 0.91),
    ("presidio", "upper", "PERSON"): (0.86, 0.91),
    ("presidio", "sentence", "PERSON"): (0.86, 0.91),
    **{("presidio", c, "ADDRESS"): (0.90, 0.90) for c in ("lower", "upper", "sentence")},
    **{("casual", c, "PERSON"): (0.86, 0.93) for c in E.CASES},
    **{("casual", c, "ADDRESS"): (0.90, 0.90) for c in E.CASES},
    # The fresh held-back set (2026-12-07, scored once on the shipped detector, as written /
    # lower / upper): PERSON 0.840/0.927, 0.835/0.926, 0.835/0.926 (163 or 162 of 194);
    # ADDRESS 0.794/0.889, 0.794/0.886 (27 of 34); PHONE 0.943/0.971 (33 of 35). With the
    # grammar rules, address cues and Indian mobiles (later that day): PERSON 0.840/0.921,
    # 0.835/0.921; ADDRESS 0.794/0.914, 0.794/0.912; PHONE 0.971/0.971 (34 of 35: the
    # target, which the floor now is). With names after a cue and an address's town and
    # postcode (that night): PERSON 0.845/0.922, 0.840/0.921; ADDRESS 0.794/0.917, 0.794/0.914.
    # With the towns, the unknown subjects and the rare names (2026-12-07, evening): PERSON
    # 0.856/0.922, 0.851/0.922; ADDRESS 0.824/0.919, 0.824/0.917 (28 of 34).
    **{("casual-fresh", c, "PERSON"): (0.83, 0.90) for c in E.CASES},
    **{("casual-fresh", c, "ADDRESS"): (0.79, 0.89) for c in E.CASES},
}


def floor(source: str, case: str, ent: str) -> tuple[float, float]:
    return FLOORS.get((source, case, ent), TARGET.get(ent, TARGET_OTHER))


@pytest.mark.parametrize("case", E.CASES)
@pytest.mark.parametrize("source", ["presidio", "casual", "casual-fresh"])
def test_heldback_recall_and_precision(heldback, source: str, case: str) -> None:
    scores = E.score(E.case_variant(heldback[source], case), detect, TYPES)
    failed = []
    for ent, v in scores.items():
        if not v["labeled"]:
            continue
        min_r, min_p = floor(source, case, ent)
        if v["recall"] < min_r or (v["precision"] or 0) < min_p:
            failed.append((ent, v["recall"], v["precision"], min_r, min_p))
    assert not failed, failed


@pytest.mark.parametrize(("case", "most"), [("cased", 1.0), ("lower", 1.0)])
def test_false_detections_on_real_banking77_messages(case: str, most: float) -> None:
    """Per 1,000 held-out (test split) messages, as written and lower-cased: at most 1, the
    target (2 and 3 of 3,080 since 2026-12-07, when typos of common words stopped being
    name candidates; 3 and 4 before; 3 and 3 since capitals at sentences' starts only are
    read as no case, 2026-12-07 night)."""
    texts = E.load_banking77("test")
    if case == "lower":
        texts = [t.lower() for t in texts]
    fp = E.false_positives(texts, detect, examples=10)
    assert fp["per_1000"] <= most, fp


def test_detections_are_deterministic(heldback) -> None:
    texts = [s.text for s in heldback["presidio"][:500]] + [s.text for s in heldback["casual"]]
    first = [pii.detect(t) for t in texts]
    pii._token_model.cache_clear()  # a fresh model load gives the same answers
    assert [pii.detect(t) for t in texts] == first
    assert [pii.detect(t) for t in reversed(texts)] == first[::-1]
