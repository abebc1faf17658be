"""PE_MATH: the vector unit. Latency of one stage is ``ceil(n_elements / vector_width)``
cycles (DDD-0065 §5.3), whatever its op kind. Reductions' log-depth tails are not
modelled (the seeds' stated approximation)."""
from __future__ import annotations

from ..timebase import cycles_to_ps
from .params import at_least_one, positive
from .unit import Stage, Unit


class MathUnit(Unit):
    """Vector unit.

    Args:
        vector_width: elements processed per cycle.
        clock_ghz: clock of the unit, GHz.
    Raises:
        ValueError: non-positive width or clock.
    """

    roles = ("math",)
    label = "MATH"

    def __init__(self, vector_width: int, clock_ghz: float, description: str = "", roles=None, label=None):
        super().__init__(description, roles, label)
        at_least_one("vector_width", vector_width)
        positive("clock_ghz", clock_ghz)
        self.vector_width = int(vector_width)
        self.clock_ghz = float(clock_ghz)
        self._cache: dict = {}

    def cycles(self, n_elements: int) -> int:
        return -(-n_elements // self.vector_width)

    def duration_ps(self, stage: Stage) -> int:
        n = stage.n_elements
        ps = self._cache.get(n)
        if ps is None:
            ps = self._cache[n] = cycles_to_ps(self.cycles(n), self.clock_ghz)
        return ps
