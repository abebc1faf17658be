"""Helpers shared by the decode workloads (``gqa_decode``, ``decode_heads``,
``decode_splitk``): the inputs config, drawing q/k/v, the softmax scale, the score range
check, the float64 reference, and the batch of sequences × KV heads that the multi-PE
workloads share (:class:`HeadsConfig`, :class:`HeadsBatch`). No workload class lives here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from omegaconf import OmegaConf

from ..errors import ConfigError, InputsError, NumericsError
from ..params import param
from ..kernels.attention import PARTIALS
from .base import InputsConfig
from .model import ModelConfig, preset_note

#: rows of k and v drawn, or widened to float64, at a time
CHUNK_ROWS = 8192


@dataclass
class DecodeInputsConfig(InputsConfig):
    """``peak``: standard deviation of the generated scores ``q·kᵀ·scale``."""

    peak: float = param(1.0, lo=0, doc="standard deviation of the generated scores q·kᵀ·scale")


def softmax_scale(cfg_scale, inputs: dict | None, d: int) -> float:
    """The softmax scale: ``bench.scale``, else an inputs file's ``scale``, else ``1/sqrt(d)``."""
    if cfg_scale is not None:  # an explicit bench.scale wins over the file's
        return float(cfg_scale)
    if inputs and "scale" in inputs:
        return float(inputs["scale"])
    return 1.0 / math.sqrt(d)


def draw_qkv(rng: np.random.Generator, n_q: int, n_kv: int, d: int, peak: float, scale: float) -> dict:
    """``{"q", "k", "v", "scale"}``: q ``(n_q, d)``, k and v ``(n_kv, d)``, drawn in float64
    and kept as float32 (the kernel's inputs are those float32 values; the reference uses
    the same values). q is scaled so the scores ``q·kᵀ·scale`` have standard deviation
    ``peak``. k and v are drawn in chunks (the same stream), so a long context never holds
    a float64 copy."""
    q64 = rng.standard_normal((n_q, d)) * (peak / (scale * math.sqrt(d)))
    top = float(np.finfo(np.float32).max)
    big = float(np.max(np.abs(q64))) if q64.size else 0.0
    if not big <= top:
        raise NumericsError(f"bench.inputs.peak={peak:g} at softmax scale {scale:g}: the drawn q (peak / "
                            f"(scale·√d) times a standard normal) reaches |x| ≈ {big:.6g}, beyond float32's largest "
                            f"value {top:.6g} (refused rather than stored as inf); use a smaller bench.inputs.peak "
                            f"or a larger bench.scale")
    q = q64.astype(np.float32)
    chunk = np.empty((min(n_kv, CHUNK_ROWS), d))  # each chunk is drawn into this

    def normal_f32(out):
        for r0 in range(0, len(out), CHUNK_ROWS):
            r1 = min(len(out), r0 + CHUNK_ROWS)
            out[r0:r1] = rng.standard_normal(out=chunk[:r1 - r0])
        return out
    k = normal_f32(np.empty((n_kv, d), np.float32))
    return {"q": q, "k": k, "v": normal_f32(np.empty((n_kv, d), np.float32)), "scale": scale}


def read_scale(arrays: dict, path: str) -> float | None:
    """An inputs file's optional 0-d ``scale``, checked (InputsError unless a finite number > 0)."""
    if "scale" not in arrays:
        return None
    s = arrays["scale"]
    real = np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)
    if s.shape != () or not real or not np.isfinite(s) or float(s) <= 0:
        raise InputsError(f"bench.inputs.path: '{path}' scale must be a 0-d finite number > 0, got {s!r}")
    return float(s)


def check_scores(data_dtype: str, q, k, scale: float) -> None:
    """Scores ``q·kᵀ·scale`` (every row of q against every row of k: a bound for any
    pairing) must fit the accumulator (fp32 at least): refused naming the bound, never
    turned into inf and then NaN.

    Raises:
        NumericsError: the largest |score| and the accumulator's largest value.
    """
    dt = np.dtype(data_dtype)
    acc_top = float(np.finfo(np.promote_types(dt, np.float32)).max)
    if not abs(scale) <= acc_top:  # the kernel multiplies by it in the accumulator's type
        raise NumericsError(f"the softmax scale {scale:.6g} is beyond the accumulator's largest value {acc_top:.6g}; "
                            f"use a smaller bench.scale")
    big_k = max(float(k.max()), -float(k.min())) if k.size else 0.0
    q64 = np.asarray(q, dtype=np.float64)
    # |s| ≤ max_i Σ_d |q_id| · max |k| · |scale|: when that bound fits, so does every
    # score, and the exact product (a pass over all of k) is not needed
    bound = float(np.abs(q64).sum(axis=-1).max()) * big_k * abs(scale) if q64.size else 0.0
    if bound <= acc_top:
        return
    s_max = float(np.max(np.abs(q) @ np.abs(k).T)) * abs(scale)  # an overflow is inf (run_bench's errstate)
    if not s_max <= acc_top:
        raise NumericsError(f"scores q·kᵀ·scale reach |s| ≈ {s_max:.6g}, beyond the accumulator's largest "
                            f"value {acc_top:.6g}; use smaller inputs or bench.scale")


