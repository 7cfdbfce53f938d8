"""Benchmark: street addresses of many countries in casual frames, for two checkouts.

A probe written for the address tails of ``pii.addresses`` (2026-12-07): 30 addresses as
people type them (US, UK, Canada, Australia, India, Ireland, Germany, France, the
Netherlands, Spain; with and without a town and postcode) in 12 casual frames ("send the
card to ___", "i moved to ___ last month", "___ is my address"), lower case. It is on the
tuned side: an upper bound, not an independent figure (the held-back sets of
``benchmarks/pii_eval.py`` are). An address counts as found when an ADDRESS detection
covers at least half of it, as in the evaluation. Each checkout runs in its own process.

    git worktree add ../pii-old <commit>
    .venv/bin/python benchmarks/pii_address_probe.py --old ../pii-old \\
        [--results benchmarks/results/pii_address_probe.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ADDRESSES = """
14 oak ave
22 pine avenue
300 east 57th street
221b baker st
10 downing st, london sw1a 2aa
55 station rd, cambridge cb1 2jw
flat 4, 12 king's road
apt 5b 1200 n lake shore dr
7 rue des lilas
kerkstraat 12
calle mayor 5
12 avenue des champs-elysees
house 14, sector 7, rohini
42 mg road, bangalore
unit 3, 45 george st, sydney nsw 2000
88 queen st w, toronto on m5h 2n2
5 o'connell street, dublin 1
19 via roma
hauptstrasse 5, 10115 berlin
3/17 beach rd
1600 amphitheatre pkwy, mountain view, ca 94043
po box 77
the old rectory, church lane
27 maple crescent
9 elm st apt 2
1234 w 5th ave
45 high st, oxford ox1 4ap
101 5th avenue, new york, ny 10003
12 rose lane
8 wellington st
""".strip().splitlines()
FRAMES = [
    "my new address is {a}", "send the card to {a}", "i moved to {a} last month",
    "please update my address to {a}", "deliver it to {a} please", "i live at {a}",
    "{a} is my address", "card went to {a} instead", "the statement should go to {a}",
    "my old address was {a} but now its different", "can you ship to {a}", "address: {a}",
]


def probe(checkout: str) -> dict:
    sys.path.insert(0, checkout)
    from pii import detector as pii

    assert Path(pii.__file__).resolve().is_relative_to(Path(checkout).resolve()), pii.__file__
    found, missed = 0, {}
    for a in ADDRESSES:
        for f in FRAMES:
            t = f.format(a=a)
            s = t.index(a)
            e = s + len(a)
            if any(
                d.entity == "ADDRESS" and min(e, d.end) - max(s, d.start) >= (e - s) / 2
                for d in pii.detect(t)
            ):
                found += 1
            else:
                missed[a] = missed.get(a, 0) + 1
    n = len(ADDRESSES) * len(FRAMES)
    return {"texts": n, "found": found, "recall": round(found / n, 3), "missed_per_address": missed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the other checkout (a git worktree)")
    ap.add_argument("--new", default=str(ROOT))
    ap.add_argument("--results", default="benchmarks/results/pii_address_probe.json")
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return
    out: dict = {"date": date.today().isoformat(), "command": "benchmarks/pii_address_probe.py --old <checkout>"}
    for label, checkout in (("old", args.old), ("new", args.new)):
        res = subprocess.run(
            [sys.executable, __file__, "--old", args.old, "--probe", checkout],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        out[label] = json.loads(res.stdout)
        out[label]["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True
        ).stdout.strip()
        print(label, out[label]["commit"], out[label]["found"], "of", out[label]["texts"], out[label]["recall"])
    Path(args.results).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.results)


if __name__ == "__main__":
    main()
