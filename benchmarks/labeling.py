"""Benchmark: the review loop against a real Label Studio (started here from
``.venv-label-studio`` on a free port, SQLite in a temp folder).

1. **Push and pull time** for a queue of ``--queue`` items (Banking77's own training
   texts, a suggested label and a score each): the push (project, task listing, import
   with predictions, the lake's task map), every item annotated through the REST API (what
   reviewers' clicks cost the server; reported apart), then the pull (JSON export, mapping,
   merge into the lake's reviewer source). Median of ``--repeats``, each on a new project.
2. **Rounds** on a builder export at ``--noise`` planted label noise (the demo's shape, three
   annotators per item): label QA's analysis, then ``--rounds`` rounds of ``--batch`` items,
   each pushed by the review stage's code, answered by a simulated reviewer who gives the
   builder's ground-truth label (Banking77's own label, not one this project wrote),
   pulled, and applied by label QA's rule. After each round: the curated set's label-error
   rate against the ground truth and the test accuracy on Banking77's official test split
   of a TF-IDF + logistic-regression model trained on the curated train split (a proxy
   for the fine-tuned model, cheap enough to retrain per round; the label-QA stage uses
   the same model family for its checks).

    .venv/bin/python benchmarks/labeling.py [--queue 1000] [--repeats 3] [--rows 6000]
        [--noise 0.10] [--annotators 3] [--rounds 3] [--batch 200] [--skip-push-pull]

Results: ``benchmarks/results/labeling.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import textnorm  # noqa: E402
from core import labeling_auth  # noqa: E402
from core.config import LabelQAConfig, load_config  # noqa: E402
from ops import labelstudio_service as ls  # noqa: E402
from quality import labelqa, review, review_stage  # noqa: E402
from quality.labelqa import LS_FROM, LS_TO  # noqa: E402
from quality.labelstudio import Client  # noqa: E402

DATA = ROOT / "data" / "banking77"


def start_label_studio(base: Path) -> tuple[subprocess.Popen, str, labeling_auth.LabelStudioCredentials, float]:
    creds = labeling_auth.LabelStudioCredentials.load_or_create(base / "credentials.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = subprocess.Popen(ls.command("127.0.0.1", port, base / "data"), env=ls.environment(creds, base / "data"),
                            stdout=(base / "server.log").open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    client = Client(url, creds.api_token)
    while not client.health():
        if proc.poll() is not None or time.monotonic() - t0 > 600:
            raise SystemExit("label studio did not start: " + (base / "server.log").read_text()[-2000:])
        time.sleep(0.5)
    return proc, url, creds, round(time.monotonic() - t0, 1)


def classes() -> list[str]:
    return sorted({textnorm.normalize_label(x) for x in json.loads((DATA / "categories.json").read_text())})


def push_pull(url: str, creds, n: int, repeats: int, work: Path) -> dict:
    train = pd.read_csv(DATA / "train.csv").sample(n=n, random_state=0).reset_index(drop=True)
    labels = classes()
    rng = np.random.default_rng(0)
    queue = pd.DataFrame({
        "rank": np.arange(1, n + 1), "record_id": [f"b{i:06d}" for i in range(n)], "text": train.text,
        "given_label": train.category.map(textnorm.normalize_label), "annotations": "",
        "consensus_label": train.category.map(textnorm.normalize_label), "item_agreement": np.nan,
        "suggested_label": rng.choice(labels, n), "score": np.round(rng.random(n), 6),
        "reason": "low label quality", "dedup_label_conflict": False})
    counts = dict(queue.consensus_label.value_counts())
    runs = []
    for r in range(repeats):
        cfg = load_config(overrides={"lake_root": str(work / f"pp{r}"), "labeling.project": f"bench-push-{r}",
                                     "labeling.batch_size": n}, env={})
        with Client(url, creds.api_token, timeout=300) as client:
            t = time.monotonic()
            stats, sent = review_stage.push(cfg, client, queue, labels, counts, f"bench-{r}")
            push_s = time.monotonic() - t
            assert stats["sent"] == n, stats
            t = time.monotonic()
            for tid, lab in zip(sent.task_id, sent.consensus_label, strict=True):
                client.annotate(int(tid), LS_FROM, LS_TO, lab)
            annotate_s = time.monotonic() - t
            t = time.monotonic()
            got = review_stage.pull(cfg)
            pull_s = time.monotonic() - t
            assert got["new_annotations"] == n, got
            t = time.monotonic()
            again = review_stage.push(cfg, client, queue, labels, counts, f"bench-{r}b")[0]
            repush_s = time.monotonic() - t
            assert again["sent"] == 0
        runs.append({"push_s": round(push_s, 2), "annotate_all_s": round(annotate_s, 2),
                     "pull_s": round(pull_s, 2), "idempotent_repush_s": round(repush_s, 2)})
        print(f"push/pull {r}: {runs[-1]}", flush=True)
    med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
    return {"queue_items": n, "repeats": runs, "median": med}


def build(rows: int, noise: float, seed: int, annotators: int, out: Path) -> tuple[pd.DataFrame, pd.Series]:
    from demo import builder

    builder.main(["--out", str(out), "--rows", str(rows), "--seed", str(seed), "--format", "parquet",
                  "--label-error-rate", str(noise), "--annotators-per-item", str(annotators)])
    raw = pd.read_parquet(out / "raw.parquet")
    gt = pd.read_parquet(out / "ground_truth" / "rows.parquet").set_index("ticket_id").loc[raw.ticket_id]
    keep = gt.defect.isna().to_numpy() & gt.dup_kind.isna().to_numpy()  # what dedup keeps
    r = raw[keep]
    items = pd.DataFrame({"record_id": r.ticket_id.to_numpy(), "text": r.message.to_numpy(),
                          "label": r.intent.to_numpy(),
                          "annotations": [json.loads(a) if a else None for a in r.annotations]})
    truth = pd.Series(gt.true_label[keep].map(textnorm.normalize_label).to_numpy(), index=items.record_id)
    return items, truth


def proxy_accuracy(cur: pd.DataFrame, test: pd.DataFrame) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    tr = cur[cur.split == "train"]
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    clf = LogisticRegression(C=10.0, max_iter=300).fit(vec.fit_transform(tr.text), tr.label)
    return round(float((clf.predict(vec.transform(test.text)) == test.label).mean()), 4)


def rounds(url: str, creds, args, work: Path) -> dict:
    labels = classes()
    items, truth = build(args.rows, args.noise, args.seed, args.annotators, work / "raw")
    test = pd.read_csv(DATA / "test.csv").rename(columns={"category": "label"})
    test["label"] = test.label.map(textnorm.normalize_label)
    qa_cfg = LabelQAConfig()
    t = time.monotonic()
    a0 = labelqa.analyze(items, labels, qa_cfg)
    analyze_s = round(time.monotonic() - t, 1)
    cfg = load_config(overrides={"lake_root": str(work / "lake"), "labeling.project": "bench-rounds",
                                 "labeling.batch_size": args.batch}, env={})
    store = review.ReviewStore(cfg.lake)

    def measure(rnd: int, reviewed: int) -> dict:
        resolved, _ = review.resolve(store.annotations(), labels)
        a = labelqa.Analysis(review.apply(a0.items, resolved), a0.ann, a0.agreement, a0.info)
        cur = labelqa.curated(a, qa_cfg)
        err = float((cur.label.to_numpy() != truth.loc[cur.record_id].to_numpy()).mean())
        queue = labelqa.relabel_queue(a)
        return {"round": rnd, "items_reviewed_total": reviewed, "curated_rows": len(cur),
                "curated_label_error_rate": round(err, 4), "queue_rows": len(queue),
                "proxy_test_accuracy": proxy_accuracy(cur, test), "queue": queue, "cur": cur}

    out = []
    m = measure(0, 0)
    out.append(m)
    reviewed = 0
    with Client(url, creds.api_token, timeout=300) as client:
        for rnd in range(1, args.rounds + 1):
            counts = {str(k): int(v) for k, v in m["cur"].label.value_counts().items()}
            stats, sent = review_stage.push(cfg, client, m["queue"], labels, counts, f"round-{rnd}")
            agree = 0
            for tid, rid, sug in zip(sent.task_id, sent.record_id, sent.suggested_label, strict=True):
                client.annotate(int(tid), LS_FROM, LS_TO, truth[rid])  # the simulated reviewer
                agree += int(sug == truth[rid])
            review_stage.pull(cfg)
            reviewed += len(sent)
            m = measure(rnd, reviewed)
            m |= {"sent": int(stats["sent"]),
                  "reviewer_agreed_with_suggestion": round(agree / len(sent), 4) if len(sent) else None}
            out.append(m)
            print({k: v for k, v in m.items() if k not in ("queue", "cur")}, flush=True)
    table = [{k: v for k, v in r.items() if k not in ("queue", "cur")} for r in out]
    gain = table[-1]["proxy_test_accuracy"] - table[0]["proxy_test_accuracy"]
    return {"rows": args.rows, "items": len(items), "noise": args.noise, "annotators_per_item": args.annotators,
            "batch": args.batch,
            "analyze_s": analyze_s, "rounds": table,
            "items_reviewed_per_accuracy_point": round(reviewed / (gain * 100), 1) if gain > 0 else None,
            "error_rate_drop": round(table[0]["curated_label_error_rate"] - table[-1]["curated_label_error_rate"], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=6000)
    ap.add_argument("--noise", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--annotators", type=int, default=3, help="annotators per item in the build (the demo: 3)")
    ap.add_argument("--skip-rounds", action="store_true")
    ap.add_argument("--skip-push-pull", action="store_true")
    ap.add_argument("--results", default="benchmarks/results/labeling.json")
    args = ap.parse_args()
    if not ls.executable().exists():
        raise SystemExit(f"{ls.executable()} missing: run `make label-studio`")
    with tempfile.TemporaryDirectory(prefix="bench-labeling-") as tmp:
        work = Path(tmp)
        load_before = os.getloadavg()
        proc, url, creds, start_s = start_label_studio(work / "ls")
        # The review stage's code finds this server as it finds any configured one.
        os.environ.update(INTENTOPS_LABEL_STUDIO_URL=url, INTENTOPS_LABEL_STUDIO_TOKEN=creds.api_token,
                          INTENTOPS_REVIEWER_KEY=creds.reviewer_key)
        try:
            res = {"label_studio": {"version": next(
                line.split("==")[1] for line in (ROOT / "constraints-label-studio.txt").read_text().splitlines()
                if line.startswith("label-studio==")), "first_start_s": start_s},
                **({} if args.skip_push_pull else {"push_pull": push_pull(url, creds, args.queue, args.repeats, work)})}
            if not args.skip_rounds:
                res["rounds"] = rounds(url, creds, args, work)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    res["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "load_before": [round(x, 2) for x in load_before],
                      "load_after": [round(x, 2) for x in os.getloadavg()]}
    res["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    Path(args.results).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
