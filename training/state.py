"""A training run's state and its checkpoints: ``Run`` (what set-up builds for one process
and the loop works with), ``RunState`` (the counters and early-stopping state every
checkpoint carries), ``save_checkpoint`` and ``resume``.

A checkpoint holds model, optimizer and scheduler state, every rank's RNG state, the
``RunState`` and the run's identity (``checkpoint.load`` refuses one whose identity differs
from the current run's). Rank 0 writes; all ranks resume from the same file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from training import checkpoint as ckpt
from training import comm
from training.comm import CommStats
from training.config import TrainConfig
from training.data import EncodedDataset, PadCollate, group_by_length
from training.distributed import DistContext, all_gather, barrier
from training.mlflow_log import Tracker
from training.outputs import trim_history

log = logging.getLogger("intentops.training")


class OrderSampler(Sampler[int]):
    """The indices the next epoch (or its remainder) visits, set before each epoch."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.indices))

    def __len__(self) -> int:
        return len(self.indices)


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
    comm_bytes: int = 0  # payload this rank handed to gradient all-reduces, all attempts
    # Where the epoch stands in world-size-free terms, so a resume at another world size
    # knows which samples are left: the epoch's samples are one permutation (padded to a
    # multiple of the world size it began at, `epoch_world`), rank r of W takes every W-th
    # from its segment's start; `epoch_samples` of them are consumed, and the current
    # world size took over at `segment_start` (0: it ran the epoch from the beginning).
    epoch_world: int = 0
    epoch_samples: int = 0
    segment_start: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Run:
    """What set-up builds for one process, which the loop and the finish work with."""

    cfg: TrainConfig
    ctx: DistContext
    out: Path
    started: float  # time.monotonic() when this attempt began
    labels: list[str]
    ds: dict[str, EncodedDataset]
    collate: PadCollate
    model: nn.Module  # the bare model: state dicts, evaluation
    ddp: nn.Module  # what the training forward pass goes through (DDP at world size > 1)
    spec: dict[str, Any]
    sampler: DistributedSampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    micro_per_epoch: int  # micro-batches per epoch on each rank
    steps_per_epoch: int  # optimizer steps per epoch
    total_steps: int
    identity: dict[str, Any]  # what a checkpoint must agree with to be resumed
    fingerprint: str
    resolved: dict[str, Any]  # the config as run: config.json, the MLflow params
    state: RunState = field(default_factory=RunState)
    tracker: Tracker | None = None  # rank 0 with --mlflow-run-id only
    comm: CommStats = field(default_factory=lambda: CommStats("none", 0))
    order: OrderSampler = field(default_factory=lambda: OrderSampler())
    _loader: DataLoader | None = None
    accum: int = 1  # micro-batches per optimizer step at this world size
    epoch_micro: int = 0  # micro-batches of the current epoch (or its segment) on this rank

    @property
    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.ds["train"].ids]

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"

    def wall(self) -> float:
        """Wall time over all attempts: what earlier ones had checkpointed plus this one."""
        return self.state.wall_seconds_before + (time.monotonic() - self.started)

    def epoch_len(self) -> int:
        """The current epoch's samples: the train rows padded to a multiple of its world size."""
        world = self.state.epoch_world or self.ctx.world_size
        return math.ceil(len(self.ds["train"]) / world) * world

    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's order of ``epoch`` (or of its segment, after a resize), from the start."""
        st, cfg, world = self.state, self.cfg, self.ctx.world_size
        if st.segment_start == 0 and st.epoch_world in (0, world):
            self.sampler.set_epoch(epoch)
            return group_by_length(list(self.sampler), self.lengths, cfg.batch_size,
                                   cfg.length_grouping, cfg.seed * 100003 + epoch)
        # The permutation and padding DistributedSampler uses at the epoch's world size;
        # what is left after the consumed samples, padded again and dealt round-robin.
        g = torch.Generator()
        g.manual_seed(cfg.seed + epoch)
        perm = torch.randperm(len(self.ds["train"]), generator=g).tolist()
        perm += perm[:self.epoch_len() - len(perm)]
        rest = perm[st.segment_start:]
        pad = (-len(rest)) % world
        rest += (rest * (pad // max(len(rest), 1) + 1))[:pad]
        return rest[self.ctx.rank::world]

    def batches(self, epoch: int) -> Iterator[Any]:
        """This rank's train batches of ``epoch``, the ``batch_in_epoch`` consumed ones left
        out (a resume); sets ``epoch_micro``."""
        order = self.epoch_order(epoch)
        self.epoch_micro = math.ceil(len(order) / self.cfg.batch_size)
        self.order.indices = order[self.state.batch_in_epoch * self.cfg.batch_size:]
        return iter(self.loader)

    @property
    def loader(self) -> DataLoader:
        """One DataLoader for the run over ``self.order`` (so persistent workers survive the
        epochs). Workers only index and collate, which draws no random number: batches and
        results are the same with any ``num_workers``. A private generator: an iterator
        otherwise draws its base seed from the global torch RNG, which would shift every
        dropout mask after a resume."""
        if self._loader is None:
            cfg = self.cfg
            extra: dict[str, Any] = {}
            if cfg.num_workers:
                extra = {"num_workers": cfg.num_workers, "prefetch_factor": cfg.prefetch_factor,
                         "persistent_workers": cfg.persistent_workers,
                         "pin_memory": self.ctx.device.type == "cuda"}
            self._loader = DataLoader(self.ds["train"], batch_size=cfg.batch_size,
                                      sampler=self.order, collate_fn=self.collate,
                                      generator=torch.Generator(), **extra)
        return self._loader

    def log_metrics(self, step: int, **values: float) -> None:
        """Buffer MLflow metrics (flushed at the next checkpoint); a no-op without a tracker."""
        if self.tracker is not None:
            for key, value in values.items():
                self.tracker.metric(key, value, step)


def resized_accum(cfg: TrainConfig, origin_world: int, world: int) -> int:
    """Micro-batches per optimizer step at ``world``, keeping the global batch of the run's
    start (``grad_accum_steps`` x ``origin_world`` micro-batches)."""
    total = cfg.grad_accum_steps * origin_world
    if total % world:
        raise ckpt.CheckpointError(
            f"cannot resume at world size {world}: the run started at world size {origin_world} "
            f"with grad_accum_steps {cfg.grad_accum_steps}, a global batch of {total} "
            f"micro-batch(es) that {world} processes cannot split evenly; resume at a world "
            f"size dividing {total}")
    return total // world


class TraceIds:
    """Debug aid: with ``INTENTOPS_TRAIN_TRACE_IDS`` set to a folder, every rank appends one
    JSON line per optimizer step (step, epoch, the train-row indices the step consumed) to
    ``rank<R>-<pid>.jsonl`` there. Off (and free) otherwise."""

    def __init__(self, run: Run) -> None:
        folder = os.environ.get("INTENTOPS_TRAIN_TRACE_IDS")
        self.run, self.ids, self.first = run, [], run.state.batch_in_epoch
        self.path = (Path(folder) / f"rank{run.ctx.rank}-{os.getpid()}.jsonl") if folder else None

    def add(self, micro: int) -> None:
        if self.path is not None:
            b = self.run.cfg.batch_size
            k = micro - self.first
            self.ids += self.run.order.indices[k * b:(k + 1) * b]

    def step(self, step: int, epoch: int) -> None:
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"step": step, "epoch": epoch, "ids": self.ids}) + "\n")
            self.ids = []


