"""What a training run records besides its checkpoints: the per-step ``history.jsonl`` line
(with the throughput counters and the per-step MLflow metrics), and at the end the
shippable ``model/`` folder, ``config.json``, ``metrics.json``, the test split's
``classification_report.json`` and ``confusion_matrix.png``. JSON files are written
crash-safe (temp file + rename); ``trim_history`` cuts the history back to a checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from core import pushmetrics
from training import checkpoint as ckpt
from training.data import tokenizer_path
from training.metrics import plot_confusion, report_and_confusion

if TYPE_CHECKING:
    from training.state import Run


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def trim_history(path: Path, last_step: int) -> None:
    """Drop history lines of steps after the checkpoint: they are about to be redone."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
            if json.loads(line)["step"] <= last_step:
                keep.append(line)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text("".join(f"{x}\n" for x in keep))
    os.replace(tmp, path)


def log_step(run: Run, history: TextIO | None, loss: float, lr: float, step_samples: int,
             tick: float) -> None:
    """After an optimizer step (``loss``: its mean over all ranks; ``tick``: when it began):
    the throughput counters, and on rank 0 a ``history.jsonl`` line and the step's metrics."""
    st = run.state
    seconds = time.monotonic() - tick
    samples = step_samples * run.ctx.world_size  # equal shard sizes: DistributedSampler pads
    st.train_seconds += seconds
    st.train_samples += samples
    if history is None:  # not rank 0
        return
    rate = samples / max(seconds, 1e-9)
    sent = run.comm.take()
    st.comm_bytes += sent
    history.write(json.dumps({"step": st.global_step, "epoch": st.epoch, "loss": round(loss, 6),
                              "lr": lr, "samples_per_s": round(rate, 2), "step_seconds": round(seconds, 5),
                              "comm_bytes": sent}) + "\n")
    history.flush()
    run.log_metrics(st.global_step, train_loss=loss, lr=lr, samples_per_s=rate,
                    comm_bytes=float(sent))
    # Prometheus (through the Pushgateway, when INTENTOPS_PUSHGATEWAY_URL is set): at most
    # every 10 s, so a push never costs a step anything noticeable.
    pushmetrics.training(os.environ.get("INTENTOPS_RUN_ID") or run.out.name, rate, seconds, loss)


def write_outputs(run: Run, test: Mapping[str, Any] | None) -> dict[str, Any]:
    """Rank 0 at the end of a run: ``model/``, ``config.json``, ``metrics.json`` and, with a
    test split, ``classification_report.json`` and ``confusion_matrix.png``. Returns the
    metrics."""
    out = run.out
    report, matrix = report_and_confusion(test, run.labels)
    _write_model_folder(run, out / "model")
    write_json(out / "config.json", run.resolved)
    metrics = summary(run, test, report, matrix)
    write_json(out / "metrics.json", metrics)
    if report is not None:
        write_json(out / "classification_report.json", report)
    if matrix is not None:
        plot_confusion(matrix, run.labels, out / "confusion_matrix.png")
    return metrics


def _write_model_folder(run: Run, folder: Path) -> None:
    """``model.pt``, ``model_config.json``, ``tokenizer.json`` and ``labels.json``: all
    ``training.models.load_trained`` needs to rebuild the classifier."""
    folder.mkdir(parents=True, exist_ok=True)
    ckpt.atomic_save(run.model.state_dict(), folder / "model.pt")
    write_json(folder / "model_config.json", run.spec | {
        "labels": run.labels, "tokenizer": "tokenizer.json", "precision": run.cfg.precision,
        "config_fingerprint": run.fingerprint})
    shutil.copyfile(tokenizer_path(), folder / "tokenizer.json")
    write_json(folder / "labels.json", run.labels)


def summary(run: Run, test: Mapping[str, Any] | None, report: dict[str, Any] | None,
            matrix: list[list[int]] | None) -> dict[str, Any]:
    """``metrics.json``: how the run went and how the shipped model scores on the test split."""
    cfg, st = run.cfg, run.state
    return {
        "steps": st.global_step,
        "total_steps_planned": run.total_steps,
        "steps_per_epoch": run.steps_per_epoch,
        "epochs_completed": st.epochs_completed,
        "best_epoch": st.best_epoch,
        "best_val_metric": st.best_metric,
        "early_stopping_metric": cfg.early_stopping_metric,
        "stop_reason": st.stop_reason,
        "val_history": st.val_history,
        "test_accuracy": test["accuracy"] if test else None,
        "test_macro_f1": test["macro_f1"] if test else None,
        "test_loss": test["loss"] if test else None,
        "test_rows": test["rows"] if test else 0,
        "classification_report": report,
        "confusion_matrix": matrix,
        "labels": run.labels,
        "train_samples_per_s": st.train_samples / st.train_seconds if st.train_seconds else None,
        "train_samples": st.train_samples,
        "train_seconds": st.train_seconds,
        "wall_seconds": time.monotonic() - run.started,
        "wall_seconds_all_attempts": run.wall(),
        "resumed_from_steps": st.resumed_from_steps,
        "world_size": run.ctx.world_size,
        "precision": cfg.precision,
        "comm_hook": cfg.comm_hook if run.ctx.world_size > 1 else "none",
        "comm_bytes": st.comm_bytes,
        "comm_bytes_per_step": st.comm_bytes / st.global_step if st.global_step else None,
        "model": cfg.model,
        "num_threads": run.resolved["num_threads"],
        "config_fingerprint": run.fingerprint,
    }
