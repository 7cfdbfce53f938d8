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
a launch that finds it exits at once, so re-running a finished task is free.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from training import checkpoint as ckpt
from training.data import (
    EncodedDataset,
    PadCollate,
    TrainingDataError,
    check_train_split,
    load_curated,
    load_labels,
    load_tokenizer,
    pad_token_id,
    tokenizer_path,
)
from training.models import build_model

log = logging.getLogger("intentops.training")

DONE_MARKER = "done"
EXIT_USAGE = 2
T = TypeVar("T")


class TrainConfig(BaseModel):
    """Training hyper-parameters, read from the ``--config`` JSON file.

    Unknown keys are rejected: a misspelt ``grad_acum_steps`` silently falling back to its
    default would train a different model than the one the config claims."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: Literal["minilm", "small"] = "minilm"
    max_length: int = Field(128, ge=8, le=512)
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1, description="per process")
    grad_accum_steps: int = Field(1, ge=1)
    lr: float = Field(5e-5, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0, description="None disables clipping")
    precision: Literal["fp32", "bf16"] = "fp32"
    checkpoint_every_steps: int = Field(200, ge=1)
    early_stopping_patience: int | None = Field(
        2, ge=1, description="evaluations without improvement before stopping; None disables")
    early_stopping_metric: Literal["macro_f1", "accuracy"] = "macro_f1"
    seed: int = 42
    max_steps: int | None = Field(None, ge=1, description="cap on optimizer steps")
    num_threads: int | None = Field(None, ge=1, description="default: cores // world size")
    dropout: float = Field(0.1, ge=0, lt=1)
    eval_batch_size: int | None = Field(None, ge=1, description="default: 2 * batch_size")


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


# --------------------------------------------------------------------------- distributed


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    initialized: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistContext:
    """Join the process group torchrun describes in the environment, or run alone.

    nccl when CUDA is available (one GPU per local rank), gloo otherwise: gloo is the
    backend that implements all collectives on CPU tensors."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        return DistContext(0, 1, 0, device, False)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend, timeout=dt.timedelta(minutes=30))
    return DistContext(rank, world, local_rank, device, True)


def barrier(ctx: DistContext) -> None:
    if ctx.initialized:
        dist.barrier()


def broadcast(ctx: DistContext, value: T) -> T:
    """Rank 0's ``value`` on every rank (the one place a decision is taken)."""
    if not ctx.initialized:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(ctx: DistContext, value: T) -> list[T]:
    if not ctx.initialized:
        return [value]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, value)
    return out


def mean_across(ctx: DistContext, value: float) -> float:
    if not ctx.initialized:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return float(t.item()) / ctx.world_size


def die_with_launcher() -> None:
    """Make this worker die when the torchrun agent that started it dies.

    torchrun starts each worker in a session of its own, so a SIGKILL of the launcher's
    process group (an Airflow task timeout, a scheduler killing the task) leaves the workers
    running as orphans: they would go on writing checkpoints into the folder the retried
    task is resuming from. On Linux the kernel delivers SIGKILL to this process when its
    parent exits (PR_SET_PDEATHSIG); elsewhere a daemon thread watches for re-parenting."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes
        import ctypes.util
        import signal

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) == 0:
            if os.getppid() != parent:  # the launcher died before the call above took effect
                os._exit(1)
            return
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-launcher", daemon=True).start()


def default_threads(world_size: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // world_size)


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- schedule


class WarmupLinearDecay:
    """LR multiplier: linear from 0 to 1 over ``warmup`` steps, then linear to 0 at ``total``.

    A class rather than a closure so ``LambdaLR.state_dict`` stores its two numbers and a
    resumed scheduler demonstrably uses the same schedule."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup = warmup
        self.total = total

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        span = max(1, self.total - self.warmup)
        return max(0.0, (self.total - step) / span)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weight matrices only: decaying biases and LayerNorm gains only
    pulls them toward zero without regularizing anything."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# --------------------------------------------------------------------------- evaluation


