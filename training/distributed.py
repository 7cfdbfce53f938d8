"""The process group of a torchrun run and the few collectives the training loop needs.

``init_distributed`` joins the group torchrun describes in the environment (nccl on GPUs,
gloo on CPU) or runs alone; every helper here is a no-op at world size 1, so the loop reads
the same either way. Also: tying a worker's life to its launcher, the default thread
count, and seeding the RNGs.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

T = TypeVar("T")


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


def mean_and_any(ctx: DistContext, value: float, flag: bool) -> tuple[float, bool]:
    """The mean of ``value`` over the ranks and whether any rank raised ``flag``: one
    all-reduce (the per-step loss one), so a preemption costs no extra collective."""
    if not ctx.initialized:
        return value, flag
    t = torch.tensor([value, 1.0 if flag else 0.0], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return float(t[0].item()) / ctx.world_size, bool(t[1].item() > 0)


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