def reference(q, k, v, scale) -> np.ndarray:
    """float64 ``softmax(q·kᵀ·scale)·v``, ``(G, d)``, computed over chunks of keys so that
    float32 k and v are widened a chunk at a time (no full float64 copy of either). No keys
    (``k`` of 0 rows) gives zeros: attention over nothing is defined as 0, not NaN."""
    S = k.shape[0]
    if S == 0:
        return np.zeros((q.shape[0], v.shape[1]))
    q64 = q.astype(np.float64, copy=False)
    s = np.empty((q.shape[0], S))
    for r0 in range(0, S, CHUNK_ROWS):
        s[:, r0:r0 + CHUNK_ROWS] = q64 @ k[r0:r0 + CHUNK_ROWS].astype(np.float64, copy=False).T
    s *= scale
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros((q.shape[0], v.shape[1]))
    for r0 in range(0, S, CHUNK_ROWS):
        out += p[:, r0:r0 + CHUNK_ROWS] @ v[r0:r0 + CHUNK_ROWS].astype(np.float64, copy=False)
    return out


@dataclass
class HeadsConfig(ModelConfig):
    """A batch of decode sequences × KV heads (``decode_heads``, ``decode_splitk``).

    A model preset (``+model=NAME``, ``conf/model/``) sets ``model``, ``H_q``, ``H_kv`` and
    ``d`` (and the layer's dimensions, which these workloads do not read)."""

    S_kv: Any = param(4096, unit="keys", doc="keys per sequence: an int (every sequence), or a list (one per "
                                             "sequence: the batch)")
    batch: int = param(1, lo=1, hi=65536, doc="sequences, when S_kv is an int")
    tile: int = param(64, unit="keys", lo=1, doc="keys per KV tile (TILE)")
    inner: str = param("opt2", doc="the inner loop: opt2 (2 composites per tile) or opt3 (~13 primitives per tile)")
    scale: Optional[float] = param(None, lo=0, lo_open=True, doc="softmax scale; None → 1/sqrt(d)")
    inputs: DecodeInputsConfig = field(default_factory=DecodeInputsConfig)


