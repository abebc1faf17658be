"""A processing element: PE_CPU, PE_SCHEDULER, TCM and the stage units, bound together."""
from __future__ import annotations

from ..errors import ConfigError

REQUIRED_UNITS = ("cpu", "scheduler", "tcm", "dma_read", "dma_write", "gemm", "math")


class PE:
    """One PE built from its units (instantiated from ``hardware.units``).

    Args:
        env: the shared SimPy environment.
        index: PE number.
        units: unit objects by port name; must hold every name in ``REQUIRED_UNITS``.
        numerics: the run's :class:`~kbframe.sim.numerics.Numerics`.
        oplog: the run's :class:`~kbframe.sim.oplog.OpLog`.
    Raises:
        ConfigError: a required unit is missing.
    """

    def __init__(self, env, index: int, units: dict, numerics, oplog):
        missing = [u for u in REQUIRED_UNITS if u not in units]
        if missing:
            raise ConfigError(f"hardware.units is missing {missing} (a PE needs {list(REQUIRED_UNITS)})")
        self.env, self.index, self.numerics, self.oplog = env, index, numerics, oplog
        units = dict(units)
        self.cpu = units.pop("cpu")
        self.scheduler = units.pop("scheduler")
        self.tcm = units.pop("tcm")
        self.stage_units = units
        for name, unit in units.items():
            unit.name = name
        self.tcm.pe_index = index
        self.tcm.now = lambda: env.now
        self.cpu.bind(self)
        self.scheduler.bind(self)
