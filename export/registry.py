"""Builds back from the registry: a registered version's int8 ONNX build, downloaded once.

Apart from ``export/task.py`` (which builds and attaches them, and imports the model code)
so that its readers, the deployment and the review push's pre-labeling, do not depend on
the training code: a stage's code version follows its imports.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from core import tracking
from core.config import PipelineConfig
from export import runtime


def fetch_int8_build(cfg: PipelineConfig, name: str, version: str) -> Path:
    """A registered version's int8 ONNX build, downloaded once into the deployment's
    ``builds/v<version>`` (what the model servers load; the review push's pre-labeling
    reads the same copy). ``runtime.BuildError`` for a version without a build, or whose
    build failed its gate (a failed build is never served)."""
    import mlflow
    import yaml

    dst = cfg.deploy_dir / "builds" / f"v{version}"
    if (dst / runtime.MODEL_FILE).exists():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    mv = tracking.mlflow_client(cfg).get_model_version(name, version)
    status = mv.tags.get("intentops.onnx.int8.status")
    if status is None:
        raise runtime.BuildError(f"{name} v{version} has no int8 build attached (no export); not deploying it")
    if status != "passed":
        raise runtime.BuildError(f"{name} v{version}: its int8 build failed its checks "
                                 f"({mv.tags.get('intentops.onnx.int8.reason', 'no reason recorded')}); "
                                 f"a failed build is never deployed")
    uri = mv.tags["intentops.onnx.int8.model_uri"]
    mlflow.set_tracking_uri(tracking.tracking_uri(cfg))
    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(Path(tmp) / "dl")))
        meta = {}
        if (folder / "MLmodel").exists():
            meta = (yaml.safe_load((folder / "MLmodel").read_text()) or {}).get("metadata") or {}
        if meta.get("intentops.status") != "passed":
            raise runtime.BuildError(f"{uri} is not a build that passed its export gate; not deploying it")
        files = runtime.resolve_build(folder)
        part = Path(tmp) / "build"
        part.mkdir()
        for name_, path in files.items():
            (part / name_).write_bytes(Path(path).read_bytes())
        pre = json.loads((part / "preprocessing.json").read_text())  # the server reports it
        pre |= {"model_version": str(version), "registered_model": name}
        (part / "preprocessing.json").write_text(json.dumps(pre, indent=2))
        os.replace(part, dst)
    return dst
