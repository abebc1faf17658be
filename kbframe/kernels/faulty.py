"""Test fixtures, not workloads: tiny kernels that each break one emit-time rule of
``tl.composite`` (ADR-0065 D6), so the tests can show the error reaching a CLI user as one
line (tests/test_cli.py), e.g.::

    python -m kbframe +bench=decode_opt2 bench.kernel=kbframe.kernels.faulty.auto_bind_conflict

They take the bench kernel signature and use the bench's HBM tensors ``q``, ``k``, ``v``.
"""
from __future__ import annotations


def _state(tl, G: int, d: int, n: int):
    s = tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.ref("k")[0:n].T)
    return s, tl.full((G, 1), float("-inf"), "m"), tl.zeros((G, 1), "l"), tl.zeros((G, d), "O")


def auto_bind_conflict(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float) -> None:
    """An explicit ``a`` together with softmax_merge, whose primary_out P binds to ``a`` (D6.6)."""
    n = min(tile, S_kv)
    s, m, l, O = _state(tl, G, d, n)
    tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}],
                 op="gemm", a=s, b=tl.ref("v")[0:n], out=O)


def hbm_recipe_operand(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float) -> None:
    """An HBM handle (``tl.ref``) as a prologue recipe operand (D6.7)."""
    n = min(tile, S_kv)
    _, m, l, O = _state(tl, G, d, n)
    tl.composite(prologue=[{"op": "softmax_merge", "s": tl.ref("q"), "m": m, "l": l, "O": O}],
                 op="gemm", b=tl.ref("v")[0:n], out=O)


def two_gemms(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float) -> None:
    """Recipe ``pre_gemm`` (operands x, w; supplied by the test's config) contains a GEMM step;
    with the head GEMM that is two GEMMs in one composite (D6.1)."""
    x, w = tl.zeros((G, G), "x"), tl.zeros((G, G), "w")
    tl.composite(prologue=[{"op": "pre_gemm", "x": x, "w": w}], op="gemm", b=tl.zeros((G, d), "b"))
