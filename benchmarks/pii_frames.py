"""Benchmark: first names in casual sentence frames, with and without the grammar rules.

A probe written for the grammar rules of ``pii.clauses`` (2026-12-07), so it is on the
tuned side: an upper bound, not an independent figure (the held-back sets of
``benchmarks/pii_eval.py`` are). 30 frames of casual banking messages, each filled with
60 first names (common and rare in English: "june", "will", "jake", "paige", "femi"),
lower case; and a second probe written later (30 frames of how a chat names someone, 30
names of many countries). A name counts as found when a PERSON detection covers it. Recall per frame
and per name, with ``pii.clauses`` off (``clause_name_spans`` returning nothing) and on.

    .venv/bin/python benchmarks/pii_frames.py [--results benchmarks/results/pii_frames.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pii import detector as pii  # noqa: E402

NAMES = """
jake sarah paige tyler megan kyle chloe dylan amber trevor june april dawn bill mark will
hope grace joy jack rose max ray ben sam dean frank gary carl rick nick pat sue kim ali tina
nina luke seth brad chad todd troy wes zoe eve ivy jade liam noah omar raj yuki sven lars
ines beto olu femi ngozi
""".split()
FRAMES = [
    "split the bill with {n} and me", "{n} and i went to the bank", "me and {n} share an account",
    "my cousin {n} needs money", "babysitter {n} needs paying", "the plumber, {n}, wants cash",
    "{n} said the card was declined", "ask {n} about the refund", "tell {n} the money is there",
    "i paid {n} back yesterday", "send 20 to {n} please", "can {n} use my card",
    "is {n} allowed to see my balance", "i gave {n} my old card", "{n} needs a new pin",
    "{n}'s card got stuck", "sent money to {n}'s account", "this is {n}", "hey, {n} here",
    "thanks so much! {n}", "lol ok {n}", "do you know if {n} got the money",
    "my coworker {n} recommended you", "{n} from work told me about you",
    "how do i add {n} to my account", "what if {n} loses the card", "need to pay {n} for rent",
    "{n} keeps using my card", "i think {n} stole my card", "ok {n} thanks",
]  # fmt: skip


# A second probe (written after the first's rules): 30 frames of how a chat names someone
# (greetings, a speaker, "spoke to", "(my son)", payees, agents), 30 first names of many
# countries, most rare in English.
NAMES_B = """
jake sarah paige tyler megan kyle chloe dylan amber trevor brad todd wes zoe liam noah omar
raj yuki sven lars ines femi ngozi kwabena siobhan niamh przemek tendai xiomara
""".split()
FRAMES_B = [
    "dear {n}, my card is blocked", "hi {n}, thanks for the help earlier",
    "hello {n} can you help", "{n}: hi i need help with my card", "cc {n}", "@{n} did you get it",
    "signed, {n}", "sent by {n}", "regards {n}", "love, {n}", "yours, {n}",
    "{n} (my son) needs a card", "my son ({n}) needs a card", "it's for {n}",
    "this card belongs to {n}", "account holder: {n}", "beneficiary {n}", "payee name {n}",
    "the transfer to {n} failed", "refund {n} the 20", "i'm {n}'s mum", "on behalf of {n}",
    "spoke to {n} yesterday", "{n} helped me last time", "your colleague {n} said",
    "agent {n} told me", "is {n} still working there", "can i speak to {n}",
    "i spoke with {n} on the phone", "{n} on the phone said",
]  # fmt: skip


def run(frames: list[str] = FRAMES, names: list[str] = NAMES) -> dict:
    misses: Counter = Counter()
    by_name: Counter = Counter()
    for frame in frames:
        s = frame.index("{n}")
        for name in names:
            text = frame.format(n=name)
            e = s + len(name)
            if not any(d.entity == "PERSON" and d.start <= s and d.end >= e for d in pii.detect(text)):
                misses[frame] += 1
                by_name[name] += 1
    total = len(frames) * len(names)
    return {
        "recall": round(1 - sum(misses.values()) / total, 4),
        "missed_per_frame": dict(misses.most_common()),
        "missed_per_name": dict(by_name.most_common()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="benchmarks/results/pii_frames.json")
    args = ap.parse_args()
    rules = pii.clause_name_spans
    pii.clause_name_spans = lambda text, words=None: []
    off, off_b = run(), run(FRAMES_B, NAMES_B)
    pii.clause_name_spans = rules
    on, on_b = run(), run(FRAMES_B, NAMES_B)
    out = {"date": date.today().isoformat(), "frames": len(FRAMES), "names": len(NAMES),
           "texts": len(FRAMES) * len(NAMES), "without_clauses": off, "with_clauses": on,
           "second_probe": {"frames": len(FRAMES_B), "names": len(NAMES_B),
                            "without_clauses": off_b, "with_clauses": on_b}}
    print("recall without / with pii.clauses:", off["recall"], on["recall"],
          "; second probe:", off_b["recall"], on_b["recall"])
    dest = ROOT / args.results
    dest.write_text(json.dumps(out, indent=1))
    print("wrote", dest.relative_to(ROOT))


if __name__ == "__main__":
    main()
