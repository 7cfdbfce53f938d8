"""The review loop with Label Studio: push (a stage after label QA) and pull (the DAG's
polling sensor, or by hand).

Push (``intentops review --run-id RUN``, the DAG's ``review`` task): finds or creates the
dataset's project (``labeling.project``, default ``intentops-<dataset>``; labeling config:
one Choices over the run's label set, updated when the set changes), orders the run's relabel
queue by the value of a review (``quality/review.py``) and sends the next round: up to
``labeling.batch_size`` items that are not tasks there yet and were never reviewed, each
with the model's suggestion as a prediction (pre-labeling) and the score and reason in the
task data. A rerun with the same label-QA output is a cache hit (no new round before the
reviews of the last one came back); a push sends only what is new. Label Studio down: each call is retried, then
the task fails with the reason and the task's own retries follow; nothing is lost (the
queue stays in label QA's output, the next run sends it). Not configured
(``labeling.enabled: auto`` and no Label Studio known): the task is skipped with the reason.

Pull (``intentops review-pull``, the DAG's ``review_pull`` sensor): exports the project's
finished tasks and merges their annotations into the lake's ``reviewer`` source; the next
label-QA run applies them (its key follows the source's version).

Texts in Label Studio are the desensitized ones (label QA's queue); reviewers are stored
as keyed pseudonyms (``core/labeling_auth.py``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from core import labeling_auth, runs, stage, stages
from core.config import PipelineConfig
from quality import prelabel, review
from quality.labelqa import LS_FROM, label_studio_config, label_studio_tasks
from quality.labelstudio import Client, LabelStudioError

log = logging.getLogger(__name__)
STAGE = "review"
MODEL_VERSION = "intentops-labelqa"


def project_title(cfg: PipelineConfig) -> str:
    return cfg.labeling.project or f"intentops-{cfg.dataset}"


def connect(cfg: PipelineConfig) -> tuple[Client, labeling_auth.Connection]:
    """A client of the configured Label Studio; StageSkipped (auto, none configured, or
    off) or StageError (on, none configured) with the reason otherwise."""
    lab = cfg.labeling
    if lab.enabled == "off":
        raise stage.StageSkipped("review: labeling.enabled is off; the relabel queue stays in "
                                 "label QA's output")
    conn = labeling_auth.connection(lab.url)
    if conn is None:
        why = ("no Label Studio configured (labeling.url and INTENTOPS_LABEL_STUDIO_URL are empty "
               f"and {labeling_auth.credentials_file().name} has no label_studio entry: `make up` "
               "starts one)")
        if lab.enabled == "on":
            raise stage.StageError(f"review: labeling.enabled is on but {why}")
        raise stage.StageSkipped(f"review skipped: {why}; the relabel queue stays in label QA's output")
    return Client(conn.url, conn.token, timeout=lab.timeout_s), conn


def read_queue(qa_path: Path) -> pd.DataFrame:
    """Label QA's relabel queue. Empty fields stay "" (no consensus, no suggestion), never
    NaN: NaN is not JSON, and an empty suggestion means a task without a prediction."""
    return pd.read_csv(Path(qa_path) / "relabel_queue.csv", dtype={"record_id": str}, keep_default_na=False)


def _class_counts(qa_path: Path) -> dict[str, int]:
    cur = pd.read_parquet(Path(qa_path) / "curated", columns=["label"])
    return {str(k): int(v) for k, v in cur.label.value_counts().items()}


def push(cfg: PipelineConfig, client: Client, queue: pd.DataFrame, classes: list[str],
         class_counts: dict[str, int], run_id: str) -> tuple[dict[str, Any], pd.DataFrame]:
    """Send the next round; returns the stats and the rows sent (with their task ids)."""
    store = review.ReviewStore(cfg.lake)
    project = client.project(project_title(cfg), label_studio_config(classes),
                             f"intentops relabel queue of dataset {cfg.dataset}: reviewed labels "
                             "go back into training")
    pid = int(project["id"])
    tmap = store.task_map()
    # A task stands for the record the push recorded for it (its data may have been edited
    # there), else for the record id in its data.
    in_ls = {str((tmap.get(str(t["id"])) or {}).get("record_id") or (t.get("data") or {}).get("record_id"))
             for t in client.tasks(pid)}
    reviewed = set(store.annotations().record_id.astype(str))
    ordered = review.order_by_value(queue, class_counts, cfg.labeling.class_balance_weight)
    batch, counts = review.select_round(ordered, in_ls, reviewed, cfg.labeling.batch_size)
    rnd = 1 + max((int(v["round"]) for v in tmap.values() if int(v["project"]) == pid), default=0)
    sent = batch.assign(task_id=pd.Series(dtype="int64"), round=rnd)
    if len(batch):
        tasks = label_studio_tasks(batch)
        for t, r in zip(tasks, batch.itertuples(index=False), strict=True):
            t["data"] |= {"review_value": float(r.review_value), "round": rnd}
        ids = client.import_tasks(pid, tasks)
        sent["task_id"] = ids
        store.add_tasks({str(i): {"record_id": str(r.record_id), "project": pid, "round": rnd,
                                  "suggested_label": r.suggested_label, "run_id": run_id}
                         for i, r in zip(ids, batch.itertuples(index=False), strict=True)})
    stats = {"project_id": pid, "project": project_title(cfg), "url": client.url,
             "queue_items": int(len(queue)), "sent": int(len(batch)),
             "round": rnd if len(batch) else None, **counts}
    return stats, sent


def unlabeled_rows(queue: pd.DataFrame) -> pd.Series:
    """Which queue rows are messages without a label (label QA appends them after the suspects)."""
    return (queue.given_label.astype(str) == "") & queue.reason.astype(str).str.startswith("no label")


def prelabel_with_champion(cfg: PipelineConfig, queue: pd.DataFrame, version: str | None,
                           why: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The queue with the champion's suggestion, confidence-based score and reason on its
    unlabeled rows (``labeling.prelabel: champion`` and a champion with the run's labels);
    unchanged otherwise. Returns what suggested them."""
    mask = unlabeled_rows(queue)
    info: dict[str, Any] = {"unlabeled_items": int(mask.sum()), "model": "label QA's text classifier"}
    if not mask.any():
        return queue, info
    if cfg.labeling.prelabel != "champion" or version is None:
        info["why"] = "labeling.prelabel is labelqa" if cfg.labeling.prelabel != "champion" else why
        return queue, info
    labels, conf = prelabel.champion_prelabel(cfg, version, queue.loc[mask, "text"].astype(str).tolist())
    q = queue.copy()
    q.loc[mask, "suggested_label"] = labels
    q.loc[mask, "score"] = np.round(1.0 - conf, 6)
    q["suggested_by"] = ""
    q.loc[mask, "suggested_by"] = f"{cfg.training.registered_model}-v{version}"
    q.loc[mask, "reason"] = [f"no label: champion v{version} suggests {lab} ({c:.0%} sure)"
                             for lab, c in zip(labels, conf, strict=True)]
    info |= {"model": why, "champion_version": version,
             "changed_suggestions": int((queue.loc[mask, "suggested_label"].astype(str).to_numpy()
                                         != np.asarray(labels, dtype=str)).sum())}
    return q, info


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    client, conn = connect(cfg)
    try:
        qa = stage.upstream(cfg.lake, run_id, "labelqa")
    except stage.StageError as exc:
        raise stage.StageSkipped(f"review skipped: label QA published nothing for this run ({exc})") from None
    classes = runs.run_labels(cfg.lake, run_id)
    inputs = {"labelqa": {"key": qa.manifest["key"]}}
    # Unlabeled messages in the queue are pre-labeled by the champion when there is one: a
    # new champion is a new push (its suggestions reach the items not sent yet).
    version, why = None, ""
    if cfg.labeling.prelabel == "champion" and unlabeled_rows(read_queue(Path(qa.path))).any():
        version, why = prelabel.champion_for(cfg, classes)
        if version:
            inputs["prelabel_champion"] = {"version": version}
    # The same label-QA output, settings and server: a cache hit, no new round. The next
    # round goes out when reviews came back (a pull changes label QA's key) or the queue changed.
    stage_cfg = {"labeling": cfg.labeling.model_dump(), "label_studio": conn.url}

    def work(out: Path) -> dict[str, Any]:
        queue, suggested = prelabel_with_champion(cfg, read_queue(Path(qa.path)), version, why)
        with client:
            if not client.health():
                raise LabelStudioError(f"Label Studio at {conn.url} is not answering (/health); the "
                                       f"queue stays in {qa.path}")
            stats, sent = push(cfg, client, queue, classes, _class_counts(Path(qa.path)), run_id)
        stats["prelabel"] = suggested
        sent.to_csv(out / "sent.csv", index=False)
        (out / "push.json").write_text(json.dumps(stats, indent=2))
        log.info("review: round %s, %d items sent to %s project %s; %d already there, %d already "
                 "reviewed, %d left for later rounds", stats["round"], stats["sent"], conn.url,
                 stats["project_id"], stats["already_in_label_studio"], stats["already_reviewed"],
                 stats["left_for_next_rounds"])
        return stats

    return stage.run_stage(STAGE, cfg.lake, inputs, stage_cfg, stages.code_version(STAGE), work, run_id)


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    s = result.manifest["stats"]
    return (f"review: {s['sent']} items sent to Label Studio project {s['project']!r} "
            f"(round {s['round']}), {s['already_in_label_studio']} already there, "
            f"{s['already_reviewed']} already reviewed, {s['left_for_next_rounds']} for later rounds; "
            f"{s['url']}/projects/{s['project_id']}/")


