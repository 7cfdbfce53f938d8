"""The monitoring check: one window of served traffic against the champion's training data.

Run by the monitoring DAG (``dags/intentops_monitoring.py``) every hour, or by hand with
``intentops monitor check [--end UNIX_TIME]``. It reads the prediction log
(``deploy.predlog``: masked text only) for ``[end - monitoring.window_hours, end)``, and the
reference: the curated training split the champion was trained on (found through the
registry: champion version -> its MLflow run's ``intentops.data.labelqa_key`` tag -> the
label-QA output in the lake), or ``monitoring.reference_path``.

It writes ``<lake>/monitoring/<check id>/check.json`` (every figure, the verdict, the
reasons) and ``sample.json`` (the prediction ids of the embedded window sample: the
pointer an asset event carries; ids, never text), logs the figures to the MLflow
experiment ``intentops-<dataset>-monitoring``, and pushes them to the Pushgateway
(``intentops_drift_*``; the ``IntentopsDriftDetected`` alert). A window with fewer than
``monitoring.min_predictions`` rows is reported as "too little traffic", not as drift.

It also counts what arrived since the last event of each kind: feedback labels (the
"new labels" asset) and unlabeled out-of-scope or abstained predictions (the "review"
asset); ``<lake>/monitoring/state.json`` remembers when each event was last emitted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from core.config import PipelineConfig
from core.stage import StageError, atomic_write_text, safe_run_id

log = logging.getLogger("intentops.monitor")


class NoReference(StageError):
    """Nothing to compare with: no champion, or its training data is not in the lake."""


def monitoring_dir(cfg: PipelineConfig) -> Path:
    return cfg.lake / "monitoring"


def log_path(cfg: PipelineConfig) -> Path:
    return cfg.lake / "predictions" / "predictions.db"


# -- the reference ---------------------------------------------------------------------


def champion_reference(cfg: PipelineConfig) -> tuple[Path, str]:
    """(curated folder, champion version) of the champion's training data."""
    from core import tracking

    client = tracking.mlflow_client(cfg)
    name = cfg.training.registered_model
    try:
        mv = client.get_model_version_by_alias(name, "champion")
    except Exception as exc:  # no model, no alias: nothing serves, nothing to compare with
        raise NoReference(f"{name} has no champion: {exc}") from None
    key = client.get_run(mv.run_id).data.tags.get("intentops.data.labelqa_key")
    if not key:
        raise NoReference(f"{name} v{mv.version}: its run has no intentops.data.labelqa_key tag")
    folder = cfg.lake / "labelqa" / key / "curated"
    if not folder.exists():
        raise NoReference(f"{name} v{mv.version}: its training data {folder} is not in the lake")
    return folder, str(mv.version)


def load_reference(cfg: PipelineConfig) -> tuple[Any, str]:
    """The reference rows (the curated train split: text, label) and what they are."""
    import pandas as pd

    if cfg.monitoring.reference_path:
        folder, what = cfg.resolve_path(cfg.monitoring.reference_path), "monitoring.reference_path"
    else:
        folder, version = champion_reference(cfg)
        what = f"champion v{version}"
    if not Path(folder).exists():
        raise NoReference(f"reference {folder} not found")
    df = pd.read_parquet(folder, columns=["text", "label", "split"])
    train = df[df.split == "train"]
    if train.empty:
        raise NoReference(f"{folder}: no train rows")
    return train, f"{what} ({folder})"


def reference_embeddings(cfg: PipelineConfig, texts: list[str]) -> np.ndarray:
    """Embeddings of a seeded sample of the reference, cached by the sample's content (the
    reference changes only when the champion does)."""
    from ops import drift

    key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    cache = monitoring_dir(cfg) / "reference" / f"{key}.npy"
    if cache.exists():
        return np.load(cache)
    emb = drift.embed(texts)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npy")
    np.save(tmp, emb)
    tmp.replace(cache)
    return emb


# -- the window -------------------------------------------------------------------------


def window_counts(con, start: float, end: float) -> dict[str, Any]:
    """Label counts of in-scope predictions, rows, out-of-scope rows, versions."""
    counts: dict[str, int] = {}
    n = oos = 0
    versions: dict[str, int] = {}
    for label, is_oos, version, c in con.execute(
            "SELECT label, oos, version, COUNT(*) FROM predictions WHERE ts >= ? AND ts < ? "
            "GROUP BY label, oos, version", (start, end)):
        n += c
        versions[version] = versions.get(version, 0) + c
        if is_oos:
            oos += c
        elif label is not None:
            counts[label] = counts.get(label, 0) + c
    return {"n": n, "oos": oos, "labels": counts, "versions": versions}


