"""Integer time base. Simulated time is integer picoseconds; every duration is rounded
once, when it is computed, so sums of stage times are exact and runs bit-reproducible."""

PS_PER_NS = 1000


def ns_to_ps(ns: float) -> int:
    """Nanoseconds → integer picoseconds (rounded half to even, once)."""
    return int(round(ns * PS_PER_NS))


def cycles_to_ps(cycles: float, clock_ghz: float) -> int:
    """Clock cycles at ``clock_ghz`` → integer picoseconds."""
    return int(round(cycles * PS_PER_NS / clock_ghz))


def bytes_to_ps(nbytes: int, bandwidth_gbps: float) -> int:
    """Time to move ``nbytes`` at ``bandwidth_gbps`` (GB/s = bytes/ns) → integer ps."""
    return int(round(nbytes * PS_PER_NS / bandwidth_gbps))


def ps_to_ns(ps: int) -> float:
    """Integer picoseconds → nanoseconds for reports."""
    return ps / PS_PER_NS
