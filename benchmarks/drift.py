"""Benchmark: the drift check (issue 26). Targets: at most 1 false alarm per 1,000 windows of
unshifted traffic; report the detection delay for a share of traffic from unseen intents.

Data nobody here wrote: Banking77. The reference (what the champion was trained on) is
the train split without ``--held-back`` intents (10 of 77, the same list as
tests/test_drift.py); windows are drawn from the test split, so no message is on both
sides. An unshifted window draws the kept intents in the reference's proportions; a
shifted one takes ``share`` of its messages from the held-back intents, which get one
of the model's labels at random (a model has no label for them).

* ``detect``: each window is ``--window-rows`` predictions (an hour at ``--rate`` requests
  per second: the label test counts all of them, a multinomial draw of the window's label
  mix) and ``--sample`` embedded messages (the 400 held-back test messages are drawn with
  replacement when a window needs more) (the check's ``monitoring.embedding_sample``).
  Embeddings are computed once per message (the MiniLM encoder), and so is each message's
  nearest-neighbour novelty score against the fixed reference bank; each window runs the
  check's own tests on them (``ops.drift.novelty_test``, ``ops.drift.label_shift``). Detection delay: windows (hours) from
  the shift's start to the first drift verdict, over ``--streams`` streams per share;
  false alarms: drift verdicts in ``--null-windows`` unshifted windows.
* ``runtime``: the check (``ops.monitor.check``, what the monitoring DAG's ``check`` task
  runs) on a prediction log holding ``--hours`` at ``--rate`` requests per second (rows
  of Banking77 test messages in order, written by SQLite itself), for the hourly window
  (and one window over all of it when ``--hours`` is more than 1); the reference (the
  whole train split) is embedded once before, as the check caches it per champion. A day
  of monitoring is 24 hourly checks.

    .venv/bin/python benchmarks/drift.py detect [--streams 20] [--null-windows 1000]
    .venv/bin/python benchmarks/drift.py runtime [--rate 700] [--hours 1]

Results: ``benchmarks/results/drift_detect.json``, ``benchmarks/results/drift_runtime.json``;
docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_HERE = ROOT / "benchmarks"
sys.path[:] = [str(ROOT)] + [q for q in sys.path if q and Path(q).resolve() not in (ROOT, _HERE)] + [str(_HERE)]

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

HELD_BACK = ["card_arrival", "lost_or_stolen_card", "exchange_rate", "top_up_failed", "pin_blocked",
             "apple_pay_or_google_pay", "cash_withdrawal_charge", "age_limit", "beneficiary_not_allowed",
             "country_support"]


def _data() -> tuple[pd.DataFrame, pd.DataFrame]:
    train = pd.read_csv(ROOT / "data" / "banking77" / "train.csv").rename(columns={"category": "label"})
    test = pd.read_csv(ROOT / "data" / "banking77" / "test.csv").rename(columns={"category": "label"})
    return train[~train.label.isin(HELD_BACK)].reset_index(drop=True), test.reset_index(drop=True)


def _host() -> dict[str, Any]:
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "loadavg_1_5_15": [round(x, 2) for x in load],
            "code": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                   text=True).stdout.strip()}


def detect(args) -> dict[str, Any]:
    from core.config import MonitoringConfig
    from ops import drift

    m = MonitoringConfig()
    ref, test = _data()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    ref_idx = rng.permutation(len(ref))[:m.reference_sample]
    ref_emb = drift.embed(ref.text.iloc[ref_idx].tolist())
    test_emb = drift.embed(test.text.tolist())
    embed_s = time.perf_counter() - t0
    n_cal = len(ref_emb) // 3
    # The check's novelty scores, computed once per message (the bank is fixed): a window's
    # test is then the check's own tail test on its messages' scores.
    cal = drift.novelty_scores(ref_emb[n_cal:], ref_emb[:n_cal])
    scores = drift.novelty_scores(ref_emb[n_cal:], test_emb)
    ref_counts = ref.label.value_counts().to_dict()
    known = sorted(ref_counts)
    kept = np.flatnonzero(~test.label.isin(HELD_BACK).to_numpy())
    new = np.flatnonzero(test.label.isin(HELD_BACK).to_numpy())
    share = ref.label.value_counts(normalize=True)
    w = test.label.iloc[kept].map(share / test.label.iloc[kept].value_counts()).to_numpy()
    w = w / w.sum()

    def window(shift: float) -> bool:
        n_new = int(round(args.sample * shift))
        idx = np.r_[rng.choice(kept, args.sample - n_new, replace=False, p=w), rng.choice(new, n_new, replace=n_new > len(new))]
        emb = drift.novelty_test(cal, scores[idx], m.alpha, m.min_novel_excess, m.novelty_quantile)
        # The hour's predicted labels: kept intents in the reference's mix, unseen ones
        # spread over the model's labels.
        n_unseen = rng.binomial(args.window_rows, shift)
        counts = rng.multinomial(args.window_rows - n_unseen, share[known].to_numpy() / share[known].sum())
        counts = counts + rng.multinomial(n_unseen, np.full(len(known), 1 / len(known)))
        lab = drift.label_shift(ref_counts, dict(zip(known, counts.tolist(), strict=True)), m.alpha, m.min_label_tvd)
        return drift.verdict([emb, lab])[0]

    t1 = time.perf_counter()
    alarms = sum(window(0.0) for _ in range(args.null_windows))
    null_s = time.perf_counter() - t1
    delays: dict[str, Any] = {}
    for shift in args.shares:
        per_stream = []
        for _ in range(args.streams):
            hours = next((h for h in range(1, args.max_windows + 1) if window(shift)), None)
            per_stream.append(hours)
        found = [h for h in per_stream if h is not None]
        delays[f"{shift:.0%}"] = {
            "windows_to_detection": per_stream,
            "median_windows": float(np.median(found)) if found else None,
            "detected_in_first_window": sum(1 for h in per_stream if h == 1) / len(per_stream),
            "undetected_after_max_windows": len(per_stream) - len(found)}
    return {
        "what": "drift check on Banking77: reference = train split without 10 held-back intents; windows from the "
                "test split (unshifted: kept intents in the reference's mix; shifted: a share from the held-back intents)",
        "settings": {"alpha_per_test": m.alpha, "min_novel_excess": m.min_novel_excess,
                     "novelty_quantile": m.novelty_quantile, "min_label_tvd": m.min_label_tvd,
                     "reference_sample": int(len(ref_emb)), "embedded_per_window": args.sample,
                     "window_rows": args.window_rows, "tests": ["embedding_novelty", "label_chi2"]},
        "false_alarms": {"windows": args.null_windows, "alarms": int(alarms),
                         "per_1000_windows": round(1000 * alarms / args.null_windows, 2)},
        "detection_delay_hours": delays,
        "seconds": {"embedding_once": round(embed_s, 1), "null_windows": round(null_s, 1)},
        "streams_per_share": args.streams, "max_windows": args.max_windows,
    }


def build_log(db: Path, rate: float, hours: float, end: float, version: str = "1") -> int:
    """A day of prediction-log rows written by SQLite itself (a recursive sequence over the
    Banking77 test messages, in order, one row per request at ``rate`` per second)."""
    from deploy import predlog

    _, test = _data()
    con = predlog.connect(db)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.execute("DROP INDEX IF EXISTS predictions_ts")  # built once after the rows
    con.execute("CREATE TEMP TABLE msgs (i INTEGER PRIMARY KEY, text TEXT, label TEXT)")
    con.executemany("INSERT INTO msgs VALUES (?, ?, ?)", list(zip(range(len(test)), test.text, test.label, strict=True)))
    n = int(rate * hours * 3600)
    start = end - hours * 3600
    con.execute("BEGIN")
    con.execute(
        "WITH RECURSIVE s(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM s WHERE k + 1 < ?) "
        "INSERT INTO predictions (id, ts, text, label, score, oos, abstain, version, latency_ms, variant) "
        "SELECT lower(hex(randomblob(16))), ? + k / ?, m.text, m.label, 0.5 + (abs(random()) % 500) / 1000.0, "
        "abs(random()) % 50 = 0, 0, ?, 5.0, 'stable' FROM s JOIN msgs m ON m.i = k % ?",
        (n, start, rate, version, len(test)))
    con.execute("COMMIT")
    con.execute("CREATE INDEX predictions_ts ON predictions (ts)")
    con.close()
    return n


def runtime(args) -> dict[str, Any]:
    from core.config import load_config
    from ops import monitor

    # The reference is the whole train split here: the log's rows cycle through every
    # test message, all 77 intents, so the window is unshifted (the check runs all its tests).
    ref = pd.read_csv(ROOT / "data" / "banking77" / "train.csv").rename(columns={"category": "label"})
    work = Path(tempfile.mkdtemp(prefix="intentops-drift-bench-"))
    curated = work / "curated"
    curated.mkdir()
    ref.assign(split="train")[["text", "label", "split"]].to_parquet(curated / "part-0.parquet")
    end = 1_796_119_200.0
    cfg = load_config(overrides={"lake_root": str(work / "lake"), "monitoring.reference_path": str(curated),
                                 "tracking.uri": f"sqlite:///{work / 'mlflow.db'}"})
    db = monitor.log_path(cfg)
    t0 = time.perf_counter()
    rows = build_log(db, args.rate, args.hours, end)
    build_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    monitor.check(cfg, end=end - args.hours * 3600 + 1, check_id="warm")  # too little traffic: MLflow set up
    ref_idx = np.random.default_rng(cfg.monitoring.seed).permutation(len(ref))[:cfg.monitoring.reference_sample]
    monitor.reference_embeddings(cfg, ref.text.iloc[ref_idx].tolist())
    warm_s = time.perf_counter() - t1
    out: dict[str, Any] = {"rows": rows, "rate_per_s": args.rate, "hours": args.hours,
                           "log_bytes": db.stat().st_size, "build_log_s": round(build_s, 1),
                           "reference_embedding_and_mlflow_setup_s": round(warm_s, 1), "checks": {}}
    # The hourly DAG's checks one after another over the log's hours (each its own hour
    # of traffic, as the schedule runs them), then one check over the whole log.
    hourly = load_config(overrides={"lake_root": str(work / "lake"), "monitoring.reference_path": str(curated),
                                    "tracking.uri": f"sqlite:///{work / 'mlflow.db'}", "monitoring.window_hours": 1.0})
    runs = []
    for k in range(max(int(args.hours), 1)):
        t = time.perf_counter()
        r = monitor.check(hourly, end=end - k * 3600, check_id=f"h{k}")
        runs.append({"seconds": round(time.perf_counter() - t, 1), "status": r["status"],
                     "predictions": r["window"].get("predictions"), "reasons": r["reasons"]})
    out["checks"]["1h_window"] = runs[0]
    out["hourly_checks"] = runs
    out["hourly_check_median_s"] = float(np.median([x["seconds"] for x in runs]))
    out["day_of_hourly_checks_s"] = round(24 * out["hourly_check_median_s"], 1)
    if args.hours > 1:
        c = load_config(overrides={"lake_root": str(work / "lake"), "monitoring.reference_path": str(curated),
                                   "tracking.uri": f"sqlite:///{work / 'mlflow.db'}",
                                   "monitoring.window_hours": args.hours})
        t = time.perf_counter()
        r = monitor.check(c, end=end, check_id=f"w{int(args.hours)}")
        out["checks"][f"{args.hours:g}h_window"] = {"seconds": round(time.perf_counter() - t, 1),
                                                   "status": r["status"], "predictions": r["window"].get("predictions"),
                                                   "reasons": r["reasons"]}
    import shutil

    shutil.rmtree(work)  # a day of rows is gigabytes
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("detect")
    d.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.1, 0.2, 0.5])
    d.add_argument("--streams", type=int, default=20)
    d.add_argument("--max-windows", type=int, default=24)
    d.add_argument("--null-windows", type=int, default=1000)
    d.add_argument("--sample", type=int, default=1000)
    d.add_argument("--window-rows", type=int, default=700 * 3600)
    d.add_argument("--seed", type=int, default=26)
    d.add_argument("--out", default="benchmarks/results/drift_detect.json")
    r = sub.add_parser("runtime")
    r.add_argument("--rate", type=float, default=700.0)
    r.add_argument("--hours", type=float, default=1.0)
    r.add_argument("--out", default="benchmarks/results/drift_runtime.json")
    args = ap.parse_args()
    host_before = _host()
    t = time.perf_counter()
    result = detect(args) if args.cmd == "detect" else runtime(args)
    result.update(command="python benchmarks/drift.py " + " ".join(sys.argv[1:]), host_before=host_before,
                  host_after=_host(), machine="Intel host (2 vCPUs)", wall_s=round(time.perf_counter() - t, 1),
                  date=time.strftime("%Y-%m-%d", time.gmtime()))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
