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

PowerSGD's state (each rank's error-feedback memory, its warm-started P and Q factors,
the iteration count and the random generator) is part of the checkpoint (``hook_state``,
gathered from every rank; ``restore_hook_state``): a resumed powersgd run at the same
world size continues exactly. At another world size the per-rank memories have no owner,
so PowerSGD starts afresh there (with its warm-up), said in the log. The other choices
are stateless and resume exactly.
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

    def __init__(self, hook: str, grad_bytes: int, state: Any = None) -> None:
        self.hook, self.grad_bytes = hook, grad_bytes
        self.state = state  # PowerSGD's PowerSGDState, whose memory the checkpoint keeps
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


def settle_buckets(ddp: nn.Module, stats: CommStats, device: torch.device) -> None:
    """Before PowerSGD's memory is put back on resume: one zero-gradient backward (eval
    mode, no random numbers drawn, PowerSGD still in its warm-up) so that DDP rebuilds its
    buckets in gradient-ready order before the first real step. PowerSGD's memory is a flat
    tensor per bucket in the bucket's parameter order; the checkpoint saved it in the
    rebuilt layout, which an uninterrupted run reaches after its first iteration (inside
    the warm-up, where the memory is unused). Without this the resumed run's first step
    would add that memory to the wrong parameters."""
    st = stats.state
    start, st.start_powerSGD_iter, st.iter = st.start_powerSGD_iter, 10**9, 0
    was_training = ddp.training
    ddp.eval()
    try:
        ids = torch.ones((1, 4), dtype=torch.long, device=device)
        (ddp(ids, torch.ones_like(ids)).float().sum() * 0.0).backward()
    finally:
        ddp.train(was_training)
        st.start_powerSGD_iter = start
        for p in ddp.parameters():
            p.grad = None


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
        return CommStats(hook, grad_bytes, state)
    return CommStats(hook, grad_bytes)


def _to(value: Any, device: torch.device | str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to(v, device) for v in value)
    return value


def hook_state(stats: CommStats) -> dict[str, Any] | None:
    """This rank's PowerSGD state as tensors and plain values (what ``torch.load`` with
    ``weights_only`` reads back), or None for a stateless hook."""
    if stats.state is None:
        return None
    st = stats.state
    raw = {slot: getattr(st, slot) for slot in type(st).__slots__ if slot not in ("process_group", "rng")}
    kind, keys, pos, has_gauss, gauss = st.rng.get_state()
    raw["rng"] = {"keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)}
    return _to(raw, "cpu")


def restore_hook_state(stats: CommStats, saved: dict[str, Any], device: torch.device) -> None:
    """Put a ``hook_state`` back into this rank's PowerSGD state (same world size)."""
    import numpy as np

    st = stats.state
    values = _to({k: v for k, v in saved.items() if k != "rng"}, device)
    for slot, value in values.items():
        setattr(st, slot, value)
    r = saved["rng"]
    st.rng = np.random.RandomState()
    st.rng.set_state(("MT19937", r["keys"].numpy().astype(np.uint32), r["pos"], r["has_gauss"],
                      r["cached_gaussian"]))