def save_checkpoint(run: Run) -> None:
    """All ranks hand their RNG state (and PowerSGD's memory) to rank 0, which writes; the
    others wait."""
    rng = all_gather(run.ctx, ckpt.capture_rng())
    hook = comm.hook_state(run.comm)
    hooks = all_gather(run.ctx, hook) if hook is not None else None
    if run.ctx.is_main:
        if run.tracker is not None:
            run.tracker.flush()
        run.state.wall_seconds = run.wall()
        ckpt.save(run.ckpt_dir, {
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "scheduler": run.scheduler.state_dict(),
            "rng": rng,
            "state": run.state.to_dict(),
            "global_step": run.state.global_step,
            "config": run.identity,
            "config_fingerprint": run.fingerprint,
            **({"comm_hook_state": hooks} if hooks is not None else {}),
        })
    barrier(run.ctx)


def resume(run: Run) -> None:
    """Continue from the newest complete checkpoint in ``OUT/checkpoints``, if there is one:
    model, optimizer, scheduler, this rank's RNG and the ``RunState``; ``history.jsonl``
    loses the lines of the steps about to be redone. Without one, a fresh start."""
    ctx = run.ctx
    if ctx.is_main:
        n = ckpt.remove_stale_temps(run.ckpt_dir)
        if n:
            log.info("removed %d temp file(s) of an interrupted checkpoint write", n)
    barrier(ctx)
    path = ckpt.latest(run.ckpt_dir)
    if path is None:
        if ctx.is_main:
            log.info("fresh start: %d train rows, world size %d, %d step(s) per epoch, "
                     "%d step(s) in all", len(run.ds["train"]), ctx.world_size,
                     run.steps_per_epoch, run.total_steps)
            (run.out / "history.jsonl").unlink(missing_ok=True)
        return
    data = ckpt.load(path, run.identity)
    run.model.load_state_dict(data["model"])
    run.optimizer.load_state_dict(data["optimizer"])
    run.scheduler.load_state_dict(data["scheduler"])
    st = run.state = RunState(**data["state"])
    rng = data["rng"]
    ckpt.restore_rng(rng[ctx.rank % len(rng)])
    hooks = data.get("comm_hook_state")
    if hooks and run.comm.state is not None:
        if len(hooks) == ctx.world_size:
            comm.settle_buckets(run.ddp, run.comm, ctx.device)
            comm.restore_hook_state(run.comm, hooks[ctx.rank], ctx.device)
        elif ctx.is_main:
            log.info("PowerSGD's error feedback was kept for world size %d, this run has %d: "
                     "it starts afresh", len(hooks), ctx.world_size)
    if ctx.rank >= len(rng):  # grown: a new rank gets dropout masks of its own
        torch.manual_seed(run.cfg.seed + ctx.rank + 1000 * st.global_step)
    st.wall_seconds_before = st.wall_seconds
    st.resumed_from_steps.append(st.global_step)
    st.epoch_world = st.epoch_world or len(rng)
    if st.epoch_samples == 0 or st.batch_in_epoch == 0:
        st.epoch_world, st.segment_start, st.epoch_samples = ctx.world_size, 0, 0
    elif st.epoch_world != ctx.world_size or st.segment_start > 0:
        # Mid-epoch at another world size (or after one): a new segment from the consumed count.
        if run.cfg.length_grouping:
            raise ckpt.CheckpointError(
                f"{path}: a mid-epoch checkpoint with length_grouping on resumes only at the "
                f"world size it was written at ({len(rng)}), not {ctx.world_size}")
        st.segment_start, st.batch_in_epoch = st.epoch_samples, 0
        if ctx.is_main:
            log.info("resized: epoch %d continues at world size %d from sample %d of %d, "
                     "%d micro-batch(es) per optimizer step", st.epoch, ctx.world_size,
                     st.epoch_samples, run.epoch_len(), run.accum)
    if ctx.is_main:
        trim_history(run.out / "history.jsonl", st.global_step)
        log.info("resuming from checkpoint %s: step %d of %d, epoch %d, batch %d of %d",
                 path.name, st.global_step, run.total_steps, st.epoch, st.batch_in_epoch,
                 run.micro_per_epoch)
