"""The MATH micro-op registry: the living definition of every MATH op kind.

Each entry gives the op's input slots, its numeric meaning (numpy, applied in data mode
when the stage completes) and its shape rule. Recipes (DESIGN.md decision 5) and the tl
layer name ops from here; PE_MATH's latency model never looks at the kind.

Shapes are 2-D: row vectors such as the online-softmax state ``m``, ``l`` are ``(rows, 1)``,
so reductions keep the reduced axis (keepdims) and broadcast against ``(rows, TILE)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class MicroOp:
    """One MATH op kind.

    Attributes:
        slots: input slot names in order (``("src",)``, ``("src_a", "src_b")``...).
        fn: ``fn(*inputs, **extra) -> ndarray``; the numeric meaning.
        shape: ``shape(*input_shapes) -> out shape``; raises ValueError if incompatible.
        extras: names of required scalar extras (``("factor",)``).
    """

    slots: tuple
    fn: Callable
    shape: Callable
    extras: tuple = ()


def _bcast(*shapes):
    try:
        return _bcast_tuples(*shapes)
    except TypeError:  # a shape given as a list: not hashable, so not cached
        return _bcast_tuples.__wrapped__(*shapes)


@lru_cache(maxsize=1024)  # kernels ask for the same few shapes every KV tile
def _bcast_tuples(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def _reduce(shape):
    return (*shape[:-1], 1)


def _same(shape):
    return tuple(shape)


def _fill_shape():
    raise ValueError("fill has no inputs; its shape comes from its out handle")


def _exp_diff(a, b):
    return np.exp(a - b)


def _gelu(x):
    """GELU, tanh form (as GPU epilogues compute it): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):
    """SiLU (Llama's FFN activation): x·sigmoid(x), the sigmoid as 0.5·(1 + tanh(x/2)),
    which never overflows."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def _rope_shape(x, pos):
    if len(x) != 2 or tuple(pos) != (x[0], 1):
        raise ValueError(f"rope takes x (rows, cols) and pos (rows, 1), got {tuple(x)} and {tuple(pos)}")
    return tuple(x)


def _rope(x, pos, theta, head_dim, rotary_cols):
    """Rotary position embedding, rotate-half form (Hugging Face ``LlamaRotaryEmbedding`` /
    ``apply_rotary_pos_emb``) on the first ``rotary_cols`` columns of ``x (rows, cols)``, in
    heads of ``head_dim``; the rest (v) is passed through. Row r is at position ``pos[r]``:
    ``inv_freq_i = theta^(−2i/d)``, angle ``pos·inv_freq`` repeated over both halves,
    ``x·cos + rotate_half(x)·sin`` with ``rotate_half([x1, x2]) = [−x2, x1]``. The angles,
    cos and sin are made in float64 from the integer positions (a cos/sin table of the
    positions, exact to the storage dtype), the rotation at the MATH dtype."""
    d, n = int(head_dim), int(rotary_cols)
    half = d // 2
    inv_freq = float(theta) ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.asarray(pos, dtype=np.float64).reshape(-1, 1) * inv_freq
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1).astype(x.dtype)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1).astype(x.dtype)[:, None, :]
    out = np.array(x, copy=True)
    r = x[:, :n].reshape(x.shape[0], n // d, d)
    rot = np.concatenate([-r[..., half:], r[..., :half]], axis=-1)
    out[:, :n] = (r * cos + rot * sin).reshape(x.shape[0], n)
    return out


MICRO_OPS: dict[str, MicroOp] = {
    # the ndarray methods: the same reductions as np.max / np.sum, without their wrapper
    "rmax": MicroOp(("src",), lambda x: x.max(axis=-1, keepdims=True), _reduce),
    "rsum": MicroOp(("src",), lambda x: x.sum(axis=-1, keepdims=True), _reduce),
    "max_elem": MicroOp(("src_a", "src_b"), np.maximum, _bcast),
    "exp_diff": MicroOp(("src_a", "src_b"), _exp_diff, _bcast),
    "mul_bcast": MicroOp(("src_a", "src_b"), np.multiply, _bcast),
    "div_bcast": MicroOp(("src_a", "src_b"), np.divide, _bcast),
    "add": MicroOp(("src_a", "src_b"), np.add, _bcast),
    "fma": MicroOp(("src_a", "src_b", "src_c"), lambda a, b, c: a * b + c, _bcast),
    "copy": MicroOp(("src",), lambda x: x.copy(), _same),
    "scale": MicroOp(("src",), lambda x, factor: x * factor, _same, ("factor",)),
    "fill": MicroOp((), None, _fill_shape, ("value",)),
    # RMSNorm (recipes/rmsnorm.yaml): mean of the last axis and the reciprocal square root
    "rmean": MicroOp(("src",), lambda x: x.mean(axis=-1, keepdims=True), _reduce),
    "rsqrt": MicroOp(("src",), lambda x: 1.0 / np.sqrt(x), _same),
    # GEMM epilogues of the predecessor's harness (ADR-0044)
    "bias": MicroOp(("src_a", "src_b"), np.add, _bcast),
    "relu": MicroOp(("src",), lambda x: np.maximum(x, 0.0), _same),
    "gelu": MicroOp(("src",), _gelu, _same),
    "sigmoid": MicroOp(("src",), _sigmoid, _same),
    "clamp": MicroOp(("src",), lambda x, lo, hi: np.clip(x, lo, hi), _same, ("lo", "hi")),
    "dequant": MicroOp(("src",), lambda x, scale: x * scale, _same, ("scale",)),
    # the decoder layer (kbframe/kernels/decoder_layer.py; recipes/swiglu.yaml)
    "silu": MicroOp(("src",), _silu, _same),
    "rope": MicroOp(("src", "pos"), _rope, _rope_shape, ("theta", "head_dim", "rotary_cols")),
}

#: epilogue ops apply to the GEMM accumulator: ``acc = fn(acc, *operands)``; the
#: accumulator fills the op's first slot, named operands fill the rest.
EPILOGUE_OPERANDS = {"scale": (), "add": ("other",), "mul_bcast": ("other",),
                     "div_bcast": ("other",), "bias": ("bias",), "relu": (), "gelu": (), "sigmoid": (),
                     "clamp": (), "dequant": (), "rope": ("pos",)}

#: an epilogue's scope when its entry names none: ``dequant`` scales each K tile's partial
#: product (per-K-block quantisation scales), ``rope`` rotates whole heads of the finished
#: output (after the tile loop: an output tile may split a head), every other op the
#: finished output tile
EPILOGUE_DEFAULT_SCOPE = {"dequant": "k_tile", "rope": "kernel"}


def get(kind: str) -> MicroOp:
    """The registry entry for ``kind``; KeyError lists the known kinds."""
    try:
        return MICRO_OPS[kind]
    except KeyError:
        raise KeyError(f"unknown MATH micro-op '{kind}' (known: {', '.join(sorted(MICRO_OPS))})") from None


def apply(kind: str, inputs: list, extra: dict) -> np.ndarray:
    """Numeric effect of MATH op ``kind`` on numpy ``inputs`` with scalar ``extra``."""
    op = MICRO_OPS[kind]
    kw = {k: extra[k] for k in op.extras}
    return op.fn(*inputs, **kw)