def autocast(ctx: DistContext, precision: str) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def evaluate(model: nn.Module, ds: EncodedDataset, ctx: DistContext, cfg: TrainConfig,
             collate: PadCollate) -> dict[str, Any] | None:
    """Accuracy, macro-F1 and weighted loss on a split, sharded across ranks.

    Rank r scores rows r, r + W, r + 2W, ... (no padding duplicates, unlike
    DistributedSampler), the predictions are all-gathered and put back in row order, and
    every rank computes the same metrics from the same full set."""
    from sklearn.metrics import accuracy_score, f1_score

    if len(ds) == 0:
        return None
    shard = list(range(ctx.rank, len(ds), ctx.world_size))
    loader = DataLoader(ds, batch_size=cfg.eval_batch_size or 2 * cfg.batch_size, sampler=shard,
                        collate_fn=collate, generator=torch.Generator())
    was_training = model.training
    model.eval()
    rows: list[tuple[int, int, int, float, float]] = []
    with torch.no_grad():
        for batch in loader:
            b = batch.to(ctx.device)
            with autocast(ctx, cfg.precision):
                logits = model(b.input_ids, b.attention_mask)
            logits = logits.float()
            ce = F.cross_entropy(logits, b.labels, reduction="none")
            pred = logits.argmax(dim=-1)
            rows.extend(zip(b.index.tolist(), pred.tolist(), b.labels.tolist(),
                            b.weights.tolist(), ce.tolist(), strict=True))
    model.train(was_training)
    merged = sorted(r for part in all_gather(ctx, rows) for r in part)
    y_pred = np.array([r[1] for r in merged])
    y_true = np.array([r[2] for r in merged])
    w = np.array([r[3] for r in merged])
    ce_all = np.array([r[4] for r in merged])
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        "loss": float((ce_all * w).sum() / max(w.sum(), 1e-12)),
        "rows": len(merged),
        "y_true": y_true.tolist(),
        "y_pred": y_pred.tolist(),
    }


def _public(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k not in ("y_true", "y_pred")}


# --------------------------------------------------------------------------- tracking


class TrackingError(RuntimeError):
    """The MLflow tracking server stayed unreachable through every retry."""


