"""Checks for unit parameters: each raises :class:`ParamError` (a ValueError) naming the
parameter and the limit, which the engine reports with the full key,
``hardware.units.<unit>.<parameter> must be ...``."""
from __future__ import annotations

import math

from ..timebase import MAX_PS, PS_PER_NS


class ParamError(ValueError):
    """A unit parameter out of its range; the message starts with the parameter's name."""


def _number(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ParamError(f"{key} must be a finite number, got {value!r}")
    return value


def positive(key: str, value):
    """``value`` if it is a finite number > 0."""
    if _number(key, value) <= 0:
        raise ParamError(f"{key} must be > 0, got {value}")
    return value


def non_negative(key: str, value):
    """``value`` if it is a finite number ≥ 0."""
    if _number(key, value) < 0:
        raise ParamError(f"{key} must be ≥ 0, got {value}")
    return value


def at_least_one(key: str, value) -> int:
    """``int(value)`` if it is a whole number ≥ 1."""
    if _number(key, value) < 1:
        raise ParamError(f"{key} must be ≥ 1, got {value}")
    if int(value) != value:
        raise ParamError(f"{key} must be a whole number, got {value}")
    return int(value)


def duration_ns(key: str, value):
    """``value`` if it is a finite number of ns ≥ 0 that fits the time base
    (kbframe.timebase.MAX_PS: below 10^12 ns)."""
    non_negative(key, value)
    if value * PS_PER_NS >= MAX_PS:
        raise ParamError(f"{key} must be below {MAX_PS // PS_PER_NS:.0e} ns (the time base ends at 10^15 ps, "
                         f"1000 s simulated), got {value:g}")


def one_of(key: str, value, choices) -> str:
    """``value`` if it is one of ``choices`` (names)."""
    if value not in choices:
        raise ParamError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return value
