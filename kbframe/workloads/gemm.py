"""GEMM harness (ADR-0044; kernel :func:`kbframe.kernels.gemm.gemm`): ``C = epilogue(A·B)``.

HBM tensors: ``A (M, K)``, ``B (K, N)``, optional ``bias (1, N)`` and ``other (M, N)`` (for
the ``bias`` and ``add`` epilogues), and the output ``C (M, N)``. The unit of progress is an
output block of ``block_m`` rows; the reference is ``A·B`` in float64 followed by the same
epilogue ops, each as defined in :mod:`kbframe.ir.micro_ops` (the living definition).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List

import numpy as np

from ..errors import ConfigError, InputsError
from ..ir import micro_ops
from ..kernels.gemm import EPILOGUE_TENSORS, STAGINGS
from .base import BenchConfig, Workload


#: the predecessor's epilogues (ADR-0044)
EPILOGUES = ("bias", "relu", "gelu", "sigmoid", "scale", "clamp", "dequant", "add")


@dataclass
class GemmConfig(BenchConfig):
    """GEMM shape, staging variant and epilogue."""

    M: int = 512
    K: int = 512
    N: int = 512
    block_m: int = 128  # output rows per composite
    staging: str = "ref_ref"  # ref_ref | load_ref | load_load
    epilogue: List[Dict[str, Any]] = field(default_factory=list)  # [{op: relu}, {op: scale, factor: 0.5}]


class Gemm(Workload):
    """``C = epilogue(A·B)`` on one PE."""

    Config = GemmConfig
    unit = "output block"
    outputs = ("C",)

    def validate(self) -> None:
        c = self.cfg
        self.at_least(c, "M", "K", "N", "block_m")
        if c.staging not in STAGINGS:
            raise ConfigError(f"bench.staging must be one of {', '.join(STAGINGS)}, got '{c.staging}'")
        for i, e in enumerate(c.epilogue):
            kind = e.get("op") if hasattr(e, "get") else None
            if kind not in EPILOGUES:
                raise ConfigError(f"bench.epilogue[{i}]: op must be one of {', '.join(EPILOGUES)}, got {kind!r}")
            need = set(micro_ops.MICRO_OPS[kind].extras)
            have = set(e) - {"op", "scope"}
            if have != need:
                raise ConfigError(f"bench.epilogue[{i}] ({kind}): needs scalar(s) {sorted(need) or 'none'}, "
                                  f"got {sorted(have) or 'none'}")

    def _kinds(self) -> list:
        return [e["op"] for e in self.cfg.epilogue]

    def tensors(self) -> dict:
        c = self.cfg
        t = {"A": (c.M, c.K), "B": (c.K, c.N)}
        if "bias" in self._kinds():
            t["bias"] = (1, c.N)
        if "add" in self._kinds():
            t["other"] = (c.M, c.N)
        t["C"] = (c.M, c.N)
        return t

    def generate(self, rng: np.random.Generator) -> dict:
        """Standard normal A; B scaled by 1/sqrt(K) so C stays of order 1; bias and other
        standard normal. Drawn in float64, kept as float32."""
        out = {}
        for name, shape in self.tensors().items():
            if name in self.outputs:
                continue
            x = rng.standard_normal(shape)
            if name == "B":
                x *= 1.0 / math.sqrt(self.cfg.K)
            out[name] = x.astype(np.float32)
        return out

    def shape_from_file(self, arrays: dict, path: str) -> dict:
        a, b = arrays["A"], arrays["B"]
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or 0 in a.shape or 0 in b.shape:
            raise InputsError(f"bench.inputs.path: inconsistent shapes in '{path}': A {a.shape}, B {b.shape} "
                              f"(need A (M, K), B (K, N), non-empty)")
        shape = {"M": int(a.shape[0]), "K": int(a.shape[1]), "N": int(b.shape[1])}
        for name, want in (("bias", (1, shape["N"])), ("other", (shape["M"], shape["N"]))):
            if name in arrays and tuple(arrays[name].shape) != want:
                raise InputsError(f"bench.inputs.path: '{path}' array '{name}' has shape "
                                  f"{tuple(arrays[name].shape)}, needs {want}")
        return shape

    def host_bytes(self) -> int:
        return 3 * 8 * sum(math.prod(s) for s in self.tensors().values())

    def kernel_kwargs(self, inputs: dict | None) -> dict:
        c = self.cfg
        return dict(M=c.M, K=c.K, N=c.N, block_m=int(c.block_m), staging=str(c.staging),
                    epilogue=[dict(e) for e in c.epilogue])

    def n_units(self) -> int:
        return -(-self.cfg.M // self.cfg.block_m)

    def progress_stream(self) -> tuple[str, int]:
        return "C", int(self.cfg.block_m)

    def shape(self) -> dict:
        c = self.cfg
        return {"M": c.M, "K": c.K, "N": c.N, "block_m": int(c.block_m), "staging": str(c.staging),
                "n_blocks": self.n_units()}

    def reference(self, inputs: dict) -> dict:
        acc = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
        for e in self.cfg.epilogue:
            kind = e["op"]
            others = [inputs[EPILOGUE_TENSORS[kind]].astype(np.float64)] if kind in EPILOGUE_TENSORS else []
            acc = micro_ops.apply(kind, [acc, *others], dict(e))
        return {"C": acc}
