"""Integer time base. Simulated time is integer picoseconds; every duration is rounded
once, when it is computed, so sums of stage times are exact and runs bit-reproducible.

Every time is below :data:`MAX_PS` (10^15 ps, 1000 s simulated): there the op_log prints a
time exactly as ns with three decimals and the sanitizer reads it back exactly. A
conversion whose result falls outside ``[0, MAX_PS)`` (or is not a number) raises
:class:`~kbframe.errors.TimeBaseError`; the engine checks each unit's longest stage
against it before a run starts (kbframe.sim.engine).
"""
from .errors import TimeBaseError

PS_PER_NS = 1000
#: exclusive upper bound of every simulated time and duration, ps (10^15 ps = 1000 s)
MAX_PS = 10 ** 15
LIMIT_TEXT = "the time base ends at 10^15 ps (1000 s simulated)"


def _ps(x: float, what: str) -> int:
    if not 0 <= x < MAX_PS:  # also NaN
        raise TimeBaseError(f"{what} takes {x:.4g} ps; {LIMIT_TEXT}")
    return int(round(x))


def ns_to_ps(ns: float) -> int:
    """Nanoseconds → integer picoseconds (rounded half to even, once)."""
    return _ps(ns * PS_PER_NS, f"{ns:.4g} ns")


def cycles_to_ps(cycles: float, clock_ghz: float) -> int:
    """Clock cycles at ``clock_ghz`` → integer picoseconds."""
    return _ps(cycles * PS_PER_NS / clock_ghz, f"{cycles:.6g} cycles at {clock_ghz:.4g} GHz")


def bytes_to_ps(nbytes: int, bandwidth_gbps: float) -> int:
    """Time to move ``nbytes`` at ``bandwidth_gbps`` (GB/s = bytes/ns) → integer ps."""
    return _ps(nbytes * PS_PER_NS / bandwidth_gbps, f"moving {nbytes} B at {bandwidth_gbps:.4g} GB/s")


def flops_to_ps(flops: int, peak_tflops: float) -> int:
    """Time for ``flops`` at ``peak_tflops`` (TFLOP/s = 1000 flop/ns) → integer ps."""
    return _ps(flops / peak_tflops, f"{flops} flop at {peak_tflops:.4g} TFLOP/s")


def ps_to_ns(ps: int) -> float:
    """Integer picoseconds → nanoseconds for reports."""
    return ps / PS_PER_NS
