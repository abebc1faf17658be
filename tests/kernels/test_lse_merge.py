"""The lse_merge recipe (recipes/lse_merge.yaml) on one PE: two partials of one
head, computed on the same PE by the opt2/opt3 inner loops over two key ranges, merged by
``tl.composite(op=None, prologue=[lse_merge])``, equal the whole head's float64 reference;
merging an empty partial (m = −inf, l = 0, O = 0) on either side, or both, is the identity
and never makes NaN."""
import math

import numpy as np
import pytest

from conftest import Sim, emit, ref64
from kbframe.kernels.attention import LSE_FLOOR, PARTIALS, empty_partial, lse_floor, merge

G, D, TILE = 4, 16, 8


def _inputs(rng, S, peak=3.0):
    q = (rng.standard_normal((G, D)) * peak / math.sqrt(math.sqrt(D))).astype(np.float32)
    k = rng.standard_normal((S, D)).astype(np.float32)
    v = rng.standard_normal((S, D)).astype(np.float32)
    return q, k, v


def _run_split(tmp_path, rng, inner, S, cut, data=True):
    """Partials over keys [0, cut) and [cut, S) on PE 0, merged, normalised into `out`."""
    q, k, v = _inputs(rng, S)
    sim = Sim(tmp_path, {"q": q, "k": k, "v": v, "out": np.zeros((G, D))}, data=data)
    sc = 1.0 / math.sqrt(D)
    got = {}

    def kernel(tl):
        qh, kh, vh = tl.ref("q"), tl.ref("k"), tl.ref("v")
        part = PARTIALS[inner]
        halves = [(0, cut), (cut, S)]
        states = []
        for a, b in halves:
            win = (kh[a:b], vh[a:b]) if b > a else (None, None)
            states.append(part(tl, qh, *win, G=G, d=D, S_kv=b - a, tile=TILE, scale=sc))
        floor = lse_floor(tl)
        merge(tl, states[0], states[1], floor)
        m, l, O = states[0]
        got.update(m=m, l=l, O=O)
        tl.store(tl.ref("out"), tl.div_bcast(O, l))

    recs = sim.run(kernel)
    return sim, recs, got, (q, k, v, sc)


@pytest.mark.parametrize("inner", ["opt2", "opt3"])
@pytest.mark.parametrize("S, cut", [(40, 17), (40, 8), (9, 1), (2, 1)])
def test_two_partials_merged_match_the_whole_head(tmp_path, rng, inner, S, cut):
    sim, recs, got, (q, k, v, sc) = _run_split(tmp_path, rng, inner, S, cut)
    ref = ref64(q, k, v, sc)
    out = sim.read(sim.engine.hbm["out"])
    assert np.abs(out - ref).max() <= 1e-5
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * sc
    np.testing.assert_allclose(sim.read(got["m"])[:, 0], s.max(axis=1), rtol=1e-6)  # m = the global max
    np.testing.assert_allclose(sim.read(got["l"])[:, 0], np.exp(s - s.max(axis=1, keepdims=True)).sum(axis=1),
                               rtol=1e-5)


def _merge_only(tmp_path, left_empty, right_empty, rng):
    """Merge two given states (each a real random partial or the identity) on PE 0."""
    part = {"m": rng.standard_normal((G, 1)) * 3, "l": rng.uniform(0.5, 4, (G, 1)),
            "O": rng.standard_normal((G, D))}
    sim = Sim(tmp_path, {f"p{k}": v for k, v in part.items()}, data=True)  # the real partial, in HBM
    handles = {}

    def state(tl, empty, tag):
        if empty:
            return empty_partial(tl, G, D)
        return tuple(tl.load(tl.ref(f"p{k}")) for k in ("m", "l", "O"))

    def kernel(tl):
        a = state(tl, left_empty, "a")
        b = state(tl, right_empty, "b")
        merge(tl, a, b, lse_floor(tl))
        handles["a"] = a

    sim.run(kernel)
    return [sim.read(h) for h in handles["a"]], part


@pytest.mark.parametrize("left_empty, right_empty", [(True, False), (False, True), (True, True)])
def test_merging_an_empty_partial_is_the_identity(tmp_path, rng, left_empty, right_empty):
    (m, l, O), part = _merge_only(tmp_path, left_empty, right_empty, rng)
    if left_empty and right_empty:  # both empty: still the identity, exactly, no NaN
        assert np.all(m == -np.inf) and np.all(l == 0) and np.all(O == 0)
    else:  # the real side survives unchanged (w = 1 on it, e^(−inf − M) = 0 on the other)
        np.testing.assert_array_equal(m, part["m"].astype(np.float32))
        np.testing.assert_array_equal(l, part["l"].astype(np.float32))
        np.testing.assert_array_equal(O, part["O"].astype(np.float32))


def test_lse_floor_is_float32s_most_negative_finite():
    assert LSE_FLOOR == float(np.finfo(np.float32).min)


def test_merge_is_one_composite_of_the_recipes_ops(tmp_path):
    """The merge composite: the recipe's 9 micro-ops in order, rw_handles (m, l, O), no GEMM,
    298 logical bytes (DDD-0065 §4 formulas), under the default cap of 1024."""
    def kernel(tl):
        a, b = empty_partial(tl, G, D), empty_partial(tl, G, D)
        merge(tl, a, b, lse_floor(tl))

    cmds, _ = emit(kernel, tmp_path)
    c = cmds[-1]
    assert [op.kind for op in c.ops] == ["max_elem", "max_elem", "exp_diff", "exp_diff", "mul_bcast", "fma",
                                         "mul_bcast", "fma", "copy"]
    assert [h.name for h in c.rw_handles] == ["m", "l", "O"]
    assert c.logical_bytes == 298
