"""PE_MATH: the vector unit. Latency of one stage is ``ceil(n_elements / vector_width)``
cycles (DDD-0065 §5.3), whatever its op kind. Reductions' log-depth tails are not
modelled (the seeds' stated approximation).

Its energy (DESIGN.md decision 15) is per element-op and does depend on the kind: an
exponential costs more than an add. :data:`ENERGY_CLASS` gives each MATH micro-op of
kbframe.ir.micro_ops its class, and each class is a key of ``energy.math``."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..timebase import cycles_to_ps
from ..params import param
from .unit import Stage, Unit


@dataclass
class MathParams:
    """The vector unit's parameters."""

    vector_width: int = param(doc="elements processed per cycle", unit="elements", lo=1)
    clock_ghz: float = param(doc="clock of the unit", unit="GHz", lo=0, lo_open=True)


#: the energy class of each MATH micro-op (``energy.math.<class>_pj_per_op``): ``add`` (adds,
#: compares, copies, reductions by add or max), ``mul`` (one multiply), ``fma`` (a multiply
#: and an add per element), ``exp`` (an exponential or tanh), ``div`` (a divide or rsqrt)
ENERGY_CLASS = {
    "rmax": "add", "rsum": "add", "max_elem": "add", "add": "add", "copy": "add", "fill": "add",
    "rmean": "add", "bias": "add", "relu": "add", "clamp": "add",
    "mul_bcast": "mul", "scale": "mul", "dequant": "mul",
    "fma": "fma", "rope": "fma",
    "exp_diff": "exp", "sigmoid": "exp", "gelu": "exp", "silu": "exp",
    "div_bcast": "div", "rsqrt": "div",
}


class MathUnit(Unit):
    """Vector unit; its parameters: :class:`MathParams` (kbframe.hw.unit.PeUnit)."""

    Params = MathParams

    roles = ("math",)
    label = "MATH"
    energy_keys = ("add_pj_per_op", "mul_pj_per_op", "fma_pj_per_op", "exp_pj_per_op", "div_pj_per_op")

    def energy_actions(self, work) -> list:
        """Its element-ops by class (:data:`ENERGY_CLASS`), in class order.

        Raises:
            ConfigError: a micro-op with no energy class (named).
        """
        return math_actions(self, work)

    def tcm_traffic(self, work) -> tuple:
        """Its operands' bytes read (a stage's bytes: operands, and the result region of an
        op that updates in place) and its results written (elements × the dtype's size)."""
        return work.bytes, sum(n for _, n in work.kinds.values()) * work.itemsize

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._cache: dict = {}

    def cycles(self, n_elements: int) -> int:
        return -(-n_elements // self.vector_width)

    def duration_ps(self, stage: Stage) -> int:
        n = stage.n_elements
        ps = self._cache.get(n)
        if ps is None:
            ps = self._cache[n] = cycles_to_ps(self.cycles(n), self.clock_ghz)
        return ps


def math_actions(unit, work) -> list:
    """The element-ops of a vector unit's records by :data:`ENERGY_CLASS` (a vector unit of
    another type may reuse this rule with :attr:`MathUnit.energy_keys`).

    Raises:
        ConfigError: a micro-op with no energy class, named with the unit.
    """
    per = {}
    for kind, (_, n) in sorted(work.kinds.items()):
        cls = ENERGY_CLASS.get(kind)
        if cls is None:
            raise ConfigError(f"hardware.units.{unit.name}: {unit.label} performs micro-op '{kind}' but has no "
                              f"energy rule for it (kbframe.hw.pe_math.ENERGY_CLASS gives each micro-op its class)")
        per[cls] = per.get(cls, 0) + n
    order = [k[:-len("_pj_per_op")] for k in MathUnit.energy_keys]
    return [(f"{c}_ops", f"{c}_pj_per_op", per[c]) for c in order if c in per]
