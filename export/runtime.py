"""Text in, logits out, from an ONNX build folder: what serving runs. No training code.

A build folder holds ``model.onnx``, ``tokenizer.json`` (Hugging Face tokenizers format),
``labels.json`` (class names in logit order) and ``preprocessing.json`` (max length, pad
id, input and output names, build kind). MLflow's ``onnx`` flavor stores the same files,
with the three side files under ``extra_files/``; ``resolve_build`` accepts either layout.

Only onnxruntime, tokenizers and numpy are imported here, so the serving image needs
neither torch nor transformers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MODEL_FILE = "model.onnx"
SIDE_FILES = ("tokenizer.json", "labels.json", "preprocessing.json")


class BuildError(RuntimeError):
    """A build folder that is incomplete or unreadable."""


def resolve_build(folder: str | Path) -> dict[str, Path]:
    """Paths of the model and its side files in a build or an MLflow onnx model folder."""
    folder = Path(folder)
    found: dict[str, Path] = {}
    for name in (MODEL_FILE, *SIDE_FILES):
        for candidate in (folder / name, folder / "extra_files" / name):
            if candidate.is_file():
                found[name] = candidate
                break
    missing = [n for n in (MODEL_FILE, *SIDE_FILES) if n not in found]
    if missing:
        raise BuildError(f"ONNX build {folder} lacks {', '.join(missing)} "
                         f"(a build has {MODEL_FILE} and {', '.join(SIDE_FILES)})")
    return found


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class TextEncoder:
    """Tokenize, truncate to ``max_length`` and pad to the longest row of the batch: the
    same ids and mask the PyTorch predictor builds, so parity compares models, not inputs."""

    def __init__(self, tokenizer_file: str | Path, max_length: int, pad_id: int) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer_file))
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=int(max_length))
        self.max_length = int(max_length)
        self.pad_id = int(pad_id)

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = self.tok.encode_batch(list(texts))
        width = max((len(e.ids) for e in enc), default=1) or 1
        ids = np.full((len(enc), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(enc), width), dtype=np.int64)
        for j, e in enumerate(enc):
            ids[j, : len(e.ids)] = e.ids
            mask[j, : len(e.ids)] = 1
        return ids, mask


# Graph rewrites ONNX Runtime would apply at load time that make our models slower.
# SkipLayerNormFusion folds the residual Add into LayerNormalization; onnxruntime 1.32's CPU
# SkipLayerNormalization kernel took 1.0 ms a call where LayerNormalization plus Add took
# 0.25 ms (MiniLM int8, batch 32, 2 cores, ORT profiler), and disabling the fusion took the
# int8 build from 640 to 800 rows/s at batch 32 (docs/BENCHMARKS.md, issue 6). The
# export's own transformer fusions leave it out for the same reason.
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def session(model_path: str | Path, threads: int = 0, spin: bool = True):
    """An ONNX Runtime CPU session with ``threads`` intra-op threads (0: every core).

    ``spin=False`` makes idle worker threads sleep instead of spinning: a server whose HTTP
    loop shares the cores wants that. Spinning (ONNX Runtime's default) gives the lowest
    latency on cores nothing else needs; sessions timed one after another in one process
    must then pause between builds (see ``export.onnx_build.time_side_by_side``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.intra_op_num_threads = threads or default_threads()
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(DISABLED_OPTIMIZERS))


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class OnnxClassifier:
    """An ONNX build ready to predict: ``predict(texts) -> (labels, scores)``."""

    def __init__(self, folder: str | Path, threads: int = 0) -> None:
        files = resolve_build(folder)
        try:
            self.pre: dict[str, Any] = json.loads(files["preprocessing.json"].read_text())
            self.labels: list[str] = json.loads(files["labels.json"].read_text())
        except json.JSONDecodeError as exc:
            raise BuildError(f"ONNX build {folder}: unreadable side file: {exc}") from exc
        self.encoder = TextEncoder(files["tokenizer.json"], self.pre["max_length"], self.pre["pad_id"])
        self.session = session(files[MODEL_FILE], threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.model_path = files[MODEL_FILE]

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.session.run(None, dict(zip(self.input_names, (ids, mask), strict=True)))[0]

    def logits(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        out = [self.run(*self.encoder(texts[i : i + batch_size]))
               for i in range(0, len(texts), batch_size)]
        return np.concatenate(out) if out else np.zeros((0, len(self.labels)), dtype=np.float32)

    def predict(self, texts: Sequence[str], batch_size: int = 64) -> tuple[list[str], list[float]]:
        p = softmax(self.logits(texts, batch_size))
        top = p.argmax(axis=1)
        return [self.labels[i] for i in top], [float(p[k, i]) for k, i in enumerate(top)]
