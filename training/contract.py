"""The trained model's serving contract (``contract.json`` beside the model): the text
preprocessing its training data went through and its reject rule, calibrated on the
validation split, with the out-of-scope figures on the test split.

The train stage calls ``attach`` after the torchrun group finishes (rank 0 has written the
model); the export copies the contract into each build and checks that the int8 build
keeps the rule's decisions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from contract import reject
from core.config import OosConfig
from textnorm import normalize_label

CONTRACT_FILE = "contract.json"


def oos_label(cfg: OosConfig) -> str | None:
    return normalize_label(cfg.label) if cfg.label else None


def probabilities(model_dir: Path, texts: list[str]) -> tuple[np.ndarray, list[str]]:
    from training.predictor import Predictor

    predictor = Predictor(model_dir)
    # Shortest first, in batches of similar length (little padding), then back in order.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    logits = predictor.logits([texts[i] for i in order])
    out = np.empty_like(logits)
    out[order] = logits
    return reject.softmax(out), predictor.labels


def attach(model_dir: str | Path, splits: dict[str, pd.DataFrame], oos: OosConfig,
           text_preprocessing: dict[str, Any]) -> dict[str, Any]:
    """Calibrate the reject rule on ``splits['val']``, score it on ``splits['test']``, and
    write ``contract.json``; returns the figures (``val_*``/``test_*`` keys and the threshold)."""
    model_dir = Path(model_dir)
    label = oos_label(oos)
    val, test = splits["val"], splits["test"]
    probs, labels = probabilities(model_dir, val.text.astype(str).tolist())
    if label is not None and label not in labels:
        raise ValueError(f"oos.label {label!r} is not one of the model's {len(labels)} labels "
                         "(it never occurs in the training data)")
    rule = reject.calibrate(probs, val.label.astype(str).tolist(), labels, label,
                            oos.target_in_scope_recall, oos.min_calibration_rows)
    figures: dict[str, Any] = {"reject_threshold": rule.threshold, "reject_note": rule.note}
    for name, frame, p in (("val", val, probs), ("test", test, None)):
        if frame.empty:
            continue
        if p is None:
            p, _ = probabilities(model_dir, frame.text.astype(str).tolist())
        m = reject.oos_metrics(frame.label.astype(str).tolist(), reject.decide(p, labels, rule), label)
        figures |= {f"{name}_{k}": v for k, v in m.items()}
    (model_dir / CONTRACT_FILE).write_text(json.dumps(
        {"text_preprocessing": text_preprocessing, "reject": rule.to_dict()}, indent=2))
    return figures
