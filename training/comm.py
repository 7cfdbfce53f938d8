"""Gradient compression: DDP communication hooks chosen by ``training.hparams.comm_hook``,
and a count of the bytes every rank hands to the all-reduce.

- ``none``: DDP's built-in all-reduce of the fp32 gradient buckets (no hook registered).
- ``fp16`` / ``bf16``: each bucket is cast to half precision, all-reduced, cast back
  (half the bytes). bf16 needs NCCL: gloo has no bf16 all-reduce, so it is refused on CPU.
- ``powersgd``: low-rank compression (rank ``powersgd_rank``) with error feedback; matrices
  travel as two thin factors, vectors (biases, norms) uncompressed. The first
  ``powersgd_start_iter`` synchronisations are plain all-reduces (PowerSGD's warm-up).

The count is measured, not estimated: the hook modules' ``dist`` is replaced by a proxy
whose ``all_reduce`` adds the payload size (numel x element size) of every tensor the hook
reduces, including the ones PowerSGD reduces later in its future callbacks. For ``none``
the payload is the bucket buffers DDP reduces itself: the gradients of all trainable
parameters. The figure is the payload per rank; a ring all-reduce puts about
2 (W-1)/W times that on each rank's link.

PowerSGD's error-feedback memory is not part of the checkpoint: a resumed run starts it
afresh, so a resumed powersgd run is close to, not bit-identical with, an uninterrupted one
(the other choices are stateless and resume exactly).
"""

from __future__ import annotations

import threading
import types
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from training.data import TrainingDataError


class _Counter:
    def __init__(self) -> None:
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, tensor: torch.Tensor) -> None:
        with self._lock:
            self.bytes += tensor.numel() * tensor.element_size()


_COUNTER = _Counter()


class _CountingDist(types.ModuleType):
    """``torch.distributed`` as the hook modules see it, with a counting ``all_reduce``."""

    def __init__(self) -> None:
        super().__init__("torch.distributed")

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    @staticmethod
    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        _COUNTER.add(tensor)
        return dist.all_reduce(tensor, *args, **kwargs)


def _install_counter() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    for mod in (default_hooks, powerSGD_hook):
        if not isinstance(mod.dist, _CountingDist):
            mod.dist = _CountingDist()


class CommStats:
    """Bytes handed to the all-reduce by this rank since the start (or the last ``take``)."""

    def __init__(self, hook: str, grad_bytes: int) -> None:
        self.hook, self.grad_bytes = hook, grad_bytes
        self._seen = _COUNTER.bytes

    def after_sync(self) -> None:
        """Called after every step whose backward all-reduced (``none`` counts here)."""
        if self.hook == "none":
            _COUNTER.bytes += self.grad_bytes

    def take(self) -> int:
        now = _COUNTER.bytes
        delta, self._seen = now - self._seen, now
        return delta


def ddp_options(model: nn.Module, hook: str, device_type: str) -> dict[str, Any]:
    """PowerSGD on gloo: one gradient bucket. PowerSGD issues its second all-reduce from a
    future callback; with several buckets those callbacks run on gloo's threads in no fixed
    order, so two ranks can pair up different buckets' collectives (gloo aborts with "Received
    data size doesn't match"). One bucket keeps the order; NCCL orders them by stream."""
    if hook != "powersgd" or device_type == "cuda":
        return {}
    size = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"bucket_cap_mb": size / 2**20 + 1}


def check_backend(hook: str, backend: str | None) -> None:
    if hook == "bf16" and backend != "nccl":
        raise TrainingDataError(
            f"training.hparams.comm_hook=bf16 needs the nccl backend (CUDA GPUs); this run uses "
            f"{backend or 'no process group'}, whose all-reduce has no bf16: choose fp16 or "
            "powersgd on CPU")


def register(ddp: nn.Module, hook: str, rank: int, start_iter: int, world_size: int) -> CommStats:
    """Register ``hook`` on the DDP model (a no-op at world size 1) and return the counter."""
    grad_bytes = sum(p.numel() * p.element_size() for p in ddp.parameters() if p.requires_grad)
    if world_size == 1 or not isinstance(ddp, nn.parallel.DistributedDataParallel):
        return CommStats("none", 0)
    check_backend(hook, dist.get_backend())
    _install_counter()
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif hook == "powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                   start_powerSGD_iter=start_iter, min_compression_rate=1,
                                   use_error_feedback=True, warm_start=True, random_seed=0)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    return CommStats(hook, grad_bytes)