class Tracker:
    """MLflow logging into an existing run, rank 0 only, every call retried.

    Per-step metrics are buffered and flushed right before each checkpoint is written, so
    a resumed run neither loses the steps it keeps nor re-logs many it repeats. MLflow's
    own HTTP retries (up to minutes of backoff by default) are turned down so that this
    class's few exponential-backoff attempts decide when the server counts as down."""

    ATTEMPTS = 5
    BASE_DELAY_S = 1.0

    def __init__(self, run_id: str, uri: str) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        import mlflow
        from mlflow import MlflowClient

        self.run_id = run_id
        self.uri = uri
        self._mlflow = mlflow
        self.client = MlflowClient(tracking_uri=uri)
        self._pending: list[Any] = []
        mlflow.set_tracking_uri(uri)
        self.call("open run", self.client.get_run, run_id)
        # The fluent run drives MLflow's system-metrics thread (CPU, memory, disk, network).
        self.call("start run", mlflow.start_run, run_id=run_id, log_system_metrics=True)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        delay = self.BASE_DELAY_S
        for attempt in range(1, self.ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not _transient(exc) or attempt == self.ATTEMPTS:
                    raise TrackingError(
                        f"MLflow tracking server {self.uri}: {what} failed "
                        f"(attempt {attempt}/{self.ATTEMPTS}): {exc}") from exc
                log.warning("MLflow %s failed (%s), retrying in %.0fs", what, exc, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        logged = self.call("read run", self.client.get_run, self.run_id).data.params
        fresh = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in logged]
        for i in range(0, len(fresh), 100):
            self.call("log params", self.client.log_batch, self.run_id, params=fresh[i:i + 100])

    def metric(self, key: str, value: float, step: int) -> None:
        from mlflow.entities import Metric

        self._pending.append(Metric(key, float(value), int(time.time() * 1000), int(step)))

    def flush(self) -> None:
        while self._pending:
            chunk = self._pending[:1000]
            self.call("log metrics", self.client.log_batch, self.run_id, metrics=chunk)
            del self._pending[:1000]

    def artifact(self, path: Path, artifact_path: str = "training") -> None:
        self.call(f"log artifact {path.name}", self.client.log_artifact, self.run_id, str(path),
                  artifact_path)

    def close(self, status: str = "FINISHED") -> None:
        with contextlib.suppress(Exception):
            self.flush()
        with contextlib.suppress(Exception):
            self._mlflow.end_run(status=status)


def _transient(exc: BaseException) -> bool:
    """Whether retrying can help: everything except a server's definite 4xx answer (a
    missing run, a bad parameter), which no amount of waiting changes. With MLflow's own
    retries off, an unreachable server surfaces as a plain MlflowException or a requests
    error, both retried."""
    from mlflow.exceptions import RestException

    if isinstance(exc, RestException):
        code = int(exc.get_http_status_code())
        return code >= 500 or code == 429
    return isinstance(exc, Exception)


# --------------------------------------------------------------------------- run state


@dataclass
class RunState:
    """Counters and early-stopping state that go into every checkpoint."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    epochs_completed: int = 0
    best_metric: float | None = None
    best_epoch: int | None = None
    bad_evals: int = 0
    stopped: bool = False
    stop_reason: str | None = None
    val_history: list[dict[str, Any]] = field(default_factory=list)
    train_seconds: float = 0.0
    train_samples: int = 0
    wall_seconds: float = 0.0
    wall_seconds_before: float = 0.0
    resumed_from_steps: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _trim_history(path: Path, last_step: int) -> None:
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


def plot_confusion(matrix: Sequence[Sequence[int]], labels: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(labels)
    size = max(4.0, min(28.0, 0.3 * n + 3))
    fig, ax = plt.subplots(figsize=(size, size))
    try:
        im = ax.imshow(np.asarray(matrix), cmap="Blues")
        ax.set_xticks(range(n), labels, rotation=90, fontsize=max(4, 10 - n // 10))
        ax.set_yticks(range(n), labels, fontsize=max(4, 10 - n // 10))
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title("test confusion matrix")
        if n <= 20:
            for i in range(n):
                for j in range(n):
                    ax.text(j, i, str(matrix[i][j]), ha="center", va="center", fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.046)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- training


@dataclass
class Trainer:
    """One process's part of a run; ``run`` drives it from (re)start to ``done``."""

    args: argparse.Namespace
    cfg: TrainConfig
    ctx: DistContext
    started: float = field(default_factory=time.monotonic)

    def run(self) -> None:
        args, cfg, ctx = self.args, self.cfg, self.ctx
        out = Path(args.out)
        self.out = out
        self.ckpt_dir = out / "checkpoints"
        threads = cfg.num_threads or default_threads(ctx.world_size)
        torch.set_num_threads(threads)

        self.labels = load_labels(args.labels)
        splits = load_curated(args.curated, self.labels)
        check_train_split(splits["train"], args.curated)
        tok = load_tokenizer(cfg.max_length)
        self.collate = PadCollate(pad_token_id(tok))
        self.ds = {name: EncodedDataset(df, self.labels, tok) for name, df in splits.items()}

        # The run's identity: what a checkpoint must agree with to be resumed. num_threads is
        # left out (it changes speed, not the result); world size and data shape are in,
        # because the sampler's sharding and the schedule depend on them.
        self.identity = {
            "training": cfg.model_dump(exclude={"num_threads"}),
            "world_size": ctx.world_size,
            "labels": self.labels,
            "data": {f"{s}_rows": len(d) for s, d in self.ds.items()},
        }
        self.fingerprint = ckpt.config_fingerprint(self.identity)
        self.resolved = cfg.model_dump() | {"num_threads": threads, "world_size": ctx.world_size,
                                            "config_fingerprint": self.fingerprint}

        seed_everything(cfg.seed)  # identical initial weights on every rank, any world size
        model, self.spec = build_model(cfg.model, len(self.labels), cfg.max_length,
                                       tok.get_vocab_size(), pad_token_id(tok), cfg.dropout)
        self.model = model.to(ctx.device)
        seed_everything(cfg.seed + ctx.rank)  # different dropout masks per rank
        if ctx.world_size > 1:
            kw = {"device_ids": [ctx.local_rank]} if ctx.device.type == "cuda" else {}
            self.ddp: nn.Module = nn.parallel.DistributedDataParallel(self.model, **kw)
        else:
            self.ddp = self.model

        train_ds = self.ds["train"]
        self.sampler = DistributedSampler(train_ds, num_replicas=ctx.world_size, rank=ctx.rank,
                                          shuffle=True, seed=cfg.seed, drop_last=False)
        self.micro_per_epoch = math.ceil(len(self.sampler) / cfg.batch_size)
        self.steps_per_epoch = math.ceil(self.micro_per_epoch / cfg.grad_accum_steps)
        total = cfg.epochs * self.steps_per_epoch
        self.total_steps = min(total, cfg.max_steps) if cfg.max_steps else total
        warmup = round(cfg.warmup_ratio * self.total_steps)
        self.optimizer = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupLinearDecay(warmup, self.total_steps))

        self.state = RunState()
        self._resume()
        self.tracker: Tracker | None = None
        try:
            if ctx.is_main and args.mlflow_run_id:
                self.tracker = self._open_tracker(args.mlflow_run_id)
            self._train()
            self._finish()
        except BaseException:
            if self.tracker is not None:
                self.tracker.close("FAILED")
            raise
        if self.tracker is not None:
            self.tracker.close("FINISHED")

    # ---- resume

    def _resume(self) -> None:
        ctx = self.ctx
        if ctx.is_main:
            n = ckpt.remove_stale_temps(self.ckpt_dir)
            if n:
                log.info("removed %d temp file(s) of an interrupted checkpoint write", n)
        barrier(ctx)
        path = ckpt.latest(self.ckpt_dir)
        if path is None:
            if ctx.is_main:
                log.info("fresh start: %d train rows, world size %d, %d step(s) per epoch, "
                         "%d step(s) in all", len(self.ds["train"]), ctx.world_size,
                         self.steps_per_epoch, self.total_steps)
                (self.out / "history.jsonl").unlink(missing_ok=True)
            return
        data = ckpt.load(path, self.identity)
        self.model.load_state_dict(data["model"])
        self.optimizer.load_state_dict(data["optimizer"])
        self.scheduler.load_state_dict(data["scheduler"])
        ckpt.restore_rng(data["rng"][ctx.rank])
        self.state = RunState(**data["state"])
        self.state.wall_seconds_before = self.state.wall_seconds
        self.state.resumed_from_steps.append(self.state.global_step)
        if ctx.is_main:
            _trim_history(self.out / "history.jsonl", self.state.global_step)
            log.info("resuming from checkpoint %s: step %d of %d, epoch %d, batch %d of %d",
                     path.name, self.state.global_step, self.total_steps, self.state.epoch,
                     self.state.batch_in_epoch, self.micro_per_epoch)

    def _open_tracker(self, run_id: str) -> Tracker:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise TrackingError("--mlflow-run-id needs MLFLOW_TRACKING_URI in the environment")
        tracker = Tracker(run_id, uri)
        params = dict(self.resolved) | {f"data_{k}": v for k, v in self.identity["data"].items()}
        params |= {"num_classes": len(self.labels), "total_steps": self.total_steps}
        tracker.log_params(params)
        return tracker

    def _checkpoint(self) -> None:
        """All ranks hand their RNG state to rank 0, which writes; the others wait."""
        rng = all_gather(self.ctx, ckpt.capture_rng())
        if self.ctx.is_main:
            if self.tracker is not None:
                self.tracker.flush()
            self.state.wall_seconds = self._wall()
            ckpt.save(self.ckpt_dir, {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": rng,
                "state": self.state.to_dict(),
                "global_step": self.state.global_step,
                "config": self.identity,
                "config_fingerprint": self.fingerprint,
            })
        barrier(self.ctx)

    def _wall(self) -> float:
        """Wall time over all attempts: what earlier ones had checkpointed plus this one."""
        return self.state.wall_seconds_before + (time.monotonic() - self.started)

    # ---- training

    def _batches(self, epoch: int, skip: int) -> Iterator[Any]:
        self.sampler.set_epoch(epoch)
        order = list(self.sampler)[skip * self.cfg.batch_size:]
        # A private generator: a DataLoader iterator otherwise draws its base seed from the
        # global torch RNG, which would shift every dropout mask after a resume.
        return iter(DataLoader(self.ds["train"], batch_size=self.cfg.batch_size, sampler=order,
                               collate_fn=self.collate, generator=torch.Generator()))

    def _train(self) -> None:
        cfg, ctx, st = self.cfg, self.ctx, self.state
        history = open(self.out / "history.jsonl", "a") if ctx.is_main else None  # noqa: SIM115
        try:
            while not st.stopped and st.epoch < cfg.epochs:
                self._train_epoch(history)
                self._end_of_epoch()
        finally:
            if history is not None:
                history.close()

    def _train_epoch(self, history: Any) -> None:
        cfg, ctx, st = self.cfg, self.ctx, self.state
        accum = cfg.grad_accum_steps
        self.ddp.train()
        tick = time.monotonic()
        step_loss, step_samples = 0.0, 0
        micro = st.batch_in_epoch
        for batch in self._batches(st.epoch, st.batch_in_epoch):
            if st.global_step >= self.total_steps:
                break
            group_start = (micro // accum) * accum
            group_size = min(accum, self.micro_per_epoch - group_start)
            last_in_group = micro + 1 == group_start + group_size
            b = batch.to(ctx.device)
            sync = (contextlib.nullcontext() if last_in_group or ctx.world_size == 1
                    else self.ddp.no_sync())
            with sync:
                with autocast(ctx, cfg.precision):
                    logits = self.ddp(b.input_ids, b.attention_mask)
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
            if cfg.max_grad_norm:
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            lr = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            st.global_step += 1
            st.batch_in_epoch = micro
            global_loss = mean_across(ctx, step_loss)
            now = time.monotonic()
            seconds = now - tick
            samples = step_samples * ctx.world_size  # equal shard sizes: DistributedSampler pads
            st.train_seconds += seconds
            st.train_samples += samples
            if ctx.is_main:
                rate = samples / max(seconds, 1e-9)
                history.write(json.dumps({"step": st.global_step, "epoch": st.epoch,
                                          "loss": round(global_loss, 6), "lr": lr,
                                          "samples_per_s": round(rate, 2)}) + "\n")
                history.flush()
                if self.tracker is not None:
                    self.tracker.metric("train_loss", global_loss, st.global_step)
                    self.tracker.metric("lr", lr, st.global_step)
                    self.tracker.metric("samples_per_s", rate, st.global_step)
            step_loss, step_samples = 0.0, 0
            at_boundary = micro == self.micro_per_epoch or st.global_step >= self.total_steps
            if st.global_step % cfg.checkpoint_every_steps == 0 and not at_boundary:
                self._checkpoint()  # the end-of-epoch checkpoint follows otherwise
            tick = time.monotonic()

    def _end_of_epoch(self) -> None:
        cfg, ctx, st = self.cfg, self.ctx, self.state
        full_epoch = st.batch_in_epoch >= self.micro_per_epoch
        val = evaluate(self.model, self.ds["val"], ctx, cfg, self.collate)
        improved = False
        if val is None:
            improved = True  # no validation split: the latest model is the one to ship
        else:
            metric = val[cfg.early_stopping_metric]
            record = {"epoch": st.epoch, "step": st.global_step, "full_epoch": full_epoch,
                      **_public(val)}
            st.val_history.append(record)
            if st.best_metric is None or metric > st.best_metric:
                st.best_metric, st.best_epoch, st.bad_evals, improved = metric, st.epoch, 0, True
            else:
                st.bad_evals += 1
            if ctx.is_main:
                log.info("epoch %d (step %d): val accuracy %.4f, macro-F1 %.4f, loss %.4f%s",
                         st.epoch, st.global_step, val["accuracy"], val["macro_f1"], val["loss"],
                         " (best)" if improved else f" ({st.bad_evals} without improvement)")
                if self.tracker is not None:
                    self.tracker.metric("val_accuracy", val["accuracy"], st.global_step)
                    self.tracker.metric("val_macro_f1", val["macro_f1"], st.global_step)
                    self.tracker.metric("val_loss", val["loss"], st.global_step)
        if val is None:
            st.best_epoch = st.epoch
        stop, reason = False, None
        if cfg.early_stopping_patience and st.bad_evals >= cfg.early_stopping_patience:
            stop, reason = True, f"early stopping: {st.bad_evals} evaluations without improvement"
        elif st.global_step >= self.total_steps:
            stop, reason = True, "reached max_steps" if cfg.max_steps else "all epochs done"
        # Every rank computed the same metrics, but the decision to leave the loop must be one.
        stop, reason = broadcast(ctx, (stop, reason))
        if improved and ctx.is_main:
            ckpt.save_best(self.ckpt_dir, self.model.state_dict(),
                           {"epoch": st.epoch, "step": st.global_step, "metric": st.best_metric,
                            "config_fingerprint": self.fingerprint, "config": self.identity})
        if full_epoch:
            st.epochs_completed += 1
        st.epoch += 1
        st.batch_in_epoch = 0
        if not stop and st.epoch >= cfg.epochs:
            stop, reason = True, "all epochs done"
        st.stopped, st.stop_reason = stop, reason
        self._checkpoint()

    # ---- outputs

    def _finish(self) -> None:
        from sklearn.metrics import classification_report, confusion_matrix

        cfg, ctx, st, out = self.cfg, self.ctx, self.state, self.out
        best = ckpt.load_best(self.ckpt_dir, self.identity)
        if best is not None:
            self.model.load_state_dict(best["model"])
        test = evaluate(self.model, self.ds["test"], ctx, cfg, self.collate)
        if not ctx.is_main:
            barrier(ctx)
            return
        n = len(self.labels)
        report: dict[str, Any] | None = None
        matrix: list[list[int]] | None = None
        if test is not None:
            report = classification_report(test["y_true"], test["y_pred"], target_names=[
                self.labels[i] for i in sorted(set(test["y_true"]) | set(test["y_pred"]))],
                output_dict=True, zero_division=0)
            matrix = confusion_matrix(test["y_true"], test["y_pred"], labels=list(range(n))).tolist()
        model_dir = out / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        ckpt.atomic_save(self.model.state_dict(), model_dir / "model.pt")
        _write_json(model_dir / "model_config.json", self.spec | {
            "labels": self.labels, "tokenizer": "tokenizer.json", "precision": cfg.precision,
            "config_fingerprint": self.fingerprint})
        shutil.copyfile(tokenizer_path(), model_dir / "tokenizer.json")
        _write_json(model_dir / "labels.json", self.labels)
        _write_json(out / "config.json", self.resolved)
        metrics = {
            "steps": st.global_step,
            "total_steps_planned": self.total_steps,
            "steps_per_epoch": self.steps_per_epoch,
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
            "labels": self.labels,
            "train_samples_per_s": st.train_samples / st.train_seconds if st.train_seconds else None,
            "train_samples": st.train_samples,
            "train_seconds": st.train_seconds,
            "wall_seconds": time.monotonic() - self.started,
            "wall_seconds_all_attempts": self._wall(),
            "resumed_from_steps": st.resumed_from_steps,
            "world_size": ctx.world_size,
            "precision": cfg.precision,
            "model": cfg.model,
            "num_threads": self.resolved["num_threads"],
            "config_fingerprint": self.fingerprint,
        }
        _write_json(out / "metrics.json", metrics)
        if report is not None:
            _write_json(out / "classification_report.json", report)
        if matrix is not None:
            plot_confusion(matrix, self.labels, out / "confusion_matrix.png")
        if self.tracker is not None:
            tr = self.tracker
            if test is not None:
                tr.metric("test_accuracy", test["accuracy"], st.global_step)
                tr.metric("test_macro_f1", test["macro_f1"], st.global_step)
            tr.flush()
            for name in ("config.json", "metrics.json", "classification_report.json",
                         "confusion_matrix.png"):
                if (out / name).exists():
                    tr.artifact(out / name)
        _write_json(out / DONE_MARKER, {"finished_at": dt.datetime.now(dt.UTC).isoformat(),
                                        "steps": st.global_step,
                                        "config_fingerprint": self.fingerprint})
        log.info("done: %d steps, test accuracy %s, macro-F1 %s, %.1f train samples/s, %.1fs",
                 st.global_step, metrics["test_accuracy"], metrics["test_macro_f1"],
                 metrics["train_samples_per_s"] or 0.0, metrics["wall_seconds"])
        barrier(ctx)


# --------------------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.split("\n")[0])
    p.add_argument("--curated", required=True, help="label-QA curated Parquet folder")
    p.add_argument("--labels", required=True, help="JSON list of class names")
    p.add_argument("--out", required=True, help="output folder (checkpoints, model, metrics)")
    p.add_argument("--config", required=True, help="training config JSON file")
    p.add_argument("--mlflow-run-id", default=None,
                   help="existing MLflow run to log into (URI from MLFLOW_TRACKING_URI)")
    return p.parse_args(argv)


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
    ctx = init_distributed()
    try:
        Trainer(args, cfg, ctx).run()
    except (TrainingDataError, ckpt.CheckpointError, TrackingError) as exc:
        log.error("%s", exc)
        return EXIT_USAGE
    finally:
        if ctx.initialized:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
