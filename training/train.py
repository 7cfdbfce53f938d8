"""Distributed, resumable training of the intent classifier.

Run under torchrun (one process per core group or GPU)::

    torchrun --nproc-per-node 2 -m training.train --curated DIR --labels FILE \\
        --out DIR --config JSON_FILE [--mlflow-run-id ID]

or as one plain process (world size 1). Every process trains a DDP replica on its shard of
the train split (``DistributedSampler``; gloo on CPU, nccl on GPUs); rank 0 alone logs,
writes checkpoints and outputs while the others wait at a barrier.

Restart safety: a run killed at any point (SIGKILL, a node loss, an Airflow retry or
``torchrun --max-restarts``) and started again with the same command resumes from the
newest checkpoint in ``OUT/checkpoints``: same epoch, the already-consumed batches of that
epoch skipped (the sampler order is a function of seed and epoch alone), RNG, optimizer
and scheduler restored. It therefore ends with the same step count and, up to float
non-associativity, the same model as an uninterrupted run. ``OUT/done`` is written last;
a launch that finds it exits at once, so re-running a finished task is free. It may
resume at another world size: the epoch's consumed sample count is checkpointed and the
rest of the epoch dealt to the new ranks (``training/state.py``). A SIGTERM is a
preemption: checkpoint at the next optimizer step, then exit 75 (``EXIT_PREEMPTED``).

This file reads top to bottom: arguments, set-up, the loop, the finish, the entry point.
The supporting pieces live in the sibling modules (``distributed``, ``optim``,
``metrics``, ``mlflow_log``, ``state``, ``outputs``, ``config``); the names this module
used to define stay importable from here (imported ``as`` themselves: re-exports).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler

from training import checkpoint as ckpt
from training import comm
from training.config import TrainConfig as TrainConfig
from training.config import load_config as load_config
from training.data import (
    EncodedDataset,
    PadCollate,
    TrainingDataError,
    check_train_split,
    load_curated,
    load_labels,
    load_tokenizer,
    pad_token_id,
)
from training.distributed import (
    DistContext,
    barrier,
    broadcast,
    default_threads,
    die_with_launcher,
    init_distributed,
    mean_and_any,
    seed_everything,
)
from training.distributed import all_gather as all_gather
from training.metrics import _public, evaluate
from training.metrics import plot_confusion as plot_confusion
from training.mlflow_log import Tracker as Tracker
from training.mlflow_log import TrackingError, log_outputs, open_tracker
from training.mlflow_log import _transient as _transient
from training.models import build_model
from training.optim import WarmupLinearDecay, adamw, autocast, param_groups, resolve_precision
from training.outputs import log_step, write_json, write_outputs
from training.outputs import trim_history as _trim_history  # noqa: F401
from training.outputs import write_json as _write_json  # noqa: F401
from training.state import Run, TraceIds, resized_accum, resume, save_checkpoint
from training.state import RunState as RunState

log = logging.getLogger("intentops.training")

DONE_MARKER = "done"
# Preemption (a SIGTERM: the project's controller, a spot-instance notice, Airflow): every
# rank finishes the optimizer step it is in, rank 0 writes a checkpoint and PREEMPTED_MARKER,
# and the process exits with EXIT_PREEMPTED (EX_TEMPFAIL). The next launch resumes.
PREEMPTED_MARKER = "preempted"
EXIT_PREEMPTED = 75
_PREEMPT = threading.Event()


class Preempted(Exception):  # noqa: N818 - a status, not an error
    """A SIGTERM was honoured: the state is checkpointed, the run is to be resumed."""


# Settings that change speed, not the result: left out of a checkpoint's identity.
SPEED_ONLY = {"num_threads", "num_workers", "prefetch_factor", "persistent_workers"}
EXIT_USAGE = 2


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.split("\n")[0])
    p.add_argument("--curated", required=True, help="label-QA curated Parquet folder")
    p.add_argument("--labels", required=True, help="JSON list of class names")
    p.add_argument("--out", required=True, help="output folder (checkpoints, model, metrics)")
    p.add_argument("--config", required=True, help="training config JSON file")
    p.add_argument("--mlflow-run-id", default=None,
                   help="existing MLflow run to log into (URI from MLFLOW_TRACKING_URI)")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- set-up


def setup(args: argparse.Namespace, cfg: TrainConfig, ctx: DistContext, started: float) -> Run:
    """Data, model (one DDP replica per rank), train sampler, optimizer and LR schedule."""
    requested = cfg.precision
    # From here on the run (its identity, autocast, metrics, model_config) sees the precision
    # it computes in; config.json and the MLflow params keep what was asked for beside it.
    cfg = cfg.model_copy(update={"precision": resolve_precision(requested, ctx.device)})
    threads = cfg.num_threads or default_threads(ctx.world_size)
    torch.set_num_threads(threads)
    labels = load_labels(args.labels)
    splits = load_curated(args.curated, labels)
    check_train_split(splits["train"], args.curated)
    tok = load_tokenizer(cfg.max_length)
    collate = PadCollate(pad_token_id(tok))
    ds = {name: EncodedDataset(df, labels, tok) for name, df in splits.items()}
    # The run's identity: what a checkpoint must agree with to be resumed. num_threads and
    # the DataLoader workers are left out (they change speed, not the result); the data
    # shape and the world size the run *started* at are in: a resume at another world size
    # keeps that start's global batch (batch_size x grad_accum_steps x world size, the
    # accumulation rescaled) and its LR schedule.
    origin_world = ckpt.origin_world_size(Path(args.out) / "checkpoints") or ctx.world_size
    accum = resized_accum(cfg, origin_world, ctx.world_size)
    identity = {"training": cfg.model_dump(exclude=SPEED_ONLY), "world_size": origin_world,
                "labels": labels, "data": {f"{s}_rows": len(d) for s, d in ds.items()}}
    fingerprint = ckpt.config_fingerprint(identity)
    resolved = cfg.model_dump() | {"num_threads": threads, "world_size": ctx.world_size,
                                   "precision_requested": requested,
                                   "config_fingerprint": fingerprint}

    seed_everything(cfg.seed)  # identical initial weights on every rank, any world size
    model, spec = build_model(cfg.model, len(labels), cfg.max_length, tok.get_vocab_size(),
                              pad_token_id(tok), cfg.dropout)
    model = model.to(ctx.device)
    seed_everything(cfg.seed + ctx.rank)  # different dropout masks per rank
    ddp = model
    if ctx.world_size > 1:
        kw: dict = {"device_ids": [ctx.local_rank]} if ctx.device.type == "cuda" else {}
        kw |= comm.ddp_options(model, cfg.comm_hook, ctx.device.type)
        ddp = nn.parallel.DistributedDataParallel(model, **kw)
    comm_stats = comm.register(ddp, cfg.comm_hook, cfg.powersgd_rank, cfg.powersgd_start_iter,
                               ctx.world_size)

    sampler = DistributedSampler(ds["train"], num_replicas=ctx.world_size, rank=ctx.rank,
                                 shuffle=True, seed=cfg.seed, drop_last=False)
    micro_per_epoch = math.ceil(len(sampler) / cfg.batch_size)
    # the schedule of the run's start (the same as this world's unless it was resized)
    micro_at_origin = math.ceil(math.ceil(len(ds["train"]) / origin_world) / cfg.batch_size)
    steps_per_epoch = math.ceil(micro_at_origin / cfg.grad_accum_steps)
    total = cfg.epochs * steps_per_epoch
    total_steps = min(total, cfg.max_steps) if cfg.max_steps else total
    warmup = round(cfg.warmup_ratio * total_steps)
    optimizer = adamw(param_groups(model, cfg.weight_decay), cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer,
                                                  WarmupLinearDecay(warmup, total_steps))
    return Run(cfg=cfg, ctx=ctx, out=Path(args.out), started=started, labels=labels, ds=ds,
               collate=collate, model=model, ddp=ddp, spec=spec, sampler=sampler,
               optimizer=optimizer, scheduler=scheduler, micro_per_epoch=micro_per_epoch,
               steps_per_epoch=steps_per_epoch, total_steps=total_steps, identity=identity,
               fingerprint=fingerprint, resolved=resolved, comm=comm_stats, accum=accum)


# --------------------------------------------------------------------------- the loop


def train(run: Run) -> None:
    """Epochs until the last one, the step budget or early stopping ends the run."""
    cfg, st = run.cfg, run.state
    history = open(run.out / "history.jsonl", "a") if run.ctx.is_main else None  # noqa: SIM115
    try:
        while not st.stopped and st.epoch < cfg.epochs:
            train_epoch(run, history)
            end_of_epoch(run)
            if not st.stopped and mean_and_any(run.ctx, 0.0, _PREEMPT.is_set())[1]:
                raise Preempted(st.global_step)  # end_of_epoch has just checkpointed
    finally:
        if history is not None:
            history.close()


def train_epoch(run: Run, history: TextIO | None) -> None:
    """The rest of the current epoch. An optimizer step is ``run.accum`` micro-batches
    (``grad_accum_steps``, rescaled after a resize; fewer for an epoch's last group); DDP
    all-reduces gradients on a group's last one only. A SIGTERM on any rank (preemption)
    ends the epoch after the current optimizer step, on every rank, with a checkpoint."""
    cfg, ctx, st = run.cfg, run.ctx, run.state
    accum = run.accum
    run.ddp.train()
    tick = time.monotonic()
    step_loss, step_samples = 0.0, 0
    batches = run.batches(st.epoch)  # also sets run.epoch_micro (micro-batches this epoch)
    micro = st.batch_in_epoch
    trace = TraceIds(run)
    for batch in batches:
        if st.global_step >= run.total_steps:
            break
        group_start = (micro // accum) * accum
        group_size = min(accum, run.epoch_micro - group_start)
        trace.add(micro)
        last_in_group = micro + 1 == group_start + group_size
        # forward and backward
        b = batch.to(ctx.device)
        sync = (contextlib.nullcontext() if last_in_group or ctx.world_size == 1
                else run.ddp.no_sync())
        with sync:
            with autocast(ctx, cfg.precision):
                logits = run.ddp(b.input_ids, b.attention_mask)
            ce = F.cross_entropy(logits.float(), b.labels, reduction="none")
            # Sample-weighted sum over a fixed denominator: a batch of down-weighted
            # suspects then really counts less, instead of being renormalized back up.
            loss = (ce * b.weights).sum() / len(b)
            (loss / group_size).backward()
        step_loss += float(loss.detach()) / group_size
        step_samples += len(b)
        micro += 1
        if not last_in_group:
            continue
        # optimizer step and LR schedule
        if cfg.max_grad_norm:
            nn.utils.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm)
        lr = run.scheduler.get_last_lr()[0]
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
        st.global_step += 1
        st.batch_in_epoch = micro
        st.epoch_samples = min(st.segment_start + micro * cfg.batch_size * ctx.world_size,
                               run.epoch_len())
        run.comm.after_sync()
        trace.step(st.global_step, st.epoch)
        loss_mean, preempt = mean_and_any(ctx, step_loss, _PREEMPT.is_set())
        log_step(run, history, loss_mean, lr, step_samples, tick)
        step_loss, step_samples = 0.0, 0
        if preempt:  # all ranks agree on it, at the same step
            if st.batch_in_epoch >= run.epoch_micro:
                return  # the epoch is complete: end_of_epoch checkpoints, train() leaves
            save_checkpoint(run)
            raise Preempted(st.global_step)
        # periodic checkpoint (at the epoch's or the budget's end, end_of_epoch writes one)
        at_boundary = micro == run.epoch_micro or st.global_step >= run.total_steps
        if st.global_step % cfg.checkpoint_every_steps == 0 and not at_boundary:
            save_checkpoint(run)
        tick = time.monotonic()


def end_of_epoch(run: Run) -> None:
    """Validate, keep the best model, decide (one decision for all ranks) whether to stop,
    and checkpoint."""
    cfg, ctx, st = run.cfg, run.ctx, run.state
    full_epoch = st.batch_in_epoch >= run.epoch_micro
    improved = _validate(run, full_epoch)
    stop, reason = False, None
    if cfg.early_stopping_patience and st.bad_evals >= cfg.early_stopping_patience:
        stop, reason = True, f"early stopping: {st.bad_evals} evaluations without improvement"
    elif st.global_step >= run.total_steps:
        stop, reason = True, "reached max_steps" if cfg.max_steps else "all epochs done"
    # Every rank computed the same metrics, but the decision to leave the loop must be one.
    stop, reason = broadcast(ctx, (stop, reason))
    if improved and ctx.is_main:
        ckpt.save_best(run.ckpt_dir, run.model.state_dict(),
                       {"epoch": st.epoch, "step": st.global_step, "metric": st.best_metric,
                        "config_fingerprint": run.fingerprint, "config": run.identity})
    if full_epoch:
        st.epochs_completed += 1
    st.epoch += 1
    st.batch_in_epoch = 0
    st.epoch_samples, st.segment_start, st.epoch_world = 0, 0, ctx.world_size
    if not stop and st.epoch >= cfg.epochs:
        stop, reason = True, "all epochs done"
    st.stopped, st.stop_reason = stop, reason
    save_checkpoint(run)


def _validate(run: Run, full_epoch: bool) -> bool:
    """Score the val split and update the early-stopping state; whether the model improved
    (always, without a val split: the latest model is then the one to ship)."""
    cfg, ctx, st = run.cfg, run.ctx, run.state
    val = evaluate(run.model, run.ds["val"], ctx, cfg, run.collate)
    if val is None:
        st.best_epoch = st.epoch
        return True
    metric = val[cfg.early_stopping_metric]
    st.val_history.append({"epoch": st.epoch, "step": st.global_step, "full_epoch": full_epoch,
                           **_public(val)})
    if ctx.is_main:  # one line per evaluation, as it happens (a search prunes on it)
        with open(run.out / "val_history.jsonl", "a") as fh:
            fh.write(json.dumps(st.val_history[-1]) + "\n")
    improved = st.best_metric is None or metric > st.best_metric
    if improved:
        st.best_metric, st.best_epoch, st.bad_evals = metric, st.epoch, 0
    else:
        st.bad_evals += 1
    if ctx.is_main:
        log.info("epoch %d (step %d): val accuracy %.4f, macro-F1 %.4f, loss %.4f%s",
                 st.epoch, st.global_step, val["accuracy"], val["macro_f1"], val["loss"],
                 " (best)" if improved else f" ({st.bad_evals} without improvement)")
        run.log_metrics(st.global_step, val_accuracy=val["accuracy"],
                        val_macro_f1=val["macro_f1"], val_loss=val["loss"])
    return improved


# --------------------------------------------------------------------------- finish


def finish(run: Run) -> None:
    """Score the best model on the test split; rank 0 writes the outputs, ``done`` last."""
    ctx, st = run.ctx, run.state
    best = ckpt.load_best(run.ckpt_dir, run.identity)
    if best is not None:
        run.model.load_state_dict(best["model"])
    test = evaluate(run.model, run.ds["test"], ctx, run.cfg, run.collate)
    if ctx.is_main:
        metrics = write_outputs(run, test)
        if run.tracker is not None:
            log_outputs(run.tracker, test, st.global_step, run.out)
        write_json(run.out / DONE_MARKER, {"finished_at": dt.datetime.now(dt.UTC).isoformat(),
                                           "steps": st.global_step,
                                           "config_fingerprint": run.fingerprint})
        log.info("done: %d steps, test accuracy %s, macro-F1 %s, %.1f train samples/s, %.1fs",
                 st.global_step, metrics["test_accuracy"], metrics["test_macro_f1"],
                 metrics["train_samples_per_s"] or 0.0, metrics["wall_seconds"])
    barrier(ctx)


# --------------------------------------------------------------------------- entry point


def run_training(args: argparse.Namespace, cfg: TrainConfig, ctx: DistContext) -> None:
    """One process's part of a run, from (re)start to ``done``."""
    run = setup(args, cfg, ctx, started=time.monotonic())
    resume(run)
    try:
        if ctx.is_main and args.mlflow_run_id:
            params = run.resolved | {f"data_{k}": v for k, v in run.identity["data"].items()}
            params |= {"num_classes": len(run.labels), "total_steps": run.total_steps}
            run.tracker = open_tracker(args.mlflow_run_id, params)
        train(run)
        finish(run)
    except Preempted:
        if ctx.is_main:
            write_json(run.out / PREEMPTED_MARKER, {
                "at": dt.datetime.now(dt.UTC).isoformat(), "step": run.state.global_step,
                "signal_to_exit_seconds": round(time.monotonic() - _signalled_at[0], 3)
                if _signalled_at else None})
            log.warning("preempted: checkpoint at step %d written, exiting with %d to be "
                        "resumed", run.state.global_step, EXIT_PREEMPTED)
        if run.tracker is not None:
            run.tracker.flush()  # the MLflow run stays open: the resumed attempt continues it
        raise
    except BaseException:
        if run.tracker is not None:
            run.tracker.close("FAILED")
        raise
    if run.tracker is not None:
        run.tracker.close("FINISHED")


_signalled_at: list[float] = []  # when the first SIGTERM arrived (monotonic)


def _on_sigterm(signum: int, frame: object) -> None:
    if not _PREEMPT.is_set():
        _signalled_at.append(time.monotonic())
        _PREEMPT.set()


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr, force=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    _setup_logging(rank)
    out = Path(args.out)
    if (out / DONE_MARKER).exists():
        if rank == 0:
            log.info("%s exists: this run already finished, nothing to do", out / DONE_MARKER)
        return 0
    try:
        cfg = load_config(args.config)
        out.mkdir(parents=True, exist_ok=True)
    except (TrainingDataError, OSError) as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    if "TORCHELASTIC_RUN_ID" in os.environ:
        die_with_launcher()
    if rank == 0:
        (out / PREEMPTED_MARKER).unlink(missing_ok=True)  # this attempt's outcome is open again
    signal.signal(signal.SIGTERM, _on_sigterm)
    ctx = init_distributed()
    try:
        run_training(args, cfg, ctx)
    except Preempted:
        return EXIT_PREEMPTED
    except (TrainingDataError, ckpt.CheckpointError, TrackingError) as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    finally:
        if ctx.initialized:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
