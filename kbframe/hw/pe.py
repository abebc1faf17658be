"""A processing element: its units, bound together and found by the roles they serve."""
from __future__ import annotations

from ..errors import ConfigError
from .unit import Unit

#: roles every PE needs a unit for (kbframe.hw.unit module doc)
REQUIRED_ROLES = ("dispatch", "admission", "tcm", "dma_read", "dma_write", "gemm", "math")


class PE:
    """One PE built from its units (instantiated from ``hardware.units``).

    Attributes:
        units: every unit by its config name, in config order.
        by_role: the unit serving each role (the planner's view).
        stage_units: the units that execute stages (:class:`~kbframe.hw.unit.Unit`), by name.
        cpu / scheduler / tcm: the units serving ``dispatch`` / ``admission`` / ``tcm``.

    Args:
        env: the shared SimPy environment.
        index: PE number.
        units: unit objects by config name.
        numerics: the run's :class:`~kbframe.sim.numerics.Numerics`.
        oplog: the run's :class:`~kbframe.sim.oplog.OpLog`.
    Raises:
        ConfigError: a required role has no unit, or two units claim one role.
    """

    def __init__(self, env, index: int, units: dict, numerics, oplog):
        self.env, self.index, self.numerics, self.oplog = env, index, numerics, oplog
        self.steady = None  # the engine's kbframe.sim.steady.Steady, when a run may skip a steady stretch
        self.units = dict(units)
        self.by_role = {}
        for name, unit in self.units.items():
            unit.name = name
            for role in unit.roles:
                if role in self.by_role:
                    raise ConfigError(f"hardware.units.{name} and hardware.units.{self.by_role[role].name} "
                                      f"both serve role '{role}' (one unit per role)")
                self.by_role[role] = unit
        missing = [r for r in REQUIRED_ROLES if r not in self.by_role]
        if missing:
            raise ConfigError(f"hardware.units: no unit serves role(s) {missing} (a PE needs a unit for each of "
                              f"{list(REQUIRED_ROLES)}; a unit declares its roles, e.g. roles: [dma_read])")
        self.cpu = self.by_role["dispatch"]
        self.scheduler = self.by_role["admission"]
        self.tcm = self.by_role["tcm"]
        self.stage_units = {name: u for name, u in self.units.items() if isinstance(u, Unit)}
        self.tcm.pe_index = index
        self.tcm.now = lambda: env.now
        self.cpu.bind(self)
        self.scheduler.bind(self)

    def units_serving(self, *roles: str) -> list:
        """The stage units serving any of ``roles``, in config order."""
        return [u for u in self.stage_units.values() if any(r in u.roles for r in roles)]
