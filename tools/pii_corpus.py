"""Generate the independent PII evaluation sets from presidio-evaluator (another project's
sentence templates and Faker values), split by template into a tuned and a held-back half.

presidio-evaluator needs pandas 3 (this project pins pandas 2 for PySpark and Great
Expectations), so it runs in a virtual environment of its own:

    make pii-corpus            # .venv-pii-tools + this script, writes data/pii_eval/

or by hand:

    python3.11 -m venv .venv-pii-tools
    .venv-pii-tools/bin/pip install -r tools/requirements-pii.txt
    .venv-pii-tools/bin/python tools/pii_corpus.py --out data/pii_eval

The split: a template belongs to the held-back half when the first byte of the SHA-256 of
its text is odd. The tuned half is generated with seed 42 (the seed of the figures that
opened this work), the held-back half with seeds nobody tuned on (``--heldback-seeds``):
a new seed alone would reuse the same templates, so the template split is what keeps the
held-back half unseen. Each output line is one sentence:
``{"text", "template_id", "template_half", "seed", "spans": [{"type", "start", "end"}]}``
with presidio-evaluator's own entity types (the scorer maps them onto ours).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path


def half(template: str) -> str:
    return "heldback" if hashlib.sha256(template.encode()).digest()[0] % 2 else "tuned"


def generate(templates: list[str], n: int, seed: int) -> list[dict]:
    from presidio_evaluator.data_generator import PresidioSentenceFaker

    random.seed(seed)  # the generator picks templates with the random module
    faker = PresidioSentenceFaker("en_US", lower_case_ratio=0.0, sentence_templates=templates,
                                  random_seed=seed)
    out = []
    for s in faker.generate_new_fake_sentences(n):
        out.append({
            "text": s.full_text,
            "template_id": hashlib.sha256(templates[s.template_id].encode()).hexdigest()[:12],
            "seed": seed,
            "spans": sorted(({"type": sp.entity_type, "start": sp.start_position,
                              "end": sp.end_position} for sp in s.spans),
                            key=lambda d: (d["start"], d["end"])),
        })
    return out


def main() -> None:
    from presidio_evaluator.data_generator.presidio_sentence_faker import (
        presidio_templates_file_path,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/pii_eval")
    ap.add_argument("--n", type=int, default=3000, help="sentences per seed")
    ap.add_argument("--tuned-seeds", type=int, nargs="+", default=[42])
    ap.add_argument("--heldback-seeds", type=int, nargs="+", default=[20261205])
    args = ap.parse_args()
    lines = [t.strip() for t in presidio_templates_file_path.read_text().splitlines()]
    templates = sorted({t for t in lines if t})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, seeds in (("tuned", args.tuned_seeds), ("heldback", args.heldback_seeds)):
        part = [t for t in templates if half(t) == name]
        rows = [dict(r, template_half=name) for seed in seeds for r in generate(part, args.n, seed)]
        dest = out / f"presidio_{name}.jsonl"
        dest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"{dest}: {len(rows)} sentences from {len(part)} templates, seeds {seeds}")


if __name__ == "__main__":
    main()
