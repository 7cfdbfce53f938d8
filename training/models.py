"""The two classifiers: pretrained MiniLM with a linear head, and a small encoder from scratch.

Both take ``(input_ids, attention_mask)`` and return logits, and both mean-pool the token
states over the attention mask (what all-MiniLM-L6-v2 was trained with, and what makes the
output independent of how much padding a batch carries). ``model_spec`` describes a built
model completely, so ``build_from_spec`` can rebuild it from ``model_config.json`` without
the MiniLM package's weights (the trained state dict replaces them anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

MODEL_KINDS = ("minilm", "small")
SPEC_VERSION = 1


def mean_pool(states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the token states where the mask is 1 (an all-padding row gives zeros)."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    summed = (states * mask).sum(dim=1)
    return summed / mask.sum(dim=1).clamp(min=1.0)


class MiniLMClassifier(nn.Module):
    """all-MiniLM-L6-v2 encoder (a 6-layer BERT, hidden 384), mean pooling, dropout, linear."""

    def __init__(self, encoder: nn.Module, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.encoder = encoder
        hidden = int(encoder.config.hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        pooled = mean_pool(out.last_hidden_state, attention_mask)
        return self.head(self.dropout(pooled))


class SmallEncoderClassifier(nn.Module):
    """Token + learned position embeddings, a 2-layer Transformer encoder, mean pooling,
    linear head. Trains in seconds on CPU, which is what the end-to-end tests need."""

    def __init__(self, vocab_size: int, num_classes: int, max_length: int, pad_id: int,
                 d_model: int = 128, num_layers: int = 2, num_heads: int = 4,
                 ff_dim: int = 256, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.pos = nn.Embedding(max_length, d_model)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, ff_dim, dropout=dropout,
                                           batch_first=True, norm_first=True)
        # Nested tensors (the inference fast path) would make eval outputs depend on the
        # padding pattern in subtle ways and warn with norm_first; plain masking is enough.
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids) + self.pos(positions).unsqueeze(0)
        x = self.encoder(x, src_key_padding_mask=attention_mask == 0)
        pooled = mean_pool(self.norm(x), attention_mask)
        return self.head(self.dropout(pooled))


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    # "Some weights were not used: pooler.*" is expected (the pooler is dropped on purpose).
    hf_logging.set_verbosity_error()
    # The per-tensor "Loading weights" bar would flood the logs of every rank.
    hf_logging.disable_progress_bar()


def build_model(kind: str, num_classes: int, max_length: int, vocab_size: int, pad_id: int,
                dropout: float, minilm_dir: Path | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """A freshly initialized model of ``kind`` and the spec that rebuilds it.

    MiniLM is loaded offline from the package folder. Its pooler is left out: the head reads
    mean-pooled states, and an unused pooler would leave parameters without gradients,
    which DDP rejects unless told to search for unused parameters on every step."""
    if kind == "minilm":
        if minilm_dir is None:
            from training.data import minilm_folder

            minilm_dir = minilm_folder()
        from transformers import AutoModel

        _quiet_transformers()
        encoder = AutoModel.from_pretrained(str(minilm_dir), local_files_only=True,
                                            add_pooling_layer=False)
        if max_length > encoder.config.max_position_embeddings:
            raise ValueError(f"max_length {max_length} exceeds MiniLM's "
                             f"{encoder.config.max_position_embeddings} positions")
        model: nn.Module = MiniLMClassifier(encoder, num_classes, dropout)
        encoder_cfg = encoder.config.to_dict()
        spec = {"hidden_size": int(encoder.config.hidden_size),
                "num_layers": int(encoder.config.num_hidden_layers),
                "num_heads": int(encoder.config.num_attention_heads),
                "encoder_config": encoder_cfg}
    elif kind == "small":
        model = SmallEncoderClassifier(vocab_size, num_classes, max_length, pad_id, dropout=dropout)
        spec = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "ff_dim": 256}
    else:
        raise ValueError(f"model must be one of {MODEL_KINDS}, not {kind!r}")
    spec = {"spec_version": SPEC_VERSION, "kind": kind, "num_classes": num_classes,
            "max_length": max_length, "vocab_size": vocab_size, "pad_id": pad_id,
            "dropout": dropout, "pooling": "mean"} | spec
    return model, spec


def build_from_spec(spec: dict[str, Any]) -> nn.Module:
    """An untrained model with the architecture ``spec`` describes (``model_config.json``).

    Needs neither the MiniLM weights nor a network: the encoder is built from the stored
    Hugging Face config; load ``model.pt`` into it afterwards."""
    kind = spec["kind"]
    if kind == "small":
        return SmallEncoderClassifier(spec["vocab_size"], spec["num_classes"], spec["max_length"],
                                      spec["pad_id"], d_model=spec["hidden_size"],
                                      num_layers=spec["num_layers"], num_heads=spec["num_heads"],
                                      ff_dim=spec["ff_dim"], dropout=spec["dropout"])
    if kind == "minilm":
        from transformers import AutoConfig, AutoModel

        _quiet_transformers()
        enc = dict(spec["encoder_config"])
        config = AutoConfig.for_model(enc.pop("model_type"), **enc)
        encoder = AutoModel.from_config(config, add_pooling_layer=False)
        return MiniLMClassifier(encoder, spec["num_classes"], spec["dropout"])
    raise ValueError(f"model_config.json: unknown model kind {kind!r}")


def load_trained(model_dir: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """The trained model in ``OUT/model`` (``model_config.json`` + ``model.pt``), in eval mode."""
    import json

    model_dir = Path(model_dir)
    spec = json.loads((model_dir / "model_config.json").read_text())
    model = build_from_spec(spec)
    state = torch.load(model_dir / "model.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval(), spec