def sample_rows(con, start: float, end: float, k: int, rng: np.random.Generator,
                columns: str = "id, text, score", version: str | None = None) -> list[tuple]:
    """Up to ``k`` rows of the window, uniformly by sequence number: a read of k rows, not
    of the window (a day at serving rates is tens of millions of rows)."""
    where, args = "ts >= ? AND ts < ?", [start, end]
    if version is not None:
        where += " AND version = ?"
        args.append(version)
    lo, hi = con.execute(f"SELECT MIN(seq), MAX(seq) FROM predictions WHERE {where}", args).fetchone()
    if lo is None:
        return []
    span = hi - lo + 1
    if span <= 2 * k:
        rows = con.execute(f"SELECT {columns} FROM predictions WHERE {where} ORDER BY seq", args).fetchall()
        if len(rows) > k:
            rows = [rows[i] for i in sorted(rng.choice(len(rows), k, replace=False))]
        return rows
    out: list[tuple] = []
    tried: set[int] = set()
    for _ in range(4):  # rows of other windows or versions interleave: draw again for the misses
        seqs = [int(s) for s in rng.choice(np.arange(lo, hi + 1), min(span, 2 * (k - len(out))), replace=False)
                if int(s) not in tried]
        tried.update(seqs)
        for i in range(0, len(seqs), 900):  # SQLite's bound-variable limit
            chunk = seqs[i:i + 900]
            out += con.execute(f"SELECT {columns} FROM predictions WHERE seq IN ({','.join('?' * len(chunk))}) "
                               f"AND {where}", [*chunk, *args]).fetchall()
        if len(out) >= k:
            break
    return out[:k]


# -- the check --------------------------------------------------------------------------


def _load_state(cfg: PipelineConfig) -> dict[str, float]:
    path = monitoring_dir(cfg) / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def mark_emitted(cfg: PipelineConfig, kind: str, at: float) -> None:
    """Remember that the ``kind`` event ("new_labels", "review") was emitted for data up to ``at``."""
    state = _load_state(cfg)
    state[kind] = max(float(at), state.get(kind, 0.0))
    path = monitoring_dir(cfg) / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(state, indent=2))


def pending(cfg: PipelineConfig, con, end: float) -> dict[str, Any]:
    """Feedback labels and unlabeled out-of-scope / abstained predictions since the last
    event of each kind (up to ``end``), and whether each is enough for an event."""
    state = _load_state(cfg)
    m = cfg.monitoring
    since_labels = state.get("new_labels", 0.0)
    labels = con.execute("SELECT COUNT(*) FROM feedback WHERE ts > ? AND ts <= ?", (since_labels, end)).fetchone()[0]
    since_review = state.get("review", 0.0)
    review = con.execute(
        "SELECT COUNT(*) FROM predictions p WHERE p.ts > ? AND p.ts <= ? AND (p.oos = 1 OR p.abstain = 1) "
        "AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.prediction_id = p.id)", (since_review, end)).fetchone()[0]
    return {"new_labels": {"count": int(labels), "since": since_labels, "enough": labels >= m.min_new_labels,
                           "needed": m.min_new_labels},
            "review": {"count": int(review), "since": since_review, "enough": review >= m.min_review_rows,
                       "needed": m.min_review_rows}}


