"""The export stage as the DAG runs it: ONNX builds for the run's registered version.

Reads the model from the registry (``models:/<name>/<version>``, the training pyfunc's
``model_dir`` artifact), so what is exported is exactly what was registered. Builds,
checks and times the fp32 and int8 builds (``export.build``), then attaches them to the
same MLflow model version:

* each build is logged with the ``onnx`` flavor to the version's training run, with the
  tokenizer, label map and preprocessing as extra files, so serving needs nothing else;
* version tags point at them: ``intentops.onnx.fp32.model_uri``,
  ``intentops.onnx.int8.model_uri``, ``intentops.onnx.int8.status`` (passed | failed) and
  ``intentops.onnx.int8.reason``; serving deploys only ``passed``;
* the report's figures are logged as metrics linked to the version's model (they show on
  the version's page), and report.md / report.json / speed.png as run artifacts.

Idempotent twice over: the stage is keyed by the registration output and the export
config (a rerun is a cache hit), and the version tag ``intentops.export.key`` makes a
re-publish after a lost lake reuse the builds already attached instead of adding more.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from core import stage, stages, tracking
from core.config import PipelineConfig
from export import build, onnx_build, runtime

log = logging.getLogger(__name__)
EXPORT = "export"
KEY_TAG = "intentops.export.key"
STATUS_TAG = "intentops.onnx.int8.status"


def model_dir_of_version(cfg: PipelineConfig, name: str, version: str, dst: Path) -> Path:
    """Download the version's artifacts and find the trained model folder in them."""
    import mlflow

    mlflow.set_tracking_uri(tracking.tracking_uri(cfg))
    root = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}",
                                                    dst_path=str(dst)))
    hits = sorted(p.parent for p in root.rglob("model_config.json"))
    if not hits:
        raise onnx_build.ExportError(
            f"model version {name} v{version} has no trained model folder (model_config.json, "
            f"model.pt, tokenizer.json, labels.json) among its artifacts; was it logged by the "
            f"train stage?")
    return onnx_build.check_model_dir(hits[0])


def _signature(num_classes: int):
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    ids = TensorSpec(np.dtype("int64"), (-1, -1), "input_ids")
    mask = TensorSpec(np.dtype("int64"), (-1, -1), "attention_mask")
    return ModelSignature(inputs=Schema([ids, mask]),
                          outputs=Schema([TensorSpec(np.dtype("float32"), (-1, num_classes), "logits")]))


def metrics_of(report: dict[str, Any]) -> dict[str, float]:
    m: dict[str, float] = {}
    for b, vals in report["builds"].items():
        for k in ("size_mb", "accuracy", "p50_ms_b1", "p99_ms_b1", "throughput_b32"):
            m[f"export_{b}_{k}"] = float(vals[k])
    for k, v in report["ratios"].items():
        m[f"export_{k}"] = float(v)
    m["export_parity_max_abs_diff"] = float(report["parity"]["max_abs_diff"])
    m["export_int8_agreement"] = float(report["int8"]["agreement"])
    return m


def version_model_id(client, mv) -> str | None:
    """The logged model behind a version. A tracking server's registry does not always
    return ``model_id`` on the version; the training run's ``intentops.model_uri`` tag
    (``models:/m-...``) names it too."""
    if getattr(mv, "model_id", None):
        return mv.model_id
    uri = client.get_run(mv.run_id).data.tags.get("intentops.model_uri", "")
    return uri.removeprefix("models:/") if uri.startswith("models:/m-") else None


