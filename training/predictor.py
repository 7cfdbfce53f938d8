"""Batch prediction from a trained model folder, and its MLflow pyfunc wrapper.

The folder is what training writes to ``OUT/model``: ``model_config.json``, ``model.pt``,
``tokenizer.json`` and ``labels.json``. The pyfunc model carries that folder as an
artifact, so ``mlflow.pyfunc.load_model("models:/intentops-banking77@champion")``
predicts from text with no training code path (the ONNX export reads the same folder).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import mlflow.pyfunc

    _PythonModel = mlflow.pyfunc.PythonModel
except ImportError:  # pragma: no cover - mlflow is a dependency; keeps the Predictor importable
    _PythonModel = object


class Predictor:
    def __init__(self, model_dir: str | Path, batch_size: int = 64) -> None:
        import torch
        from tokenizers import Tokenizer

        from training.models import load_trained

        model_dir = Path(model_dir)
        self.model, self.spec = load_trained(model_dir)
        self.labels: list[str] = json.loads((model_dir / "labels.json").read_text())
        self.tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=int(self.spec["max_length"]))
        pad = self.tok.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else int(pad)
        self.batch_size = batch_size
        self._torch = torch

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        torch = self._torch
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                enc = self.tok.encode_batch(list(texts[i : i + self.batch_size]))
                width = max(len(e.ids) for e in enc)
                ids = torch.full((len(enc), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(enc), width), dtype=torch.long)
                for j, e in enumerate(enc):
                    ids[j, : len(e.ids)] = torch.tensor(e.ids)
                    mask[j, : len(e.ids)] = 1
                out.append(self.model(ids, mask).float().numpy())
        return np.concatenate(out) if out else np.zeros((0, len(self.labels)), dtype=np.float32)

    def predict(self, texts: Sequence[str]) -> tuple[list[str], list[float]]:
        logits = self.logits(texts)
        e = np.exp(logits - logits.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        top = p.argmax(1)
        return [self.labels[i] for i in top], [float(p[k, i]) for k, i in enumerate(top)]

    def labels_of(self, texts: list[str]) -> list[str]:
        return self.predict(texts)[0]


class IntentClassifierModel(_PythonModel):
    """pyfunc: a DataFrame with a ``text`` column (or a list of strings) in, a DataFrame
    with ``label``, ``score`` and ``oos`` out. It keeps the model's contract
    (``contract.json``, written by the train stage) like the model server does: each text
    is normalized and PII-masked as the training data was, and the reject rule decides
    ``oos`` (``label`` is then the out-of-scope label, or empty when the set has none)."""

    def load_context(self, context) -> None:
        import os

        from contract.preprocess import Preprocessor
        from contract.reject import RejectRule

        model_dir = Path(context.artifacts["model_dir"])
        self.predictor = Predictor(model_dir)
        self.preprocess = None
        self.rule = RejectRule.from_dict(None)
        contract = model_dir / "contract.json"
        if contract.is_file():
            c = json.loads(contract.read_text())
            key = os.environ.get("INTENTOPS_PSEUDONYM_KEY", "").encode() or None
            self.preprocess = Preprocessor(c["text_preprocessing"], key=key)
            self.rule = RejectRule.from_dict(c["reject"])

    def predict(self, context, model_input, params: dict[str, Any] | None = None):
        import pandas as pd

        from contract.reject import decide, softmax

        if isinstance(model_input, pd.DataFrame):
            texts = model_input["text"].astype(str).tolist()
        else:
            texts = [str(t) for t in model_input]
        if self.preprocess is not None:
            texts = [self.preprocess(t) for t in texts]
        answers = decide(softmax(self.predictor.logits(texts)), self.predictor.labels, self.rule)
        return pd.DataFrame({"label": [a["label"] or "" for a in answers],
                             "score": [a["score"] for a in answers],
                             "oos": [a["oos"] for a in answers]})
