"""GQA decode for one KV head on one PE (ADR-0065; kernels in :mod:`kbframe.kernels.gqa_decode`).

HBM tensors: ``q (G, d)``, ``k (S_kv, d)``, ``v (S_kv, d)`` and the output ``out (G, d)``.
The unit of progress is the KV tile (``tile`` keys); the reference is float64
``softmax(q·kᵀ·scale)·v``. An inputs file holds ``q``, ``k``, ``v`` and optionally a 0-d
``scale``.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import ConfigError, InputsError, NumericsError
from .base import BenchConfig, InputsConfig, Workload

_CHUNK_ROWS = 8192


@dataclass
class DecodeInputsConfig(InputsConfig):
    """``peak``: standard deviation of the generated scores ``q·kᵀ·scale``."""

    peak: float = 1.0


@dataclass
class GqaDecodeConfig(BenchConfig):
    """GQA decode shape and the softmax scale."""

    G: int = 8  # query heads per KV head
    d: int = 128  # head dim
    S_kv: int = 4096  # keys
    tile: int = 64  # keys per KV tile (TILE)
    scale: Optional[float] = None  # softmax scale; None → 1/sqrt(d)
    inputs: DecodeInputsConfig = field(default_factory=DecodeInputsConfig)
    # opt2's design space (issue 13; kbframe.kernels.gqa_decode.gqa_decode_opt2 documents
    # the ADR rule each keeps or relaxes); null: the kernel takes no such parameter
    s_buffers: Optional[int] = None  # S buffers (≥ 2; the ADR's opt2: 2)
    k_prefetch: Optional[int] = None  # tiles #1 (Q·Kᵀ) is issued ahead of #2 (< s_buffers; ADR: 1)
    v_buffers: Optional[int] = None  # V buffers when V is prefetched (≥ 2, > k_prefetch)
    v_staging: Optional[str] = None  # composite (ADR D4/D6.2: V streamed inside #2) or prefetch (tl.load ahead)


#: opt2's design keys and the kernel's defaults (ADR-0065's opt2)
DESIGN_DEFAULTS = {"s_buffers": 2, "k_prefetch": 1, "v_buffers": 2, "v_staging": "composite"}


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
        self._validate_design()

    def _validate_design(self) -> None:
        """The opt2 design keys (:data:`DESIGN_DEFAULTS`), when any is set: ranges, and a
        prefetch distance below each ring it writes ahead into."""
        c = self.cfg
        if all(c[k] is None for k in DESIGN_DEFAULTS):
            return
        e = {k: (c[k] if c[k] is not None else v) for k, v in DESIGN_DEFAULTS.items()}
        if e["v_staging"] not in ("composite", "prefetch"):
            raise ConfigError(f"bench.v_staging must be composite or prefetch, got '{e['v_staging']}'")
        for key in ("s_buffers", "v_buffers"):
            if e[key] < 2:
                raise ConfigError(f"bench.{key} must be ≥ 2 (one buffer is written while another is read), "
                                  f"got {e[key]}")
        if e["k_prefetch"] < 0:
            raise ConfigError(f"bench.k_prefetch must be ≥ 0, got {e['k_prefetch']}")
        rings = [("s_buffers", "S")] + ([("v_buffers", "V")] if e["v_staging"] == "prefetch" else [])
        for key, what in rings:
            if e["k_prefetch"] >= e[key]:
                raise ConfigError(f"bench.k_prefetch={e['k_prefetch']} must be < bench.{key}={e[key]}: a tile "
                                  f"issued that far ahead would overwrite the {what} buffer of a tile not yet "
                                  f"consumed")

    def programs(self, kernel, make_tl, inputs: dict | None) -> dict:
        """As :meth:`Workload.programs`; a design key set for a kernel without that
        parameter is refused (ConfigError naming both)."""
        params = inspect.signature(kernel).parameters
        for key in DESIGN_DEFAULTS:
            if self.cfg[key] is not None and key not in params:
                raise ConfigError(f"bench.{key} is a parameter of decode opt2's kernel; bench.kernel "
                                  f"'{self.cfg.kernel}' does not take it")
        return super().programs(kernel, make_tl, inputs)

    def tensors(self) -> dict:
        c = self.cfg
        return {"q": (c.G, c.d), "k": (c.S_kv, c.d), "v": (c.S_kv, c.d), "out": (c.G, c.d)}

    def scale(self, inputs: dict | None = None) -> float:
        """The softmax scale: ``bench.scale``, else an inputs file's, else ``1/sqrt(d)``."""
        if self.cfg.scale is not None:  # an explicit bench.scale wins over the file's
            return float(self.cfg.scale)
        if inputs and "scale" in inputs:
            return float(inputs["scale"])
        return 1.0 / math.sqrt(self.cfg.d)

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
        q = (rng.standard_normal((c.G, c.d)) * (c.inputs.peak / (scale * math.sqrt(c.d)))).astype(np.float32)
        chunk = np.empty((min(c.S_kv, _CHUNK_ROWS), c.d))  # each chunk is drawn into this

        def normal_f32(rows):
            out = np.empty((rows, c.d), np.float32)
            for r0 in range(0, rows, _CHUNK_ROWS):
                r1 = min(rows, r0 + _CHUNK_ROWS)
                out[r0:r1] = rng.standard_normal(out=chunk[:r1 - r0])
            return out
        k = normal_f32(c.S_kv)
        v = normal_f32(c.S_kv)
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
        if "scale" in arrays:
            s = arrays["scale"]
            real = np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)
            if s.shape != () or not real or not np.isfinite(s) or float(s) <= 0:
                raise InputsError(f"bench.inputs.path: '{path}' scale must be a 0-d finite number > 0, got {s!r}")
            out["scale"] = float(s)
        out["scale"] = self.scale(out)
        return out

    def check_inputs(self, data_dtype: str, inputs: dict) -> None:
        """Scores ``q·kᵀ·scale`` must fit the accumulator (fp32 at least): refused naming
        the bound, never turned into inf and then NaN."""
        dt = np.dtype(data_dtype)
        acc_top = float(np.finfo(np.promote_types(dt, np.float32)).max)
        q, k, scale = inputs["q"], inputs["k"], inputs["scale"]
        big_k = max(float(k.max()), -float(k.min())) if k.size else 0.0
        q64 = np.asarray(q, dtype=np.float64)
        # |s| ≤ max_i Σ_d |q_id| · max |k| · |scale|: when that bound fits, so does every
        # score, and the exact product (a pass over all of k) is not needed
        bound = float(np.abs(q64).sum(axis=-1).max()) * big_k * abs(scale) if q64.size else 0.0
        if bound <= acc_top:
            return
        with np.errstate(over="ignore", invalid="ignore"):
            s_max = float(np.max(np.abs(q) @ np.abs(k).T)) * abs(scale)
        if not s_max <= acc_top:
            raise NumericsError(f"scores q·kᵀ·scale reach |s| ≈ {s_max:.6g}, beyond the accumulator's largest "
                                f"value {acc_top:.6g}; use smaller inputs or bench.scale")

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        c = self.cfg
        kw = dict(G=c.G, d=c.d, S_kv=c.S_kv, tile=int(c.tile), scale=self.scale(inputs))
        kw.update({k: c[k] for k in DESIGN_DEFAULTS if c[k] is not None})
        return kw

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


def reference(q, k, v, scale) -> np.ndarray:
    """float64 ``softmax(q·kᵀ·scale)·v``, ``(G, d)``, computed over chunks of keys so that
    float32 k and v are widened a chunk at a time (no full float64 copy of either)."""
    q64 = q.astype(np.float64, copy=False)
    S = k.shape[0]
    s = np.empty((q.shape[0], S))
    for r0 in range(0, S, _CHUNK_ROWS):
        s[:, r0:r0 + _CHUNK_ROWS] = q64 @ k[r0:r0 + _CHUNK_ROWS].astype(np.float64, copy=False).T
    s *= scale
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros((q.shape[0], v.shape[1]))
    for r0 in range(0, S, _CHUNK_ROWS):
        out += p[:, r0:r0 + _CHUNK_ROWS] @ v[r0:r0 + _CHUNK_ROWS].astype(np.float64, copy=False)
    return out
