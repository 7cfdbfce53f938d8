"""What an asset-triggered run reads, and whether anything new arrived.

An asset-triggered pipeline run (drift detected, new labels: ``core/assets.py``) has no
data interval: it reads the latest export, all of ``input.path``. It is worth a run when
a part of the export was never read by a published clean output (by content fingerprint:
a copy of the same export is not new) or a label source has a version no published
label-QA output read: feedback labels of served predictions (``quality/feedback.py``) or
Label Studio reviews (``quality/review.py``). Otherwise it ends as NO NEW DATA: no stage
runs, and the summary, the report and ``intentops summary`` say so.

Not in ``core.runs`` on purpose: every stage imports ``core.runs`` (config loading),
and its code version is its import closure (``core/codeversion.py``); this module reads
label QA's sources, which must not make a change to them a new version of clean.
"""

from __future__ import annotations

import json
from typing import Any

from core.config import PipelineConfig
from core.runs import (
    NO_NEW_DATA,
    TRIGGER_FILE,
    NoNewData,
    load_run_config,
    resolve_run_config,
    started_by,
)
from core.stage import atomic_write_text, run_dir


def resolve_triggered_run(run_id: str, conf: dict[str, Any] | None,
                          trigger: list[dict[str, Any]]) -> tuple[str, str]:
    """Resolve an asset-triggered run's config (``core.runs.resolve_run_config``), save the
    triggering events with the run (``trigger.json``: the summary's "started by" line) and
    return (config path, note); NoNewData when nothing new arrived (the run's summary then
    says NO NEW DATA)."""
    path, _ = resolve_run_config(run_id, conf)
    cfg = load_run_config(path)
    atomic_write_text(run_dir(cfg.lake, run_id) / TRIGGER_FILE, json.dumps(trigger, indent=2, default=str))
    new = unread_input(cfg) + unread_labels(cfg)
    if not new:
        write_no_new_data(cfg, run_id, trigger)
        raise NoNewData(f"{cfg.input.path}: every part of the export was read by an earlier run and "
                        f"no new feedback or reviewed labels arrived; nothing new to train on "
                        f"({started_by(trigger)})")
    return path, f"started by {started_by(trigger)}; reads the latest export {cfg.input.path}: new {', '.join(new)}"


def unread_input(cfg: PipelineConfig) -> list[str]:
    """The parts of the export (the whole file, or date partitions) that no published clean
    output has read, by content fingerprint: a copy of the same export is not new data."""
    from core import partitions
    from core.stage import MANIFEST, file_fingerprint

    src = cfg.resolve_path(cfg.input.path)
    seen: set[tuple[str, str]] = set()
    for manifest in (cfg.lake / "clean").glob(f"*/{MANIFEST}"):
        raw = (json.loads(manifest.read_text()).get("inputs") or {}).get("raw") or {}
        if "sha256" in raw:
            seen.add(("", raw["sha256"]))
        for name, fp in (raw.get("partitions") or {}).items():
            seen.add((name, fp["sha256"]))
    whole = file_fingerprint(src)["sha256"]
    if ("", whole) in seen:
        return []
    days = partitions.date_partitions(src) if src.is_dir() else {}
    if not days:
        return [src.name]
    return [name for _, name in sorted(days.items())
            if (name, file_fingerprint(src / name)["sha256"]) not in seen]


def unread_labels(cfg: PipelineConfig) -> list[str]:
    """The label sources (feedback of served predictions, Label Studio reviews) whose
    current version no published label-QA output has read: an asset-triggered run with
    new labels but the same export re-runs label QA on them (the data stages are cache
    hits) and trains."""
    from core.stage import MANIFEST
    from quality import feedback, review

    seen: dict[str, set[str]] = {"feedback_labels": set(), "reviewer_annotations": set()}
    for manifest in (cfg.lake / "labelqa").glob(f"*/{MANIFEST}"):
        inputs = json.loads(manifest.read_text()).get("inputs") or {}
        for name, versions in seen.items():
            if (inputs.get(name) or {}).get("version"):
                versions.add(inputs[name]["version"])
    new = []
    if cfg.labelqa.feedback == "train":
        rows = feedback.load(cfg.lake)
        version = feedback.fingerprint(rows)
        if version and version not in seen["feedback_labels"]:
            new.append(f"feedback labels ({len(rows)} in the prediction log)")
    version = review.ReviewStore(cfg.lake).fingerprint()
    if version and version not in seen["reviewer_annotations"]:
        new.append("reviewed labels from Label Studio")
    return new


def write_no_new_data(cfg: PipelineConfig, run_id: str, trigger: list[dict[str, Any]]) -> str:
    """The summary of a run that found no new data: no stage ran, no model; the summary's
    first line says so, and ``LATEST`` points at it (``intentops summary`` shows it)."""
    folder = run_dir(cfg.lake, run_id)
    text = "\n".join([f"intentops run {run_id}", f"{NO_NEW_DATA}: no stage ran and no model was trained",
                      f"started by {started_by(trigger)}",
                      f"reads the latest export {cfg.input.path}: every part of it was read by an earlier run, "
                      "and no new feedback or reviewed labels arrived"])
    atomic_write_text(folder / "summary.json", json.dumps(
        {"run_id": run_id, "status": "no_new_data", "stages": [], "trigger": trigger}, indent=2, default=str))
    atomic_write_text(folder / "summary.txt", text + "\n")
    atomic_write_text(cfg.lake / "runs" / "LATEST", folder.name + "\n")
    return str(folder / "summary.json")
