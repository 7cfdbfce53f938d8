"""The training config file: the ``--config`` JSON, validated as ``TrainConfig`` (the
pipeline's ``core.config.TrainingHParams``, the one definition of the hyper-parameters),
with every problem named in one ``TrainingDataError``."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from core.config import TrainingHParams
from training.data import TrainingDataError

# The hyper-parameters are defined once, in the pipeline's typed config.
TrainConfig = TrainingHParams


def load_config(path: str | Path) -> TrainConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TrainingDataError(f"{path}: cannot read the training config: {exc}") from exc
    if not isinstance(raw, dict):
        raise TrainingDataError(f"{path}: the training config must be a JSON object")
    try:
        return TrainConfig(**raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}"
                             for e in exc.errors())
        raise TrainingDataError(f"{path}: invalid training config: {problems}") from exc
