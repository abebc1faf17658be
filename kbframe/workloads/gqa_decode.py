"""GQA decode for one KV head on one PE (ADR-0065; kernels in :mod:`kbframe.kernels.gqa_decode`).

HBM tensors: ``q (G, d)``, ``k (S_kv, d)``, ``v (S_kv, d)`` and the output ``out (G, d)``.
The unit of progress is the KV tile (``tile`` keys); the reference is float64
``softmax(q·kᵀ·scale)·v``. An inputs file holds ``q``, ``k``, ``v`` and optionally a 0-d
``scale``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import ConfigError, InputsError
from .attention import DecodeInputsConfig, check_scores, draw_qkv, read_scale, reference, softmax_scale
from .base import BenchConfig, Workload

__all__ = ["GqaDecode", "GqaDecodeConfig", "reference"]


@dataclass
class GqaDecodeConfig(BenchConfig):
    """GQA decode shape and the softmax scale."""

    G: int = 8  # query heads per KV head
    d: int = 128  # head dim
    S_kv: int = 4096  # keys
    tile: int = 64  # keys per KV tile (TILE)
    scale: Optional[float] = None  # softmax scale; None → 1/sqrt(d)
    inputs: DecodeInputsConfig = field(default_factory=DecodeInputsConfig)


class GqaDecode(Workload):
    """One query token, ``G`` query heads sharing one KV head of ``S_kv`` keys."""

    Config = GqaDecodeConfig
    unit = "KV tile"
    outputs = ("out",)
    generated_only_keys = ("seed", "inputs.peak")
    file_scalars = ("scale",)

    def validate(self) -> None:
        c = self.cfg
        self.at_least(c, "G", "d", "S_kv", "tile")
        if c.scale is not None and not (math.isfinite(c.scale) and c.scale > 0):
            raise ConfigError(f"bench.scale must be a finite number > 0, got {c.scale}")
        if not (math.isfinite(c.inputs.peak) and c.inputs.peak >= 0):
            raise ConfigError(f"bench.inputs.peak must be a finite number ≥ 0, got {c.inputs.peak}")

    def tensors(self) -> dict:
        c = self.cfg
        return {"q": (c.G, c.d), "k": (c.S_kv, c.d), "v": (c.S_kv, c.d), "out": (c.G, c.d)}

    def scale(self, inputs: dict | None = None) -> float:
        """The softmax scale: ``bench.scale``, else an inputs file's, else ``1/sqrt(d)``."""
        return softmax_scale(self.cfg.scale, inputs, self.cfg.d)

    def host_bytes(self) -> int:
        """q, k, v as float64 (inputs and tensors.npz), the float64 reference's (G, S_kv)
        score temporaries and, in data mode, the HBM copies at ``data_dtype``."""
        c = self.cfg
        n_in = c.G * c.d + 2 * c.S_kv * c.d
        need = 8 * n_in + 3 * 8 * c.G * c.S_kv
        if c.data:
            need += np.dtype(c.data_dtype).itemsize * (n_in + c.G * c.d)
        return need

    def generate(self, rng: np.random.Generator) -> dict:
        """q (G, d), k, v (S_kv, d), drawn in float64 and kept as float32 (the kernel's
        inputs are those float32 values; the reference uses the same values). q is scaled
        so the scores ``q·kᵀ·scale`` have standard deviation ``bench.inputs.peak``. k and v
        are drawn in chunks (the same stream), so a long context never holds a float64 copy."""
        c = self.cfg
        scale = self.scale()
        q, k, v = draw_qkv(rng, c.G, c.S_kv, c.d, c.inputs.peak, scale)
        return {"q": q, "k": k, "v": v, "scale": scale}

    def shape_from_file(self, arrays: dict, path: str) -> dict:
        q, k, v = arrays["q"], arrays["k"], arrays["v"]
        if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or k.shape != v.shape or q.shape[1] != k.shape[1] \
                or 0 in q.shape or 0 in k.shape:
            raise InputsError(f"bench.inputs.path: inconsistent shapes in '{path}': q {q.shape}, k {k.shape}, "
                              f"v {v.shape} (need q (G, d), k and v (S_kv, d), all non-empty)")
        return {"G": int(q.shape[0]), "d": int(q.shape[1]), "S_kv": int(k.shape[0])}

    def accept_file(self, arrays: dict, path: str) -> dict:
        out = super().accept_file(arrays, path)
        file_scale = read_scale(arrays, path)
        if file_scale is not None:
            out["scale"] = file_scale
        out["scale"] = self.scale(out)
        return out

    def check_inputs(self, data_dtype: str, inputs: dict) -> None:
        """Scores ``q·kᵀ·scale`` must fit the accumulator (fp32 at least): refused naming
        the bound, never turned into inf and then NaN."""
        check_scores(data_dtype, inputs["q"], inputs["k"], inputs["scale"])

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        c = self.cfg
        return dict(G=c.G, d=c.d, S_kv=c.S_kv, tile=int(c.tile), scale=self.scale(inputs))

    def n_units(self) -> int:
        return -(-self.cfg.S_kv // self.cfg.tile)

    def progress_stream(self) -> tuple[str, int]:
        return "k", int(self.cfg.tile)

    def shape(self) -> dict:
        c = self.cfg
        return {"G": c.G, "d": c.d, "S_kv": c.S_kv, "tile": int(c.tile), "n_tiles": self.n_units()}

    def extra_metrics(self, inputs: dict | None) -> dict:
        return {"scale": self.scale(inputs)}

    def saved_scalars(self, inputs: dict) -> dict:
        return {"scale": np.float64(self.scale(inputs))}

    def reference(self, inputs: dict) -> dict:
        return {"out": reference(inputs["q"], inputs["k"], inputs["v"], self.scale(inputs))}

