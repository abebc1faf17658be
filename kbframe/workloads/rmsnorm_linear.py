"""RMSNorm + linear (kernel :func:`kbframe.kernels.rmsnorm_linear.rmsnorm_linear`):
``y = (x / sqrt(mean(x²) + eps)) · γ · W``, the RMSNorm a YAML prologue recipe.

HBM tensors: ``x (T, H)`` (T tokens of hidden size H), ``gamma (1, H)``, ``W (H, N)`` and
the output ``y (T, N)``. Shapes default to Llama-3-8B (H = 4096, eps = 1e-5, the q
projection's N = 4096). The unit of progress is a block of ``block_t`` tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputsError
from ..params import param
from .base import BenchConfig, Workload


@dataclass
class RmsnormLinearConfig(BenchConfig):
    """Tokens, hidden size, output features, token block and the RMSNorm epsilon."""

    T: int = param(8, unit="tokens", lo=1, doc="tokens")
    H: int = param(4096, lo=1, doc="hidden size (Llama-3-8B)")
    N: int = param(4096, lo=1, doc="output features (Llama-3-8B q projection)")
    block_t: int = param(128, unit="tokens", lo=1, doc="tokens per composite")
    eps: float = param(1e-5, lo=0, lo_open=True, doc="RMSNorm epsilon (Llama-3-8B rms_norm_eps)")


class RmsnormLinear(Workload):
    """RMSNorm fused into the prologue of a GEMM that streams W from HBM."""

    Config = RmsnormLinearConfig
    unit = "token block"
    outputs = ("y",)

    def tensors(self) -> dict:
        c = self.cfg
        return {"x": (c.T, c.H), "gamma": (1, c.H), "W": (c.H, c.N), "y": (c.T, c.N)}

    def generate(self, rng: np.random.Generator) -> dict:
        """x standard normal, gamma around 1, W scaled by 1/sqrt(H); float32."""
        c = self.cfg
        x = rng.standard_normal((c.T, c.H))
        gamma = 1.0 + 0.1 * rng.standard_normal((1, c.H))
        w = rng.standard_normal((c.H, c.N)) / math.sqrt(c.H)
        return {"x": x.astype(np.float32), "gamma": gamma.astype(np.float32), "W": w.astype(np.float32)}

    def shape_from_file(self, arrays: dict, path: str) -> dict:
        x, g, w = arrays["x"], arrays["gamma"], arrays["W"]
        if x.ndim != 2 or w.ndim != 2 or tuple(g.shape) != (1, x.shape[1]) or w.shape[0] != x.shape[1] \
                or 0 in x.shape or 0 in w.shape:
            raise InputsError(f"bench.inputs.path: inconsistent shapes in '{path}': x {x.shape}, gamma {g.shape}, "
                              f"W {w.shape} (need x (T, H), gamma (1, H), W (H, N))")
        return {"T": int(x.shape[0]), "H": int(x.shape[1]), "N": int(w.shape[1])}

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        c = self.cfg
        return dict(T=c.T, H=c.H, N=c.N, block_t=int(c.block_t), eps=float(c.eps))

    def n_units(self) -> int:
        return -(-self.cfg.T // self.cfg.block_t)

    def progress_stream(self) -> tuple[str, int]:
        return "x", int(self.cfg.block_t)

    def shape(self) -> dict:
        c = self.cfg
        return {"T": c.T, "H": c.H, "N": c.N, "block_t": int(c.block_t), "n_blocks": self.n_units()}

    def reference(self, inputs: dict) -> dict:
        x = inputs["x"].astype(np.float64)
        y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(self.cfg.eps))
        return {"y": (y * inputs["gamma"].astype(np.float64)) @ inputs["W"].astype(np.float64)}
