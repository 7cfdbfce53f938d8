"""Benchmark: out-of-scope requests and request masking, through the model server.

Data nobody here wrote, with a held-back part: Banking77's official train.csv becomes a
user's export (one label per message, no ids or annotators) in which ``--seen`` intents
(chosen with ``--seed``) are relabelled ``oos`` (the dataset's out-of-scope label, as a
user's export carries one) and ``--unseen`` other intents are left out entirely. The
pipeline runs on it with its defaults and only a config file (``intentops run --through
export``: MiniLM, the default budget, the reject rule calibrated on val at in-scope recall
0.97). Then the shipped int8 build is served by ``deploy.server`` (masking on) and the
untouched official test.csv is sent through HTTP: in-scope accuracy over the kept intents
(an in-scope message answered out of scope counts as wrong), out-of-scope recall on the
seen and on the unseen held-back intents, out-of-scope precision.

Beside it, offline on the same build's logits: the area under the ROC curve of in-scope
against held-back messages for the max-softmax score (what the reject rule uses) and the
energy score (logsumexp of the logits), and the recall each reaches at the same in-scope
keep rate, so the choice of score is measured, not assumed.

Masking cost, side by side in one run: the same build served twice, with masking (the
default) and with ``--unsafe-no-masking``, each loaded in turn with wrk (closed loop, the
official test messages in order, one per request) at concurrency 1 and 32 for
``--seconds``, ``--repeats`` times with the order rotating; medians reported.

    .venv/bin/python benchmarks/oos_serving.py [--seen 6] [--unseen 6] [--seconds 15] [--repeats 3]

Results: ``benchmarks/results/oos_serving.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after the project: benchmarks/export.py is a script

KEY = "oos-bench-key-not-secret"


def make_export(out: Path, seen: int, unseen: int, seed: int) -> dict[str, list[str]]:
    from textnorm import normalize_label

    train = pd.read_csv(ROOT / "data" / "banking77" / "train.csv")
    intents = sorted(train.category.unique())
    rnd = random.Random(seed)
    held = rnd.sample(intents, seen + unseen)
    split = {"seen_oos": sorted(held[:seen]), "unseen_oos": sorted(held[seen:])}
    keep = train[~train.category.isin(split["unseen_oos"])]
    label = keep.category.where(~keep.category.isin(split["seen_oos"]), "oos")
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"message": keep.text, "intent": label}).to_json(
        out / "export.jsonl", orient="records", lines=True)
    return {k: [normalize_label(x) for x in v] for k, v in split.items()}


def run_pipeline(out: Path, run_id: str) -> Path:
    import yaml

    config = {
        "dataset": "b77oos",
        "lake_root": str(out / "lake"),
        "input": {"path": str(out / "export.jsonl"),
                  "columns": {"id": None, "text": "message", "label": "intent", "annotations": None,
                              "created_at": None, "channel": None}},
        "clean": {"label_set": "infer"},
        "oos": {"label": "oos"},
        "tracking": {"uri": f"sqlite:///{out / 'mlflow.db'}"},
        "training": {"probes_file": ""},  # the demo's probes name intents held back here
    }
    (out / "config.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env = {k: v for k, v in env.items() if not k.startswith("MLFLOW_")}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ops.cli", "run", "--through", "export", "--config",
                           str(out / "config.yaml"), "--run-id", run_id], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stdout[-4000:] + done.stderr[-4000:])
    print(f"pipeline through export: {time.perf_counter() - t0:.0f} s")
    return out / "config.yaml"


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counted half."""
    from scipy.stats import rankdata

    ranks = rankdata(np.concatenate([pos, neg]))
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seen", type=int, default=6, help="intents relabelled oos in the export")
    ap.add_argument("--unseen", type=int, default=6, help="intents left out of the export")
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--out", default="var/bench/oos")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--base-port", type=int, default=8390)
    ap.add_argument("--results", default="benchmarks/results/oos_serving.json")
    args = ap.parse_args()

    from data_stages import cpu_model, write_results
    from serving_compare import (
        Contender,
        body_predict,
        labels_predict,
        measured,
        settle,
        start,
        stop,
        wait_ready,
    )

    from contract import reject
    from contract.preprocess import Preprocessor
    from core import stage
    from core.config import load_config
    from export.runtime import OnnxClassifier
    from textnorm import normalize_label

    out = (ROOT / args.out).resolve()
    split = make_export(out, args.seen, args.unseen, args.seed)
    run_id = f"oos-s{args.seen}-u{args.unseen}-seed{args.seed}"
    config = run_pipeline(out, run_id)
    cfg = load_config(config)
    tr = stage.upstream(cfg.lake, run_id, "train").manifest["stats"]
    ex = stage.upstream(cfg.lake, run_id, "export")
    build = Path(ex.path) / "int8"
    if not (build / "model.onnx").is_file():
        sys.exit(f"no int8 build in {ex.path}")

    test = pd.read_csv(ROOT / "data" / "banking77" / "test.csv")
    test["label"] = test.category.map(normalize_label)
    kind = np.where(test.label.isin(split["seen_oos"]), "seen_oos",
                    np.where(test.label.isin(split["unseen_oos"]), "unseen_oos", "in_scope"))
    texts = test.text.tolist()

    # Offline: MSP against energy on the build's own logits (requests masked as served).
    clf = OnnxClassifier(build)
    pre = Preprocessor(clf.pre["text_preprocessing"])
    logits = clf.logits([pre(t) for t in texts])
    msp = reject.softmax(logits).max(1)
    energy = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    oos_idx = clf.labels.index("oos")
    said_label = logits.argmax(1) == oos_idx
    ins, held = kind == "in_scope", kind != "in_scope"
    rule = reject.RejectRule.from_dict(clf.pre["reject"])
    scores = {}
    for name, s in (("max_softmax", msp), ("energy", energy)):
        # recall at the in-scope keep rate the deployed rule reaches on this test split
        keep = float(((msp >= (rule.threshold or 0)) & ~said_label)[ins].mean())
        cut = np.quantile(s[ins & ~said_label], 1 - keep / max(float((~said_label)[ins].mean()), 1e-9))
        caught = said_label | (s < cut)
        scores[name] = {"auroc_in_scope_vs_held_back": round(auroc(s[ins], s[held]), 4),
                        "held_back_recall_at_same_in_scope_keep": round(float(caught[held].mean()), 4)}

    # Through the server, masking on: the deployed answers.
    import httpx

    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(ROOT), INTENTOPS_API_KEYS=KEY)
    work = out / "serve"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    procs = []
    try:
        urls = {}
        for i, (name, extra) in enumerate((("masking", []), ("no_masking", ["--unsafe-no-masking"]))):
            port = args.base_port + i
            p = start([sys.executable, "-m", "deploy.server", "--build", str(build), "--port", str(port),
                       *extra], env, work / f"{name}.log", ROOT)
            procs.append(p)
            urls[name] = (f"http://127.0.0.1:{port}", p)
            wait_ready(f"http://127.0.0.1:{port}/health/ready", p, work / f"{name}.log")
        answers = []
        with httpx.Client(base_url=urls["masking"][0], headers={"Authorization": f"Bearer {KEY}"},
                          timeout=60) as client:
            for i in range(0, len(texts), 64):
                r = client.post("/v1/predict", json={"texts": texts[i:i + 64]})
                r.raise_for_status()
                answers += r.json()["predictions"]
        said = np.array([a["oos"] for a in answers])
        right = np.array([not a["oos"] and a["label"] == t for a, t in zip(answers, test.label, strict=True)])
        served = {
            "in_scope_messages": int(ins.sum()),
            "in_scope_accuracy": round(float(right[ins].mean()), 4),
            "in_scope_rejected": round(float(said[ins].mean()), 4),
            "oos_recall_all_held_back": round(float(said[held].mean()), 4),
            "oos_recall_seen": round(float(said[kind == "seen_oos"].mean()), 4),
            "oos_recall_unseen": round(float(said[kind == "unseen_oos"].mean()), 4),
            "oos_precision": round(float(held[said].mean()), 4) if said.any() else None,
            "held_back_messages": {k: int((kind == k).sum()) for k in ("seen_oos", "unseen_oos")},
        }
        print(json.dumps(served, indent=2))

        # Masking cost: the same build with and without masking, side by side.
        contenders = {name: Contender(name, url, "/v1/predict", {"Authorization": f"Bearer {KEY}"},
                                      body_predict, labels_predict, pids=[p.pid],
                                      metrics_url=f"{url}/metrics")
                      for name, (url, p) in urls.items()}
        runs: dict[str, dict[int, list]] = {n: {1: [], 32: []} for n in contenders}
        order = list(contenders)
        for rep in range(args.repeats):
            for conc in (1, 32):
                for name in order if rep % 2 == 0 else order[::-1]:
                    c = contenders[name]
                    idle = [x.pid for n, x in ((n, u[1]) for n, u in urls.items()) if n != name]
                    measured(c, idle, texts, conc, 3, "wrk", work)  # warm-up
                    res = measured(c, idle, texts, conc, args.seconds, "wrk", work)
                    res["settle_s"] = settle([p.pid for _, p in urls.values()])
                    runs[name][conc].append(res)
    finally:
        for p in procs:
            stop(p)
    med = {n: {c: {k: statistics.median(r[k] for r in rs) for k in
                   ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_request", "other_cpu_cores")}
               | {"errors": sum(r["errors"] for r in rs),
                  "repeats": [{k: r[k] for k in ("requests_per_s", "p50_ms", "p99_ms")} for r in rs]}
               for c, rs in levels.items()} for n, levels in runs.items()}
    results = {
        "command": "python benchmarks/oos_serving.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "hardware": {"cores": os.cpu_count(), "cpu": cpu_model()},
        "data": "Banking77 official train.csv as the export (held-back intents below), official test.csv scored",
        "held_back": split,
        "pipeline_test_split": {k: tr.get(k) for k in ("test_accuracy", "test_in_scope_accuracy",
                                                       "test_oos_recall", "test_oos_precision",
                                                       "reject_threshold", "reject_note")},
        "served_official_test": served,
        "scores_offline": scores,
        "masking_cost": {
            "per_concurrency": med,
            "c1_p50_ms_masking": med["masking"][1]["p50_ms"],
            "c32_throughput_ratio_masking_vs_none": round(
                med["masking"][32]["requests_per_s"] / med["no_masking"][32]["requests_per_s"], 3),
        },
    }
    write_results(results, args.results)


if __name__ == "__main__":
    main()
