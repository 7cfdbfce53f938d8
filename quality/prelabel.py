"""The champion's pre-labels for the review push: messages without a label get the
serving champion's suggestion (its int8 build, the copy the model servers load) when its
label set is the run's. Only the review push imports this module: label QA's key and
code version do not depend on the champion or the build code.
"""

from __future__ import annotations

import json

import numpy as np

from core.config import PipelineConfig


def champion_for(cfg: PipelineConfig, classes: list[str]) -> tuple[str | None, str]:
    """(champion version, why) when it may pre-label this run's messages: it exists, its
    int8 build passed its gate, and its labels are the run's; (None, why not) otherwise."""
    from core import tracking

    name = cfg.training.registered_model
    try:
        mv = tracking.mlflow_client(cfg).get_model_version_by_alias(name, "champion")
    except Exception as exc:  # no model or no alias yet: the first runs
        return None, f"{name} has no champion ({type(exc).__name__})"
    if mv.tags.get("intentops.onnx.int8.status") != "passed":
        return None, f"{name} v{mv.version} has no int8 build that passed its gate"
    labels = mv.tags.get("intentops.labels")
    if labels is None or sorted(json.loads(labels)) != sorted(classes):
        return None, f"{name} v{mv.version} was trained on another label set"
    return str(mv.version), f"{name} v{mv.version} (int8 ONNX build)"


def champion_prelabel(cfg: PipelineConfig, version: str, texts: list[str]) -> tuple[list[str], np.ndarray]:
    """The champion's (label, probability) per masked text, from its int8 build (the copy
    the model servers load)."""
    from export.registry import fetch_int8_build
    from export.runtime import OnnxClassifier

    build = fetch_int8_build(cfg, cfg.training.registered_model, version)
    # One message per call: int8 activations are quantized per batch, so a message's
    # confidence would otherwise depend on which messages share its batch.
    labels, scores = OnnxClassifier(build, threads=1).predict(texts, batch_size=1)
    return labels, np.asarray(scores, dtype=float)
