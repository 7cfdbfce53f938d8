"""Annotators and label noise: several annotators per message, drawn from a pool of 8 of
varied reliability, whose errors pick a confusable neighbour label half the time. The
first annotator's label is the one the export carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from demo.common import _np_rng

if TYPE_CHECKING:
    from demo.builder import BuilderConfig


SINGLE_ANNOTATOR_SHARE = 0.05
# Annotator error rates as multiples of label_error_rate (mean 1.0): at 0.08 that is
# 2%, 4%, 6%, 8%, 8%, 10%, 12%, 14%.
RELIABILITY = (0.25, 0.5, 0.75, 1.0, 1.0, 1.25, 1.5, 1.75)
NEIGHBOUR_ERROR_SHARE = 0.5  # label errors that pick a confusable neighbour label


def _neighbour_table(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Confusable labels per label: same first word (card_*, top_*), else a shared word."""
    stop = {"or", "by", "of", "and", "to", "after", "not", "a", "the", "on", "my", "for", "into", "via"}
    toks = [set(n.rstrip("?").split("_")) - stop for n in names]
    lists = []
    for i, n in enumerate(names):
        head = n.split("_")[0]
        nb = [j for j, m in enumerate(names) if j != i and m.split("_")[0] == head]
        lists.append(nb or [j for j in range(len(names)) if j != i and toks[i] & toks[j]])
    width = max(1, max(len(x) for x in lists))
    table = np.zeros((len(names), width), dtype=np.int16)
    for i, nb in enumerate(lists):
        table[i, : len(nb)] = nb
    return table, np.array([len(x) for x in lists], dtype=np.int64)


@dataclass
class Annotations:
    json: list[str]
    first_label: np.ndarray
    n_annotations: int
    n_wrong: int
    first_wrong: int
    single_annotator_rows: int


def annotate(true_labels: np.ndarray, names: Sequence[str], cfg: BuilderConfig) -> Annotations:
    """Vectorized: annotators drawn per row from a pool of 8 of varied reliability; an error
    is a confusable neighbour label half the time, else any other label."""
    rng = _np_rng(cfg.seed, 3)
    n, pool_n, n_labels = len(true_labels), len(RELIABILITY), len(names)
    k = cfg.annotators_per_item
    err = np.clip(cfg.label_error_rate * np.array(RELIABILITY), 0.0, 0.95)
    who = np.argsort(rng.random((n, pool_n)), axis=1)[:, :k]
    count = np.full(n, k)
    count[rng.random(n) < SINGLE_ANNOTATOR_SHARE] = 1
    truth = true_labels.astype(np.int64)[:, None].repeat(k, axis=1)
    wrong = rng.random((n, k)) < err[who]
    table, nb_count = _neighbour_table(names)
    use_nb = (rng.random((n, k)) < NEIGHBOUR_ERROR_SHARE) & (nb_count[truth] > 0)
    nb_pick = table[truth, (rng.random((n, k)) * np.maximum(nb_count[truth], 1)).astype(np.int64)]
    other = rng.integers(0, n_labels - 1, size=(n, k))
    other += other >= truth  # any label but the true one
    labels = np.where(wrong, np.where(use_nb, nb_pick, other), truth)
    active = np.arange(k)[None, :] < count[:, None]
    ann_str = [[f'{{"annotator": "ann_{a + 1:02d}", "label": "{lab}"}}' for lab in names]
               for a in range(pool_n)]
    out = []
    for row_who, row_lab, c in zip(who.tolist(), labels.tolist(), count.tolist(), strict=True):
        out.append("[" + ", ".join(ann_str[a][b] for a, b in zip(row_who[:c], row_lab[:c],
                                                                strict=True)) + "]")
    mis = (labels != truth) & active
    return Annotations(
        json=out,
        first_label=labels[:, 0],
        n_annotations=int(active.sum()),
        n_wrong=int(mis.sum()),
        first_wrong=int(mis[:, 0].sum()),
        single_annotator_rows=int((count == 1).sum()),
    )
