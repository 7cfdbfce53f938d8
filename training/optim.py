"""Optimizer pieces of the training loop: the warm-up/linear-decay LR schedule, the
weight-decay parameter groups, and the autocast context of the chosen precision."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from training.distributed import DistContext


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


def adamw(groups: list[dict[str, Any]], lr: float) -> torch.optim.AdamW:
    """AdamW with the fused kernel: one pass over all parameters instead of a loop of small
    tensor ops per parameter. On MiniLM (22M parameters, 2 cores) the optimizer step took
    111 ms of a 312 ms training step with the default implementation and 34 ms fused
    (benchmarks/train_step.py, docs/BENCHMARKS.md issue 21); the update is the same AdamW."""
    return torch.optim.AdamW(groups, lr=lr, fused=True)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 in hardware. Without it autocast emulates bf16 and is
    slower, not faster: on a CPU without AVX512-BF16 a training step took 8x (the small
    encoder) and 15x (MiniLM) the fp32 time under bf16 autocast (benchmarks/precision.py,
    docs/BENCHMARKS.md)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, name, lambda: False)() for name in probes)
    return False


def resolve_precision(requested: str, device: torch.device) -> str:
    """The precision a run uses: ``auto`` is bf16 on hardware with native bf16, else fp32;
    an explicit ``fp32`` or ``bf16`` is used as asked."""
    if requested != "auto":
        return requested
    return "bf16" if native_bf16(device) else "fp32"


def autocast(ctx: DistContext, precision: str) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