class HeadsBatch:
    """What ``decode_heads`` and ``decode_splitk`` share (a mixin for a
    :class:`~kbframe.workloads.base.Workload` whose ``cfg`` is a :class:`HeadsConfig`):
    the batch, the stacked HBM tensors, inputs, the score check and the reference.

    HBM tensors (row windows per (sequence b, KV head h), an *item*, numbered
    ``i = b·H_kv + h``):

    * ``q (B·H_q, d)``: item i's ``G`` query heads are rows ``i·G .. (i+1)·G`` (query head
      ``h·G + g`` of sequence b uses KV head h, as in Llama's ``repeat_kv``);
    * ``k``, ``v`` ``(H_kv·ΣS_b, d)``: sequence b's heads one after another, each ``S_b``
      rows, so every item's keys are one contiguous window;
    * ``out (B·H_q, d)``: laid out as q.

    A sequence of length 0 has no rows in k and v and its output is 0.
    """

    outputs = ("out",)
    generated_only_keys = ("seed", "inputs.peak")
    file_scalars = ("scale", "S_kv")
    unit = "KV tile"

    # ---- the batch -------------------------------------------------------------------
    def lengths(self) -> list[int]:
        """Keys of each sequence, ``[S_0, ..., S_{B-1}]``."""
        s = self.cfg.S_kv
        if isinstance(s, int):
            return [int(s)] * int(self.cfg.batch)
        return [int(x) for x in s]

    @property
    def G(self) -> int:
        return self.cfg.H_q // self.cfg.H_kv

    def items(self) -> list[tuple[int, int]]:
        """``[(b, h), ...]`` in item order (sequence-major)."""
        return [(b, h) for b in range(len(self.lengths())) for h in range(self.cfg.H_kv)]

    def q_rows(self, b: int, h: int) -> tuple[int, int]:
        """Rows of q (and out) of item (b, h)."""
        r0 = (b * self.cfg.H_kv + h) * self.G
        return r0, r0 + self.G

    def kv_rows(self, b: int, h: int) -> tuple[int, int]:
        """Rows of k and v of item (b, h) (empty when ``S_b = 0``)."""
        lengths = self.lengths()
        r0 = self.cfg.H_kv * sum(lengths[:b]) + h * lengths[b]
        return r0, r0 + lengths[b]

    def item_tiles(self, S: int) -> int:
        """KV tiles of a key range of ``S`` keys."""
        return -(-S // int(self.cfg.tile))

    # ---- checks ----------------------------------------------------------------------
    def validate_heads(self) -> None:
        """What the :class:`HeadsConfig` declarations (kbframe.params) cannot say: heads that
        divide, the lengths, the inner loop.

        Raises:
            ConfigError: names the key (and the model preset, for heads that do not divide).
        """
        c = self.cfg
        if c.H_q % c.H_kv:
            who = preset_note(c)
            raise ConfigError(f"{who}query heads bench.H_q={c.H_q} are not a multiple of KV heads "
                              f"bench.H_kv={c.H_kv} (GQA needs H_q = G·H_kv)")
        s = c.S_kv
        vals = [s] if isinstance(s, int) else (list(s) if OmegaConf.is_list(s) or isinstance(s, list) else None)
        if vals is None or not vals or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                               for x in vals):
            raise ConfigError(f"bench.S_kv must be an int ≥ 0 or a non-empty list of them (one per sequence), "
                              f"got {_plain(s)}")
        if not isinstance(s, int) and c.batch not in (1, len(vals)):
            raise ConfigError(f"bench.batch={c.batch} but bench.S_kv lists {len(vals)} sequence lengths "
                              f"(a list sets the batch; drop bench.batch)")
        if not any(self.lengths()):
            raise ConfigError(f"bench.S_kv: every sequence is empty ({_plain(s)}); at least one needs a key")
        if c.inner not in PARTIALS:
            raise ConfigError(f"bench.inner must be one of {', '.join(PARTIALS)}, got '{c.inner}'")

    # ---- tensors and inputs ----------------------------------------------------------
    def tensors(self) -> dict:
        c = self.cfg
        B, rows = len(self.lengths()), c.H_kv * sum(self.lengths())
        return {"q": (B * c.H_q, c.d), "k": (rows, c.d), "v": (rows, c.d), "out": (B * c.H_q, c.d)}

    def scale(self, inputs: dict | None = None) -> float:
        """The softmax scale: ``bench.scale``, else an inputs file's, else ``1/sqrt(d)``."""
        return softmax_scale(self.cfg.scale, inputs, self.cfg.d)

    def host_bytes(self) -> int:
        """q, k, v as float64, the reference's score temporaries (one item at a time) and,
        in data mode, the HBM copies at ``data_dtype``."""
        c = self.cfg
        shapes = self.tensors()
        n_in = sum(math.prod(shapes[n]) for n in ("q", "k", "v"))
        need = 8 * n_in + 3 * 8 * self.G * max(self.lengths())
        if c.data:
            need += np.dtype(c.data_dtype).itemsize * (n_in + math.prod(shapes["out"]))
        return need

    def generate(self, rng: np.random.Generator) -> dict:
        """q, k, v (:func:`draw_qkv`: float32, scores of std ``bench.inputs.peak``) and the
        scale."""
        shapes = self.tensors()
        return draw_qkv(rng, shapes["q"][0], shapes["k"][0], self.cfg.d, self.cfg.inputs.peak, self.scale())

    def shape_from_file(self, arrays: dict, path: str) -> dict:
        """The batch an inputs file's stacked tensors (q ``(B·H_q, d)``, k and v
        ``(H_kv·ΣS_b, d)``) determine: ``d`` always; with the sequence lengths in the file
        (an integer array ``S_kv``, one per sequence), also ``B``, ``H_q`` and ``H_kv``;
        without them, a batch of equal lengths for the keys' ``H_q`` and ``H_kv`` (when the
        keys' own batch does not fit the rows: a ragged batch needs the lengths).

        Raises:
            InputsError: shapes that contradict each other or the lengths, or rows no
                batch of the keys' heads fits.
        """
        q, k, v = arrays["q"], arrays["k"], arrays["v"]
        c = self.cfg
        if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or k.shape != v.shape or q.shape[1] != k.shape[1] \
                or q.shape[1] == 0:
            raise InputsError(f"bench.inputs.path: shapes in '{path}' (q {q.shape}, k {k.shape}, v {v.shape}) do "
                              f"not stack a batch: need q (B·H_q, d), k and v (H_kv·ΣS_kv, d), d > 0")
        d, q_rows, kv_rows = int(q.shape[1]), int(q.shape[0]), int(k.shape[0])
        if "S_kv" in arrays:
            return {"d": d, **self._batch_from_lengths(arrays["S_kv"], q_rows, kv_rows, path)}
        if q_rows == len(self.lengths()) * c.H_q and kv_rows == c.H_kv * sum(self.lengths()):
            return {"d": d}  # the keys' batch fits the rows
        B = q_rows // c.H_q if c.H_q else 0
        if B == 0 or q_rows != B * c.H_q or kv_rows % (c.H_kv * B):
            raise InputsError(f"bench.inputs.path: shapes in '{path}' (q {q.shape}, k {k.shape}) fit no batch of "
                              f"H_q={c.H_q}, H_kv={c.H_kv} (q needs B·H_q rows, k and v H_kv·B·S_kv); set "
                              f"bench.H_q and bench.H_kv (+model=NAME), or store the sequence lengths in the "
                              f"file as an integer array 'S_kv'")
        return {"d": d, "S_kv": kv_rows // (c.H_kv * B), "batch": B}

    @staticmethod
    def _batch_from_lengths(lengths, q_rows: int, kv_rows: int, path: str) -> dict:
        """``S_kv``, ``batch``, ``H_q``, ``H_kv`` from a file's sequence lengths and rows."""
        n = np.asarray(lengths)
        if not np.issubdtype(n.dtype, np.integer) or n.ndim > 1 or n.size == 0 or (n < 0).any():
            raise InputsError(f"bench.inputs.path: '{path}' S_kv must be the sequence lengths, integers >= 0 "
                              f"(one per sequence), got {n!r}")
        L = [int(x) for x in n.reshape(-1)]
        B, total = len(L), sum(L)
        H_q = q_rows // B
        H_kv = kv_rows // total if total else 0
        if q_rows != B * H_q or H_q == 0 or (total and (kv_rows != H_kv * total or H_kv == 0)) \
                or (not total and kv_rows) or (H_kv and H_q % H_kv):
            raise InputsError(f"bench.inputs.path: shapes in '{path}' (q rows {q_rows}, k rows {kv_rows}) do not "
                              f"fit its S_kv {L}: need q B·H_q rows and k, v H_kv·ΣS_kv rows, H_kv dividing H_q")
        shape = {"S_kv": L[0], "batch": B} if len(set(L)) == 1 else {"S_kv": L}
        shape["H_q"] = H_q
        if total:  # a batch of empty sequences has no k rows to tell H_kv by
            shape["H_kv"] = H_kv
        return shape

    def accept_file(self, arrays: dict, path: str) -> dict:
        out = super().accept_file(arrays, path)  # Workload's: float64 q, k, v
        file_scale = read_scale(arrays, path)
        if file_scale is not None:
            out["scale"] = file_scale
        out["scale"] = self.scale(out)
        return out

    def check_inputs(self, data_dtype: str, inputs: dict) -> None:
        """Scores ``q·kᵀ·scale`` must fit the accumulator (:func:`check_scores`)."""
        check_scores(data_dtype, inputs["q"], inputs["k"], inputs["scale"])

    # ---- the run ---------------------------------------------------------------------
    def progress_stream(self) -> tuple[str, int]:
        return "k", int(self.cfg.tile)

    def heads_shape(self) -> dict:
        """The batch's part of ``metrics.json`` ``shape``."""
        c = self.cfg
        return {"model": c.model, "B": len(self.lengths()), "H_q": c.H_q, "H_kv": c.H_kv, "G": self.G,
                "d": c.d, "S_kv": _plain(c.S_kv), "tile": int(c.tile), "inner": c.inner}

    def extra_metrics(self, inputs: dict | None) -> dict:
        return {"scale": self.scale(inputs)}

    def saved_scalars(self, inputs: dict) -> dict:
        return {"scale": np.float64(self.scale(inputs))}

    def reference(self, inputs: dict) -> dict:
        """float64 attention per item (:func:`reference`; zeros for an empty sequence)."""
        q, k, v, scale = inputs["q"], inputs["k"], inputs["v"], self.scale(inputs)
        out = np.zeros((q.shape[0], q.shape[1]))
        for b, h in self.items():
            q0, q1 = self.q_rows(b, h)
            k0, k1 = self.kv_rows(b, h)
            out[q0:q1] = reference(q[q0:q1], k[k0:k1], v[k0:k1], scale)
        return {"out": out}


def _plain(x):
    """A config value as plain Python (a ListConfig as a list)."""
    return OmegaConf.to_container(x) if OmegaConf.is_list(x) else x
