"""PE_MATH latency: ceil(n_elements / vector_width) cycles, whatever the op kind (DDD §5.3)."""
import pytest

from kbframe.hw.pe_math import MathUnit
from kbframe.hw.unit import Stage


@pytest.mark.parametrize("n, ps", [
    (1, 1_000),        # ceil(1/64) = 1 cycle
    (8, 1_000),        # m, l (G=8, 1): 1 cycle
    (64, 1_000),       # exactly one vector
    (65, 2_000),       # ceil(65/64) = 2
    (512, 8_000),      # S tile (8, 64): 8 cycles
    (1024, 16_000),    # O (8, 128): 16 cycles
    (1025, 17_000),
])
def test_math_ceil_n_over_vector_width(n, ps):
    m = MathUnit(vector_width=64, clock_ghz=1.0)
    assert m.duration_ps(Stage(m, "rmax", None, n_elements=n)) == ps


def test_math_clock_scales_cycles():
    # 1024 elements / 64 = 16 cycles at 2 GHz = 8 ns; at 3 GHz 16/3 ns = 5333.33 → 5333 ps
    assert MathUnit(64, 2.0).duration_ps(Stage(None, "add", None, n_elements=1024)) == 8_000
    assert MathUnit(64, 3.0).duration_ps(Stage(None, "add", None, n_elements=1024)) == 5_333


def test_math_latency_is_op_kind_opaque():
    m = MathUnit(64, 1.0)
    kinds = ["rmax", "exp_diff", "copy", "fma", "a_label_no_registry_knows"]
    assert {m.duration_ps(Stage(m, k, None, n_elements=512)) for k in kinds} == {8_000}


def test_math_rejects_bad_parameters():
    with pytest.raises(ValueError, match="vector_width must be ≥ 1, got 0"):
        MathUnit(0, 1.0)
    with pytest.raises(ValueError, match="clock_ghz must be > 0, got 0"):
        MathUnit(64, 0)
