"""The keys a model preset sets (``+model=NAME``, ``conf/model/``): a transformer's
published dimensions. Each workload reads the ones it needs: the attention workloads
``H_q``, ``H_kv`` and ``d``; the decoder layer all of them. Defaults are Llama-3-70B's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .base import BenchConfig


@dataclass
class ModelConfig(BenchConfig):
    """A model's dimensions (the preset's comment quotes the published config)."""

    model: Optional[str] = None  # the model preset that set them (named in errors), or None
    arch: str = "llama"  # the layer's family: llama (RMSNorm, RoPE, GQA, SwiGLU) or another the preset names
    H: int = 8192  # hidden size
    H_q: int = 64  # query heads
    H_kv: int = 8  # KV heads; each serves G = H_q / H_kv query heads
    d: int = 128  # head dim
    F: int = 28672  # FFN width (intermediate_size)
    layers: int = 80  # decoder layers of the model
    rope_theta: float = 500000.0  # RoPE base
    eps: float = 1e-5  # RMSNorm epsilon


def preset_note(cfg) -> str:
    """``"model preset 'NAME' (conf/model/NAME.yaml): "`` for an error about a preset's
    value, or ``""`` when no preset set it."""
    return f"model preset '{cfg.model}' (conf/model/{cfg.model}.yaml): " if cfg.model else ""
