"""kbframe.timebase: integer picoseconds, durations rounded once (DESIGN.md "Time")."""
from kbframe import timebase as tb


def test_ns_to_ps_is_integer_and_exact():
    assert tb.ns_to_ps(77.0) == 77_000
    assert tb.ns_to_ps(41.5) == 41_500
    assert isinstance(tb.ns_to_ps(1.25), int)


def test_cycles_to_ps_rounds_once():
    # 42.75 cycles at 1 GHz = 42.75 ns = 42 750 ps
    assert tb.cycles_to_ps(42.75, 1.0) == 42_750
    # 1 cycle at 3 GHz = 333.33… ps → 333 (rounded once); three of them sum exactly to 999
    one = tb.cycles_to_ps(1, 3.0)
    assert one == 333
    assert one + one + one == 999
    # 16 cycles at 2 GHz = 8 ns
    assert tb.cycles_to_ps(16, 2.0) == 8_000


def test_bytes_to_ps_at_hbm_bandwidth():
    # 16 384 B (one 64×128 fp16 K tile) at 204.8 GB/s = 16384 / 204.8 ns = 80 ns
    assert tb.bytes_to_ps(16384, 204.8) == 80_000
    # 2048 B (q, 8×128 fp16) = 10 ns
    assert tb.bytes_to_ps(2048, 204.8) == 10_000
    # 18 432 B at 512 GB/s (TCM read port) = 36 ns
    assert tb.bytes_to_ps(18432, 512.0) == 36_000
    # 1 B at 3 GB/s = 333.33 ps → 333
    assert tb.bytes_to_ps(1, 3.0) == 333


def test_ps_to_ns_for_reports():
    assert tb.ps_to_ns(41_500) == 41.5
    assert tb.ps_to_ns(1) == 0.001


def test_conversions_refuse_what_the_time_base_cannot_hold():
    """Every duration is below MAX_PS (10^15 ps), or a TimeBaseError (a
    ConfigError) says what overflowed; never OverflowError or a silent huge integer."""
    import math

    import pytest
    from kbframe.errors import ConfigError, TimeBaseError
    assert issubclass(TimeBaseError, ConfigError)
    assert tb.ns_to_ps(999_999_999_999.999) == tb.MAX_PS - 1
    assert tb.flops_to_ps(16_000, 8.0) == 2_000
    for call, text in [(lambda: tb.ns_to_ps(1e12), "1e+12 ns takes 1e+15 ps"),
                       (lambda: tb.ns_to_ps(math.nan), "nan ns takes nan ps"),
                       (lambda: tb.ns_to_ps(-1.0), "-1 ns takes -1000 ps"),
                       (lambda: tb.cycles_to_ps(1e306, 1.0), "1e+306 cycles at 1 GHz takes inf ps"),
                       (lambda: tb.bytes_to_ps(1, 1e-300), "moving 1 B at 1e-300 GB/s takes 1e+303 ps"),
                       (lambda: tb.flops_to_ps(10, 1e-15), "10 flop at 1e-15 TFLOP/s takes 1e+16 ps")]:
        with pytest.raises(TimeBaseError) as e:
            call()
        assert str(e.value) == f"{text}; the time base ends at 10^15 ps (1000 s simulated)"
