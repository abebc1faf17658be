"""The MATH micro-op registry: numeric meaning vs float64 numpy and shape rules."""
import numpy as np
import pytest

from kbframe.ir import micro_ops


@pytest.fixture
def xs():
    r = np.random.default_rng(5)
    return r.standard_normal((8, 64)), r.standard_normal((8, 1)), r.standard_normal((8, 1))


def test_reductions_keep_axis(xs):
    s, _, _ = xs
    np.testing.assert_array_equal(micro_ops.apply("rmax", [s], {}), s.max(axis=1)[:, None])
    np.testing.assert_allclose(micro_ops.apply("rsum", [s], {}), s.sum(axis=1)[:, None], rtol=1e-15)
    assert micro_ops.get("rmax").shape((8, 64)) == (8, 1)


def test_binary_and_ternary_ops(xs):
    s, m, l = xs
    np.testing.assert_array_equal(micro_ops.apply("max_elem", [m, l], {}), np.maximum(m, l))
    np.testing.assert_array_equal(micro_ops.apply("exp_diff", [s, m], {}), np.exp(s - m))
    np.testing.assert_array_equal(micro_ops.apply("mul_bcast", [s, m], {}), s * m)
    np.testing.assert_array_equal(micro_ops.apply("div_bcast", [s, m], {}), s / m)
    np.testing.assert_array_equal(micro_ops.apply("add", [s, s], {}), 2 * s)
    np.testing.assert_array_equal(micro_ops.apply("fma", [m, l, m], {}), m * l + m)
    np.testing.assert_array_equal(micro_ops.apply("scale", [s], {"factor": 0.25}), s * 0.25)
    c = micro_ops.apply("copy", [s], {})
    assert c is not s and np.array_equal(c, s)


def test_shape_rules():
    assert micro_ops.get("exp_diff").shape((8, 64), (8, 1)) == (8, 64)
    assert micro_ops.get("fma").shape((8, 1), (8, 1), (8, 1)) == (8, 1)
    with pytest.raises(ValueError, match=r"shapes \(8, 64\) and \(8, 3\) do not broadcast"):
        micro_ops.get("add").shape((8, 64), (8, 3))
    with pytest.raises(ValueError, match="fill has no inputs"):
        micro_ops.get("fill").shape()


def test_unknown_micro_op_lists_known():
    with pytest.raises(KeyError) as e:
        micro_ops.get("softmax")
    assert e.value.args[0] == f"unknown MATH micro-op 'softmax' (known: {', '.join(sorted(micro_ops.MICRO_OPS))})"


def test_softmax_merge_micro_ops_compose_online_softmax():
    """The 8 steps applied with the registry equal one float64 softmax over two tiles."""
    r = np.random.default_rng(9)
    s1, s2 = r.standard_normal((8, 64)) * 10, r.standard_normal((8, 64)) * 10
    v1, v2 = r.standard_normal((64, 16)), r.standard_normal((64, 16))
    A = micro_ops.apply
    m, l, O = np.full((8, 1), -np.inf), np.zeros((8, 1)), np.zeros((8, 16))
    for s, v in ((s1, v1), (s2, v2)):
        m_loc = A("rmax", [s], {})
        m_new = A("max_elem", [m, m_loc], {})
        corr = A("exp_diff", [m, m_new], {})
        P = A("exp_diff", [s, m_new], {})
        l_loc = A("rsum", [P], {})
        l = A("fma", [l, corr, l_loc], {})
        O = A("mul_bcast", [O, corr], {}) + P @ v
        m = A("copy", [m_new], {})
    S, V = np.hstack([s1, s2]), np.vstack([v1, v2])
    p = np.exp(S - S.max(axis=1, keepdims=True))
    np.testing.assert_allclose(O / l, (p / p.sum(axis=1, keepdims=True)) @ V, rtol=1e-12, atol=1e-12)