def check(cfg: PipelineConfig, end: float | None = None, check_id: str | None = None,
          reference: tuple[Any, str] | None = None) -> dict[str, Any]:
    """One check of the window ending at ``end`` (Unix time; default now). Returns the
    result written to ``check.json`` (its path under ``path``)."""
    from deploy import predlog
    from ops import drift

    m = cfg.monitoring
    end = time.time() if end is None else float(end)
    start = end - m.window_hours * 3600
    check_id = safe_run_id(check_id or f"check_{int(end)}")
    out = monitoring_dir(cfg) / check_id
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"check_id": check_id, "window": {"start": start, "end": end, "hours": m.window_hours},
                              "status": "", "drift": False, "reasons": [], "tests": []}
    db = log_path(cfg)
    if not db.exists():
        result.update(status="no_log", note=f"no prediction log at {db}: nothing is served with logging on")
        return _finish(cfg, out, result)
    con = predlog.open_log(db)
    try:
        win = window_counts(con, start, end)
        result["window"].update(predictions=win["n"], out_of_scope=win["oos"], versions=win["versions"])
        result["pending"] = pending(cfg, con, end)
        fb = con.execute("SELECT COUNT(*), SUM(f.correct) FROM feedback f JOIN predictions p ON p.id = f.prediction_id "
                         "WHERE p.ts >= ? AND p.ts < ?", (start, end)).fetchone()
        if win["n"] < m.min_predictions:
            result.update(status="too_little_traffic",
                          note=f"{win['n']} predictions in the window, {m.min_predictions} needed for a drift verdict")
            return _finish(cfg, out, result)
        try:
            ref, what = reference if reference is not None else load_reference(cfg)
        except NoReference as exc:
            result.update(status="no_reference", note=str(exc))
            return _finish(cfg, out, result)
        result["reference"] = {"what": what, "rows": int(len(ref))}
        rng = np.random.default_rng([m.seed, int(end)])
        tests = []
        # Embedding drift on a sample of each side (masked text on both: the log holds what
        # the model saw, the curated set what it was trained on).
        rows = sample_rows(con, start, end, m.embedding_sample, rng)
        ref_idx = np.random.default_rng(m.seed).permutation(len(ref))[:m.reference_sample]
        ref_emb = reference_embeddings(cfg, ref.text.iloc[ref_idx].tolist())
        n_cal = len(ref_emb) // 3  # a third calibrates the novelty score, the rest is the bank
        win_emb = drift.embed([r[1] or "" for r in rows])
        tests.append(drift.embedding_drift(ref_emb[n_cal:], ref_emb[:n_cal], win_emb, m.alpha,
                                           m.min_novel_excess, m.novelty_quantile))
        atomic_write_text(out / "sample.json", json.dumps({"window": [start, end], "prediction_ids": [r[0] for r in rows]}))
        tests.append(drift.label_shift(ref.label.value_counts().to_dict(), win["labels"], m.alpha, m.min_label_tvd))
        # Confidence and out-of-scope rate against the main version's earlier traffic.
        version = max(win["versions"], key=win["versions"].get)
        b_start = start - m.baseline_hours * 3600
        base = con.execute("SELECT COUNT(*), SUM(oos) FROM predictions WHERE ts >= ? AND ts < ? AND version = ?",
                           (b_start, start, version)).fetchone()
        base_scores = np.array([r[0] for r in sample_rows(con, b_start, start, 20000, rng, "score", version)])
        win_scores = np.array([r[0] for r in sample_rows(con, start, end, 20000, rng, "score", version)])
        tests.append(drift.confidence_shift(base_scores, win_scores, m.alpha, m.min_confidence_ks))
        v_oos = con.execute("SELECT COUNT(*), SUM(oos) FROM predictions WHERE ts >= ? AND ts < ? AND version = ?",
                            (start, end, version)).fetchone()
        tests.append(drift.oos_shift(int(base[1] or 0), int(base[0]), int(v_oos[1] or 0), int(v_oos[0]),
                                     m.alpha, m.min_oos_rate_change))
        tests.append(drift.live_accuracy(int(fb[1] or 0), int(fb[0]), m.min_feedback, m.min_live_accuracy))
        result["baseline"] = {"version": version, "predictions": int(base[0]), "hours": m.baseline_hours}
    finally:
        con.close()
    result["tests"] = tests
    result["drift"], result["reasons"] = drift.verdict(tests)
    result["status"] = "drift" if result["drift"] else "no_drift"
    result["sample"] = str(out / "sample.json")
    return _finish(cfg, out, result)


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The numeric figures of a check, flat (MLflow metrics, Prometheus gauges, event extra)."""
    f: dict[str, float] = {"drift": float(result["drift"]), "predictions": float(result["window"].get("predictions", 0))}
    for t in result.get("tests", []):
        for k in ("excess", "tvd", "ks", "change", "accuracy", "p_value"):
            if isinstance(t.get(k), (int, float)):
                f[f"{t['test']}_{k}"] = float(t[k])
    return f


def _finish(cfg: PipelineConfig, out: Path, result: dict[str, Any]) -> dict[str, Any]:
    result["path"] = str(out / "check.json")
    result["mlflow_run_id"] = _log_mlflow(cfg, result)
    atomic_write_text(out / "check.json", json.dumps(result, indent=2, default=str))
    from core import pushmetrics

    pushmetrics.drift(cfg.dataset, result["status"], figures(result))
    log.info("monitoring %s: %s %s", result["check_id"], result["status"], "; ".join(result["reasons"]))
    return result


def _log_mlflow(cfg: PipelineConfig, result: dict[str, Any]) -> str | None:
    """Figures to MLflow, one run per check. Without a reachable tracking server the check
    still reports (monitoring must not stop on the registry being down): logged, None."""
    from core import tracking

    try:
        logged = tracking.log_stage_run(
            cfg, f"intentops-{cfg.dataset}-monitoring", f"monitoring:{result['check_id']}",
            f"monitoring-{result['check_id']}",
            params={"window_hours": cfg.monitoring.window_hours, "alpha": cfg.monitoring.alpha,
                    "min_novel_excess": cfg.monitoring.min_novel_excess, "reference": result.get("reference", {}).get("what", "")},
            metrics=figures(result),
            tags={"intentops.monitoring.status": result["status"],
                  "intentops.monitoring.reasons": "; ".join(result["reasons"])[:5000]},
            artifacts=[])
        return logged["run_id"]
    except Exception as exc:  # the registry down must not hide a drift verdict
        log.warning("monitoring: MLflow logging failed: %s", exc)
        return None
