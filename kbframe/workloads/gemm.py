"""GEMM harness (ADR-0044; kernel :func:`kbframe.kernels.gemm.gemm`): ``C = epilogue(A·B)``.

HBM tensors: ``A (M, K)``, ``B (K, N)``, optional ``bias (1, N)`` and ``other (M, N)`` (for
the ``bias`` and ``add`` epilogues), and the output ``C (M, N)``. The unit of progress is an
output block of ``block_m`` rows; the reference is ``A·B`` in float64 followed by the same
epilogue ops, each as defined in :mod:`kbframe.ir.micro_ops` (the living definition).

Many PEs (``bench.pes`` > 1: that many PEs of the first cube, ``all``: every one; DESIGN.md
decision 9). A tensor handle is a row window, so the HBM layout keeps every PE's operands
row windows: the column panels of B, C, ``bias`` and ``other`` are HBM tensors of their own
(``B.p<j>`` ``(K, w_j)``, ``C.p<j>`` ``(M, w_j)`` ...), the K panels of A likewise
(``A.k<r>`` ``(M, k_r)``); inputs files and ``tensors.npz`` keep A, B, bias, other and C
whole. ``bench.split``:

* ``n``: PE p computes the column range ``⌊p·N/P⌋ .. ⌊(p+1)·N/P⌋`` of C, in blocks of
  ``block_m`` rows (one composite each); needs N ≥ P;
* ``mn``: C in output tiles of ``tile_m × tile_n`` (default: the GEMM unit's tile,
  ``hardware.units.gemm.tile_m/n``), numbered row by row, tile t on PE ``t mod P``
  (``assign: round_robin``) or on PE ``⌊t·P/T⌋`` of T tiles (``blocked``), one composite
  each; a PE with no tile stays idle (wave quantisation);
* ``k``: PE r computes the partial ``A[:, k_r] · B[k_r, :]`` of the K range
  ``⌊r·K/P⌋ .. ⌊(r+1)·K/P⌋`` into TCM, block by block of ``block_m`` rows; the partials are
  summed over IPCQ along the ``tree`` of :func:`kbframe.kernels.collectives.merge_plan`
  (a received partial added with the MATH ``add``), and rank 0 stores the block; needs
  K ≥ P and no epilogue (an epilogue applies to the sum, not to a partial).

Every split streams A and B from HBM (staging ``ref_ref``). One PE (``bench.pes=1``, the
default) is the one-PE GEMM above, unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from ..errors import ConfigError, InputsError, NumericsError
from ..params import param
from ..ir import micro_ops
from ..ir.handles import itemsize
from ..kernels.collectives import merge_plan
from ..kernels.gemm import EPILOGUE_TENSORS, STAGINGS
from .base import BenchConfig, Workload


#: the predecessor's epilogues (ADR-0044)
EPILOGUES = ("bias", "relu", "gelu", "sigmoid", "scale", "clamp", "dequant", "add")


@dataclass
class GemmConfig(BenchConfig):
    """GEMM shape, staging variant and epilogue."""

    M: int = param(512, lo=1, doc="rows of A and of the output")
    K: int = param(512, lo=1, doc="columns of A, rows of B")
    N: int = param(512, lo=1, doc="columns of B and of the output")
    block_m: int = param(128, unit="rows", lo=1, doc="output rows per composite")
    staging: str = param("ref_ref", doc="ref_ref | load_ref | load_load")
    epilogue: List[Dict[str, Any]] = param(factory=list, doc="ops applied to C, in order: [{op: relu}, {op: scale, "
                                                             "factor: 0.5}]")
    pes: Any = param(1, doc="PEs of the first cube the GEMM uses: a whole number, or 'all'")
    split: str = param("n", doc="n | mn | k: how the work is spread over the PEs (module doc)")
    assign: str = param("round_robin", doc="split mn: round_robin | blocked")
    tile_m: Optional[int] = param(None, doc="split mn: output tile rows (None: hardware.units.gemm.tile_m)")
    tile_n: Optional[int] = param(None, doc="split mn: output tile columns (None: hardware.units.gemm.tile_n)")


SPLITS = ("n", "mn", "k")
ASSIGNS = ("round_robin", "blocked")


class Gemm(Workload):
    """``C = epilogue(A·B)`` on one PE, or spread over the PEs of a cube (module doc)."""

    Config = GemmConfig
    unit = "output block"
    outputs = ("C",)

    # ---- checks ----------------------------------------------------------------------
    def validate(self) -> None:
        c = self.cfg
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
            for name in sorted(need):  # a NaN or inf would only show as the outputs' after the simulation
                v = e[name]
                bound = kind == "clamp" and isinstance(v, float) and math.isinf(v)  # a side left open
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) or bound):
                    what = "a number (±inf leaves a side open)" if kind == "clamp" else "a finite number"
                    raise ConfigError(f"bench.epilogue[{i}] ({kind}): {name} must be {what}, got {v!r}")
        self._validate_spread()

    def cube_pes(self) -> int:
        """PEs of the first cube: ``hardware.pes_per_cube`` (at most ``hardware.n_pes``)."""
        hw = self.hardware
        ppc = int(hw.get("pes_per_cube", 8)) if hw is not None else self.n_pes
        return min(ppc, self.n_pes)

    @property
    def P(self) -> int:
        """PEs the GEMM uses (``bench.pes``; ``all``: every PE of the first cube)."""
        p = self.cfg.pes
        return self.cube_pes() if p == "all" else int(p)

    def _validate_spread(self) -> None:
        """``bench.pes``, ``split``, ``assign``, ``tile_m/n`` (module doc); ConfigError names
        the key and its limit."""
        c = self.cfg
        p = c.pes
        if p != "all" and (isinstance(p, bool) or not isinstance(p, int)):
            raise ConfigError(f"bench.pes must be a whole number ≥ 1 or 'all', got {p!r}")
        if p != "all" and p < 1:
            raise ConfigError(f"bench.pes must be ≥ 1 or 'all', got {p}")
        if self.P > self.cube_pes():
            raise ConfigError(f"bench.pes={self.P} is more than the {self.cube_pes()} PE(s) of a cube "
                              f"(hardware.pes_per_cube, hardware.n_pes)")
        if c.split not in SPLITS:
            raise ConfigError(f"bench.split must be one of {', '.join(SPLITS)}, got '{c.split}'")
        if c.assign not in ASSIGNS:
            raise ConfigError(f"bench.assign must be one of {', '.join(ASSIGNS)}, got '{c.assign}'")
        for key in ("tile_m", "tile_n"):
            if c[key] is not None and c[key] < 1:
                raise ConfigError(f"bench.{key} must be ≥ 1 (or null: the GEMM unit's tile), got {c[key]}")
        if self.P == 1:
            return
        if c.staging != "ref_ref":
            raise ConfigError(f"bench.staging={c.staging} runs on one PE; bench.pes={self.P} streams A and B "
                              f"from HBM (staging ref_ref)")
        if c.split == "n" and c.N < self.P:
            raise ConfigError(f"bench.split=n gives each PE a range of output columns: bench.N={c.N} < "
                              f"bench.pes={self.P}")
        if c.split == "k" and c.K < self.P:
            raise ConfigError(f"bench.split=k gives each PE a range of K: bench.K={c.K} < bench.pes={self.P}")
        if c.split == "k" and c.epilogue:
            raise ConfigError("bench.split=k sums partial products; bench.epilogue must be empty (an epilogue "
                              "applies to the sum)")
        need, what = self.tile_tcm_bytes()
        cap = int(self.hardware.tcm_bytes) if self.hardware is not None else None
        if cap is not None and need > cap:
            raise ConfigError(f"TCM too small for the tiles: {what} need {need} B per PE, more than "
                              f"hardware.tcm_bytes={cap}")

    def gemm_tile(self) -> tuple:
        """The GEMM unit's tile ``(tile_m, tile_n, tile_k)`` (``hardware.units.gemm``; 128 each
        without a hardware config)."""
        g = self.hardware.units.get("gemm") if self.hardware is not None else None
        return tuple(int(g.get(k, 128)) if g is not None else 128 for k in ("tile_m", "tile_n", "tile_k"))

    def out_tile(self) -> tuple:
        """Split mn's output tile ``(tile_m, tile_n)``, clipped to ``(M, N)``."""
        c = self.cfg
        gm, gn, _ = self.gemm_tile()
        return (min(c.M, c.tile_m or gm), min(c.N, c.tile_n or gn))

    def tile_tcm_bytes(self) -> tuple[int, str]:
        """TCM one PE's tiles need, bytes, and what they are: one K step (the GEMM unit's
        ``tile_k``) of the A and B tiles of the PE's output tile and the tile's accumulator, at
        ``bench.dtype``; split k also holds its two partial blocks and a received one
        (``block_m × N``)."""
        c = self.cfg
        isz = itemsize(c.dtype)
        gm, gn, tk = self.gemm_tile()
        tk = min(tk, c.K)
        if c.split == "mn":
            tm, tn = self.out_tile()
            tm, tn = min(tm, gm), min(tn, gn)
            what = f"tiles {tm}×{tk} + {tk}×{tn} + {tm}×{tn} (bench.tile_m/tile_n, hardware.units.gemm.tile_k)"
        else:
            tm, tn = min(gm, c.block_m, c.M), min(gn, -(-c.N // self.P) if c.split == "n" else c.N)
            what = f"tiles {tm}×{tk} + {tk}×{tn} + {tm}×{tn} (hardware.units.gemm.tile_m/n/k)"
        need = isz * (tm * tk + tk * tn + tm * tn)
        if c.split == "k":
            bm = min(c.block_m, c.M)
            need += 3 * isz * bm * c.N
            what += f" and 3 partial blocks of {bm}×{c.N} (bench.block_m × bench.N)"
        return need, what

    # ---- the spread's layout ------------------------------------------------------------
    def col_panels(self) -> list[tuple[int, int]]:
        """Column ranges ``[n0, n1)`` of the HBM column panels (split n: one per PE; mn:
        one per tile column)."""
        c, P = self.cfg, self.P
        if c.split == "n":
            return [(p * c.N // P, (p + 1) * c.N // P) for p in range(P)]
        tn = self.out_tile()[1]
        return [(n0, min(c.N, n0 + tn)) for n0 in range(0, c.N, tn)]

    def k_ranges(self) -> list[tuple[int, int]]:
        """Split k: the K range ``[k0, k1)`` of each PE."""
        c, P = self.cfg, self.P
        return [(r * c.K // P, (r + 1) * c.K // P) for r in range(P)]

    def _spread(self) -> bool:
        return self.P > 1

    def _kinds(self) -> list:
        return [e["op"] for e in self.cfg.epilogue]

    def _whole(self) -> dict:
        """The tensors as the user sees them (inputs files, ``tensors.npz``)."""
        c = self.cfg
        t = {"A": (c.M, c.K), "B": (c.K, c.N)}
        if "bias" in self._kinds():
            t["bias"] = (1, c.N)
        if "add" in self._kinds():
            t["other"] = (c.M, c.N)
        t["C"] = (c.M, c.N)
        return t

    def tensors(self) -> dict:
        if not self._spread():
            return self._whole()
        c = self.cfg
        if c.split == "k":
            t = {f"A.k{r}": (c.M, k1 - k0) for r, (k0, k1) in enumerate(self.k_ranges())}
            return {**t, "B": (c.K, c.N), "C": (c.M, c.N)}
        t = {"A": (c.M, c.K)}
        panels = self.col_panels()
        for name, rows in (("B", c.K), ("bias", 1), ("other", c.M), ("C", c.M)):
            if name in self._whole():
                t.update({f"{name}.p{j}": (rows, n1 - n0) for j, (n0, n1) in enumerate(panels)})
        return t

    def input_names(self) -> tuple:
        return tuple(n for n in self._whole() if n not in self.outputs)

    def _with_hbm_layout(self, inp: dict) -> dict:
        """``inp`` plus the spread's HBM panels cut from it (module doc)."""
        if not self._spread():
            return inp
        out = dict(inp)
        if self.cfg.split == "k":
            for r, (k0, k1) in enumerate(self.k_ranges()):
                out[f"A.k{r}"] = inp["A"][:, k0:k1]
            return out
        for j, (n0, n1) in enumerate(self.col_panels()):
            for name in ("B", "bias", "other"):
                if name in inp:
                    out[f"{name}.p{j}"] = inp[name][:, n0:n1]
        return out

    def read_outputs(self, read) -> dict:
        if not self._spread() or self.cfg.split == "k":
            return {"C": read("C")}
        return {"C": np.concatenate([read(f"C.p{j}") for j in range(len(self.col_panels()))], axis=1)}

    # ---- inputs ----------------------------------------------------------------------
    def generate(self, rng: np.random.Generator) -> dict:
        """Standard normal A; B scaled by 1/sqrt(K) so C stays of order 1; bias and other
        standard normal. Drawn in float64, kept as float32."""
        out = {}
        for name, shape in self._whole().items():
            if name in self.outputs:
                continue
            x = rng.standard_normal(shape)
            if name == "B":
                x *= 1.0 / math.sqrt(self.cfg.K)
            out[name] = x.astype(np.float32)
        return self._with_hbm_layout(out)

    def accept_file(self, arrays: dict, path: str) -> dict:
        return self._with_hbm_layout(super().accept_file(arrays, path))

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

    def check_inputs(self, data_dtype: str, inputs: dict) -> None:
        """``A·B`` (plus ``bias`` / ``other``) must fit the accumulator (fp32 at least):
        refused naming the bound before the simulation, never turned into inf there.

        Raises:
            NumericsError: the largest |A·B| and the accumulator's largest value.
        """
        acc_top = float(np.finfo(np.promote_types(np.dtype(data_dtype), np.float32)).max)
        a, b = inputs["A"], inputs["B"]
        if not a.size or not b.size:
            return
        extra = sum(max(float(inputs[n].max()), -float(inputs[n].min())) for n in ("bias", "other")
                    if n in inputs and inputs[n].size)
        big_b = max(float(b.max()), -float(b.min()))
        # |C_ij| ≤ Σ_k |A_ik| · max |B|: when that bound fits, the exact product is not needed
        if float(np.abs(a).sum(axis=1, dtype=np.float64).max()) * big_b + extra <= acc_top:
            return
        c_max = float(np.max(np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))) + extra
        if not c_max <= acc_top:
            raise NumericsError(f"A·B reaches |C| ≈ {c_max:.6g}, beyond the accumulator's largest value "
                                f"{acc_top:.6g}; use smaller inputs")

    def host_bytes(self) -> int:
        return (5 if self._spread() else 3) * 8 * sum(math.prod(s) for s in self._whole().values())

    # ---- the run --------------------------------------------------------------------------
    def kernel_kwargs(self, inputs: dict | None) -> dict:
        c = self.cfg
        return dict(M=c.M, K=c.K, N=c.N, block_m=int(c.block_m), staging=str(c.staging),
                    epilogue=[dict(e) for e in c.epilogue])

    def programs(self, kernel, make_tl, inputs: dict | None) -> dict:
        """One PE: :meth:`kernel_kwargs` on ``bench.pe``. Many: each PE's share of the work
        (module doc) as the kernel's ``tiles`` (and, split k, ``reduce``)."""
        if not self._spread():
            return super().programs(kernel, make_tl, inputs)
        c, P = self.cfg, self.P
        common = self.kernel_kwargs(inputs)
        per_pe: dict = {p: [] for p in range(P)}
        reduce = None
        bm = min(c.block_m, c.M)
        blocks = [(m0, min(c.M, m0 + bm)) for m0 in range(0, c.M, bm)]
        if c.split == "n":
            for p in range(P):
                per_pe[p] = [("A", m0, m1, f"B.p{p}", None, f"C.p{p}", p) for m0, m1 in blocks]
        elif c.split == "mn":
            tm, _ = self.out_tile()
            rows = [(m0, min(c.M, m0 + tm)) for m0 in range(0, c.M, tm)]
            panels = self.col_panels()
            T = len(rows) * len(panels)
            for t in range(T):
                i, j = divmod(t, len(panels))
                p = t % P if c.assign == "round_robin" else t * P // T
                per_pe[p].append(("A", *rows[i], f"B.p{j}", None, f"C.p{j}", j))
        else:
            plan = merge_plan(P, "tree")
            for r, (k0, k1) in enumerate(self.k_ranges()):
                per_pe[r] = [(f"A.k{r}", m0, m1, "B", (k0, k1), "C" if r == 0 else None, None)
                             for m0, m1 in blocks]
            reduce = plan
        progs = {}
        for p in range(P):
            if not per_pe[p]:
                continue
            tl = make_tl(p)
            kw = dict(common, tiles=per_pe[p],
                      reduce=None if reduce is None else {"steps": reduce[p], "pes": list(range(P))})
            progs[p] = (lambda tl=tl, kw=kw: kernel(tl, **kw))
        return progs

    def n_units(self) -> int:
        c = self.cfg
        blocks = -(-c.M // c.block_m)
        if not self._spread():
            return blocks
        if c.split == "n":
            return blocks * self.P
        if c.split == "mn":
            return -(-c.M // self.out_tile()[0]) * len(self.col_panels())
        return blocks

    def progress_stream(self) -> tuple[str, int]:
        if self._spread() and self.cfg.split != "k":
            return "C.p0", int(self.cfg.block_m) if self.cfg.split == "n" else self.out_tile()[0]
        return "C", int(self.cfg.block_m)

    def shape(self) -> dict:
        c = self.cfg
        s = {"M": c.M, "K": c.K, "N": c.N, "block_m": int(c.block_m), "staging": str(c.staging),
             "n_blocks": self.n_units()}
        if self._spread():
            s = {**s, "pes": self.P, "split": str(c.split)}
            if c.split == "mn":
                s.update(tile_m=self.out_tile()[0], tile_n=self.out_tile()[1], assign=str(c.assign))
        return s

    def reference(self, inputs: dict) -> dict:
        acc = inputs["A"].astype(np.float64) @ inputs["B"].astype(np.float64)
        for e in self.cfg.epilogue:
            kind = e["op"]
            others = [inputs[EPILOGUE_TENSORS[kind]].astype(np.float64)] if kind in EPILOGUE_TENSORS else []
            acc = micro_ops.apply(kind, [acc, *others], dict(e))
        return {"C": acc}
