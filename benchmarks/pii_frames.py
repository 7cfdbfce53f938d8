"""Benchmark: first names in casual sentence frames, with and without the grammar rules.

A probe written for the grammar rules of ``pii.clauses`` (2026-12-07), so it is on the
tuned side: an upper bound, not an independent figure (the held-back sets of
``benchmarks/pii_eval.py`` are). 30 frames of casual banking messages, each filled with
60 first names (common and rare in English: "june", "will", "jake", "paige", "femi"),
lower case. A name counts as found when a PERSON detection covers it. Recall per frame
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


def run() -> dict:
    misses: Counter = Counter()
    by_name: Counter = Counter()
    for frame in FRAMES:
        s = frame.index("{n}")
        for name in NAMES:
            text = frame.format(n=name)
            e = s + len(name)
            if not any(d.entity == "PERSON" and d.start <= s and d.end >= e for d in pii.detect(text)):
                misses[frame] += 1
                by_name[name] += 1
    total = len(FRAMES) * len(NAMES)
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
    off = run()
    pii.clause_name_spans = rules
    on = run()
    out = {"date": date.today().isoformat(), "frames": len(FRAMES), "names": len(NAMES),
           "texts": len(FRAMES) * len(NAMES), "without_clauses": off, "with_clauses": on}
    print("recall without / with pii.clauses:", off["recall"], on["recall"])
    dest = ROOT / args.results
    dest.write_text(json.dumps(out, indent=1))
    print("wrote", dest.relative_to(ROOT))


if __name__ == "__main__":
    main()