# --------------------------------------------------------------------------- pull


def annotations_of(export: list[dict[str, Any]], pid: int, tmap: dict[str, dict[str, Any]],
                   key: str) -> tuple[pd.DataFrame, dict[str, int]]:
    """The export's annotations as reviewer rows. A task is mapped to its record by what
    the push recorded (task id -> record id), not by its data, which can be edited in
    Label Studio; a task the pushes did not create is reported and kept out."""
    rows, unknown, edited, cancelled, empty = [], 0, 0, 0, 0
    for t in export:
        known = tmap.get(str(t["id"]))
        if known is None or int(known["project"]) != pid:
            unknown += 1
            continue
        if str((t.get("data") or {}).get("record_id")) != known["record_id"]:
            edited += 1  # the record id in its data was changed there: ours stands
        for a in t.get("annotations") or []:
            if a.get("was_cancelled"):
                cancelled += 1
                continue
            choices = [c for r in a.get("result") or [] if r.get("from_name") == LS_FROM
                       for c in (r.get("value") or {}).get("choices") or []]
            if not choices:
                empty += 1
                continue
            rows.append({"record_id": known["record_id"], "project": pid, "task_id": int(t["id"]),
                         "annotation_id": int(a["id"]),
                         "reviewer": labeling_auth.pseudonym(a.get("completed_by"), key),
                         "label": str(choices[0]), "suggested_label": known.get("suggested_label"),
                         "round": int(known["round"]), "created_at": str(a.get("created_at")),
                         "updated_at": str(a.get("updated_at"))})
    df = pd.DataFrame(rows, columns=review.COLUMNS)
    return df, {"tasks_not_pushed_by_us": unknown, "tasks_with_edited_record_id": edited,
                "cancelled_annotations": cancelled, "annotations_without_choice": empty}


