"""The keys a model preset sets (``+model=NAME``, ``conf/model/``): a transformer's
published dimensions. Each workload reads the ones it needs: the attention workloads
``H_q``, ``H_kv`` and ``d``; the decoder layer all of them (the others' docs say
"decoder_layer only": a preset sets them on any bench, where they are not used). Defaults are Llama-3-70B's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..params import param
from .base import BenchConfig


@dataclass
class ModelConfig(BenchConfig):
    """A model's dimensions (the preset's comment quotes the published config)."""

    model: Optional[str] = param(None, doc="the model preset that set them (named in errors), or None")
    model_layers: Optional[int] = param(None, lo=1, doc="the model's layer count (a preset sets it): a decoder-layer "
                                                         "run of fewer layers also estimates the model's whole step")
    arch: str = param("llama", doc="the layer's family: llama (RMSNorm, RoPE, GQA, SwiGLU) or another the preset "
                                   "names (decoder_layer only)")
    H: int = param(8192, lo=1, doc="hidden size (decoder_layer only)")
    H_q: int = param(64, lo=1, hi=65536, doc="query heads")
    H_kv: int = param(8, lo=1, hi=65536, doc="KV heads; each serves G = H_q / H_kv query heads")
    d: int = param(128, lo=1, doc="head dim")
    F: int = param(28672, lo=1, doc="FFN width, intermediate_size (decoder_layer only)")
    layers: int = param(80, lo=1, doc="decoder layers of the model (decoder_layer only)")
    rope_theta: float = param(500000.0, lo=0, lo_open=True, doc="RoPE base (decoder_layer only)")
    eps: float = param(1e-5, lo=0, lo_open=True, doc="RMSNorm epsilon (decoder_layer only)")


def preset_note(cfg) -> str:
    """``"model preset 'NAME' (conf/model/NAME.yaml): "`` for an error about a preset's
    value, or ``""`` when no preset set it."""
    return f"model preset '{cfg.model}' (conf/model/{cfg.model}.yaml): " if cfg.model else ""
