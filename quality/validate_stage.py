"""The validation gate as a pipeline stage: Great Expectations on the desensitized data.

The stage publishes its result and the GX Data Docs like any other stage output, *then*
fails when an expectation failed, so the report stays in the lake for people to read and
a rerun on the same inputs is a cache hit that fails the same way (no work redone).

Accounting: ``rows_in`` of clean = clean's quarantined and unlabeled + dedup's merged + desensitize's
kept, checked as an expectation too. Thresholds come from ``validation`` in the config
(the DAG's params override them).

    intentops validate --run-id RUN

The pure checks live in ``quality.validation``; this module is the stage around them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core import runs, stage, stages
from core.config import PipelineConfig
from pii import detector as pii
from quality import validation

STAGE = "validate"


def accounting(cfg: PipelineConfig, run_id: str) -> dict[str, int]:
    c, d, s = (
        stage.upstream(cfg.lake, run_id, n).manifest["stats"]
        for n in ("clean", "dedup", "desensitize")
    )
    return {
        "rows_in": c["rows_in"],
        "kept": s["kept"],
        "quarantined": c["quarantined"],
        "merged": d["merged_exact"] + d["merged_near"],
        # rows without a label (clean.unlabeled: review): masked, on to label QA's queue
        "unlabeled": c.get("unlabeled") or 0,
    }


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:

    src = stage.upstream(cfg.lake, run_id, "desensitize")
    counts = accounting(cfg, run_id)
    labels = runs.run_labels(cfg.lake, run_id)
    inputs = {"desensitize": {"key": src.manifest["key"]}, "accounting": counts}
    v = cfg.validation
    thresholds = validation.GateThresholds(
        min_chars=cfg.clean.min_chars,
        max_chars=cfg.clean.max_chars,
        max_duplicate_rate=v.max_duplicate_rate,
        max_residual_pii_rate=v.max_residual_pii_rate,
        min_rows=v.min_rows,
    )
    stage_cfg = {
        "validation": v.model_dump(),
        "labels": labels,
        "residual_patterns": pii.RESIDUAL_PATTERNS,
        "length": [cfg.clean.min_chars, cfg.clean.max_chars],
    }

    def work(out: Path) -> dict[str, Any]:
        summary = validation.validate(
            Path(src.path) / "kept",
            out,
            labels=labels,
            accounting=counts,
            residual_patterns=pii.RESIDUAL_PATTERNS,
            thresholds=thresholds,
        )
        failed = [e for e in summary.get("expectations", []) if not e.get("success")]
        return {
            "rows_in": counts["kept"],
            "kept": counts["kept"],
            "success": bool(summary["success"]),
            "expectations": len(summary.get("expectations", [])),
            "failed_expectations": len(failed),
            "data_docs": "data_docs/index.html",
        }

    return stage.run_stage(STAGE, cfg.lake, inputs, stage_cfg, stages.code_version(STAGE), work, run_id)


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    """Raise ``validation.GateFailed`` (naming each failed expectation and by how much) when
    the published gate result is a failure; otherwise say where the Data Docs are."""
    summary = json.loads((Path(result.path) / validation.RESULT_FILE).read_text())
    validation.check(summary)
    return f"validation gate passed; result and Data Docs in {result.path}"