def attach(cfg: PipelineConfig, name: str, version: str, out: Path, report: dict[str, Any],
           key: str) -> dict[str, str]:
    """Log both builds (onnx flavor), metrics and report to the version; returns the URIs."""
    import mlflow
    import onnx

    client = tracking.mlflow_client(cfg)
    mv = client.get_model_version(name, version)
    if mv.tags.get(KEY_TAG) == key:
        log.info("builds already attached to %s v%s; reusing them", name, version)
        return {b: mv.tags[f"intentops.onnx.{b}.model_uri"] for b in ("fp32", "int8")}
    mlflow.set_tracking_uri(tracking.tracking_uri(cfg))
    # The version's run may sit in another experiment than one this process set active.
    mlflow.set_experiment(experiment_id=client.get_run(mv.run_id).info.experiment_id)
    status = report["int8"]["status"]
    num_classes = len(json.loads((out / "fp32" / "labels.json").read_text()))
    uris: dict[str, str] = {}
    with mlflow.start_run(run_id=mv.run_id):
        for b in ("fp32", "int8"):
            folder = out / b
            info = mlflow.onnx.log_model(
                onnx.load(str(folder / runtime.MODEL_FILE)),
                name=f"onnx-{b}-v{version}",
                signature=_signature(num_classes),
                extra_files=[str(folder / f) for f in runtime.SIDE_FILES],
                save_as_external_data=False,
                metadata={"intentops.build": b, "intentops.model_version": str(version),
                          "intentops.status": "passed" if b == "fp32" else status},
                tags={"intentops.build": b, "intentops.registered_model": name,
                      "intentops.model_version": str(version)},
            )
            uris[b] = info.model_uri
            builds_key = "onnx_fp32" if b == "fp32" else "onnx_int8"
            for k, v in report["builds"][builds_key].items():
                client.log_metric(mv.run_id, f"export_{k}", float(v), model_id=info.model_id)
        model_id = version_model_id(client, mv)
        for k, v in metrics_of(report).items():
            client.log_metric(mv.run_id, k, v, model_id=model_id)
    art = f"export/v{version}"
    for f in ("report.md", "report.json", "speed.png"):
        client.log_artifact(mv.run_id, str(out / f), artifact_path=art)
    tags = {"intentops.onnx.fp32.model_uri": uris["fp32"], "intentops.onnx.int8.model_uri": uris["int8"],
            STATUS_TAG: status, "intentops.onnx.int8.reason": report["int8"]["reason"][:500],
            "intentops.onnx.int8.quantization": json.dumps(report["int8"]["chosen"]),
            "intentops.export.report": f"runs:/{mv.run_id}/{art}/report.md"}
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)
    client.set_model_version_tag(name, version, KEY_TAG, key)  # last: marks the attach complete
    return uris


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    import pandas as pd

    reg = stage.upstream(cfg.lake, run_id, "register")
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    name = cfg.training.registered_model
    inputs = {"register": {"key": reg.manifest["key"]}}
    stage_cfg = {"export": cfg.export.model_dump(), "model": name}
    code = stages.code_version(EXPORT)
    key = stage.stage_key(EXPORT, inputs, stage_cfg, code)

    def work(out: Path) -> dict[str, Any]:
        rs = reg.manifest["stats"]
        if not rs.get("registered"):
            reason = f"no model version registered by this run ({rs.get('reason')})"
            log.info("export skipped: %s", reason)
            return {"rows_in": None, "kept": None, "exported": False, "reason": reason}
        version = str(rs["version"])
        cur = pd.read_parquet(Path(qa.path) / "curated", columns=["record_id", "text", "label", "split"])
        test = cur[cur.split == "test"]
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            model_dir = model_dir_of_version(cfg, name, version, Path(tmp))
            report = build.build_all(model_dir, test.text.tolist(), test.label.tolist(),
                                     test.record_id.astype(str).tolist(), cfg.export, out)
        for b in ("fp32", "int8"):  # serving reports the version it answers from
            pre_file = out / b / "preprocessing.json"
            pre = json.loads(pre_file.read_text()) | {"model_version": version, "registered_model": name}
            pre_file.write_text(json.dumps(pre, indent=2))
        uris = attach(cfg, name, version, out, report, key)
        b = report["builds"]
        return {"rows_in": None, "kept": None, "exported": True, "model_version": version,
                "int8_status": report["int8"]["status"], "int8_reason": report["int8"]["reason"],
                "quantization": report["int8"]["chosen"], "parity_max_abs_diff": report["parity"]["max_abs_diff"],
                "sizes_mb": {k: v["size_mb"] for k, v in b.items()},
                "accuracy": {k: v["accuracy"] for k, v in b.items()},
                "p50_ms_b1": {k: v["p50_ms_b1"] for k, v in b.items()},
                "throughput_b32": {k: v["throughput_b32"] for k, v in b.items()},
                "ratios": report["ratios"], "threads": report["hardware"]["threads"],
                "fp32_model_uri": uris["fp32"], "int8_model_uri": uris["int8"]}

    return stage.run_stage(EXPORT, cfg.lake, inputs, stage_cfg, code, work, run_id)


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    """A one-line verdict. A failed fp32 parity check raised ExportError in ``run``; an
    int8 build that missed its accuracy gate is attached marked failed (serving refuses
    it) and the stage itself succeeds."""
    s = result.manifest["stats"]
    if not s["exported"]:
        return f"export skipped: {s['reason']}"
    r = s["ratios"]
    return (f"version {s['model_version']}: int8 {s['int8_status']} ({s['int8_reason']}); "
            f"int8 {r['int8_speedup_vs_eager_b1']:.2f}x eager at batch 1, "
            f"{r['int8_throughput_vs_fp32_b32']:.2f}x fp32 throughput at batch 32, "
            f"{r['int8_size_share_of_fp32']:.1%} of the fp32 size; report {result.path}/report.md")
