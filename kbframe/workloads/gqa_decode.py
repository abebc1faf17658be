"""GQA decode for one KV head on one PE (ADR-0065; kernels in :mod:`kbframe.kernels.gqa_decode`).

HBM tensors: ``q (G, d)``, ``k (S_kv, d)``, ``v (S_kv, d)`` and the output ``out (G, d)``.
The unit of progress is the KV tile (``tile`` keys); the reference is float64
``softmax(q·kᵀ·scale)·v``. An inputs file holds ``q``, ``k``, ``v`` and optionally a 0-d
``scale``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import ConfigError, InputsError
from ..params import Choice, param
from .attention import DecodeInputsConfig, check_scores, draw_qkv, read_scale, reference, softmax_scale
from .base import BenchConfig, Workload

__all__ = ["GqaDecode", "GqaDecodeConfig", "reference"]


class VStaging(Choice):
    """How decode opt2 stages V (kbframe.kernels.gqa_decode.gqa_decode_opt2)."""

    composite = "composite"  # streamed inside composite #2 (ADR D4/D6.2)
    prefetch = "prefetch"  # tl.load ahead into V buffers


@dataclass
class GqaDecodeConfig(BenchConfig):
    """GQA decode shape and the softmax scale."""

    G: int = param(8, lo=1, doc="query heads per KV head")
    d: int = param(128, lo=1, doc="head dim")
    S_kv: int = param(4096, unit="keys", lo=1, doc="keys")
    tile: int = param(64, unit="keys", lo=1, doc="keys per KV tile (TILE)")
    scale: Optional[float] = param(None, lo=0, lo_open=True, doc="softmax scale; None → 1/sqrt(d)")
    inputs: DecodeInputsConfig = field(default_factory=DecodeInputsConfig)
    # opt2's design space (kbframe.kernels.gqa_decode.gqa_decode_opt2 documents
    # the ADR rule each keeps or relaxes); null: the kernel takes no such parameter
    s_buffers: Optional[int] = param(None, hi=1024, doc="S buffers (≥ 2; the ADR's opt2: 2)")
    k_prefetch: Optional[int] = param(None, hi=1024, doc="tiles #1 (Q·Kᵀ) is issued ahead of #2 (< s_buffers; ADR: 1)")
    v_buffers: Optional[int] = param(None, hi=1024, doc="V buffers when V is prefetched (≥ 2, > k_prefetch)")
    v_staging: Optional[VStaging] = param(None, choices=VStaging, doc="composite (ADR D4/D6.2: V streamed inside #2) or "
                                                                 "prefetch (tl.load ahead)")


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
        self._validate_design()  # ranges and choices: the Config's declarations (kbframe.params)

    def _validate_design(self) -> None:
        """The opt2 design keys (:data:`DESIGN_DEFAULTS`), when any is set: ranges, and a
        prefetch distance below each ring it writes ahead into."""
        c = self.cfg
        if all(c[k] is None for k in DESIGN_DEFAULTS):
            return
        e = {k: (c[k] if c[k] is not None else v) for k, v in DESIGN_DEFAULTS.items()}
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
        """q (G, d), k, v (S_kv, d) and the scale (:func:`draw_qkv`: drawn in float64 and
        kept as float32; q scaled so the scores ``q·kᵀ·scale`` have standard deviation
        ``bench.inputs.peak``)."""
        c = self.cfg
        return draw_qkv(rng, c.G, c.S_kv, c.d, c.inputs.peak, self.scale())

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
        kw = dict(G=c.G, d=c.d, S_kv=c.S_kv, tile=int(c.tile), scale=self.scale(inputs))
        kw.update({k: c[k] for k in DESIGN_DEFAULTS if c[k] is not None})
        return kw

    def n_units(self) -> int:
        return -(-self.cfg.S_kv // self.cfg.tile)

    def progress_stream(self) -> tuple[str, int]:
        return "k", int(self.cfg.tile)

    def periodic_axis(self) -> tuple[str, int] | None:
        return ("S_kv", int(self.cfg.tile)) if self.cfg.inputs.path is None else None

    def shape(self) -> dict:
        c = self.cfg
        return {"G": c.G, "d": c.d, "S_kv": c.S_kv, "tile": int(c.tile), "n_tiles": self.n_units()}

    def extra_metrics(self, inputs: dict | None) -> dict:
        return {"scale": self.scale(inputs)}

    def saved_scalars(self, inputs: dict) -> dict:
        return {"scale": np.float64(self.scale(inputs))}

    def reference(self, inputs: dict) -> dict:
        return {"out": reference(inputs["q"], inputs["k"], inputs["v"], self.scale(inputs))}