def pull(cfg: PipelineConfig) -> dict[str, Any]:
    """Merge the project's finished annotations into the lake; the stats (``new_annotations``
    and ``edited_annotations`` say whether the next label QA has something new)."""
    client, conn = connect(cfg)
    store = review.ReviewStore(cfg.lake)
    with client:
        found = client.find_project(project_title(cfg))
        if found is None:
            return {"project": project_title(cfg), "new_annotations": 0, "edited_annotations": 0,
                    "note": "no such project yet: nothing pushed"}
        pid = int(found["id"])
        export = client.export(pid)
    rows, info = annotations_of(export, pid, store.task_map(), conn.reviewer_key)
    stats = store.merge(rows) if len(rows) else {"new_annotations": 0, "edited_annotations": 0,
                                                  "stored": len(store.annotations())}
    return {"project": project_title(cfg), "project_id": pid, "finished_tasks": len(export),
            "annotations": int(len(rows)), **info, **stats, "version": store.fingerprint()}


def waited_enough(cfg: PipelineConfig, run_id: str, now: float | None = None) -> bool:
    """True when ``labeling.pull_wait_minutes`` have passed since this run's push started
    (the sensor then stops waiting); True too when the run pushed nothing."""
    try:
        pushed = stage.upstream(cfg.lake, run_id, STAGE).manifest["timings"]["started"]
    except stage.StageError:
        return True
    now = time.time() if now is None else now
    return now - pushed >= cfg.labeling.pull_wait_minutes * 60
