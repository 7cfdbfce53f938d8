"""Scoring a split: distributed evaluation (accuracy, macro-F1, weighted loss), the test
split's classification report and confusion matrix, and the confusion-matrix plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from training.config import TrainConfig
from training.data import EncodedDataset, PadCollate
from training.distributed import DistContext, all_gather
from training.optim import autocast


def evaluate(model: nn.Module, ds: EncodedDataset, ctx: DistContext, cfg: TrainConfig,
             collate: PadCollate) -> dict[str, Any] | None:
    """Accuracy, macro-F1 and weighted loss on a split, sharded across ranks.

    Rank r scores rows r, r + W, r + 2W, ... (no padding duplicates, unlike
    DistributedSampler), the predictions are all-gathered and put back in row order, and
    every rank computes the same metrics from the same full set."""
    from sklearn.metrics import accuracy_score, f1_score

    if len(ds) == 0:
        return None
    # Scored shortest first: batches of similar length carry little padding.
    shard = sorted(range(ctx.rank, len(ds), ctx.world_size), key=lambda i: len(ds.ids[i]))
    loader = DataLoader(ds, batch_size=cfg.eval_batch_size or 2 * cfg.batch_size, sampler=shard,
                        collate_fn=collate, generator=torch.Generator())
    was_training = model.training
    model.eval()
    rows: list[tuple[int, int, int, float, float]] = []
    with torch.no_grad():
        for batch in loader:
            b = batch.to(ctx.device)
            with autocast(ctx, cfg.precision):
                logits = model(b.input_ids, b.attention_mask)
            logits = logits.float()
            ce = F.cross_entropy(logits, b.labels, reduction="none")
            pred = logits.argmax(dim=-1)
            rows.extend(zip(b.index.tolist(), pred.tolist(), b.labels.tolist(),
                            b.weights.tolist(), ce.tolist(), strict=True))
    model.train(was_training)
    merged = sorted(r for part in all_gather(ctx, rows) for r in part)
    y_pred = np.array([r[1] for r in merged])
    y_true = np.array([r[2] for r in merged])
    w = np.array([r[3] for r in merged])
    ce_all = np.array([r[4] for r in merged])
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        "loss": float((ce_all * w).sum() / max(w.sum(), 1e-12)),
        "rows": len(merged),
        "y_true": y_true.tolist(),
        "y_pred": y_pred.tolist(),
    }


def _public(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k not in ("y_true", "y_pred")}


def report_and_confusion(test: Mapping[str, Any] | None, labels: Sequence[str],
                         ) -> tuple[dict[str, Any] | None, list[list[int]] | None]:
    """The per-class report (classes that occur in the test split) and the full confusion
    matrix over all ``labels``, or ``(None, None)`` without a test split."""
    from sklearn.metrics import classification_report, confusion_matrix

    if test is None:
        return None, None
    report = classification_report(test["y_true"], test["y_pred"], target_names=[
        labels[i] for i in sorted(set(test["y_true"]) | set(test["y_pred"]))],
        output_dict=True, zero_division=0)
    matrix = confusion_matrix(test["y_true"], test["y_pred"],
                              labels=list(range(len(labels)))).tolist()
    return report, matrix


def plot_confusion(matrix: Sequence[Sequence[int]], labels: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(labels)
    size = max(4.0, min(28.0, 0.3 * n + 3))
    fig, ax = plt.subplots(figsize=(size, size))
    try:
        im = ax.imshow(np.asarray(matrix), cmap="Blues")
        ax.set_xticks(range(n), labels, rotation=90, fontsize=max(4, 10 - n // 10))
        ax.set_yticks(range(n), labels, fontsize=max(4, 10 - n // 10))
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title("test confusion matrix")
        if n <= 20:
            for i in range(n):
                for j in range(n):
                    ax.text(j, i, str(matrix[i][j]), ha="center", va="center", fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
