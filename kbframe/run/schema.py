"""Structured config schemas (Hydra ConfigStore). Every yaml in ``conf/`` extends one of
these, so a wrong type, an unknown key (also one added with ``+``) or a missing required
value fails at composition, naming the key, before any simulation starts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class CalibrationConfig:
    """Dispatch cost model (ADR-0064 Rev2): PE_CPU cycles per command = FIXED + R × bytes."""

    FIXED: float = 40.0  # cycles per command
    R: float = 0.0625  # cycles per logical byte (16 B/cycle)
    cap_bytes: int = 1024  # largest composite, logical bytes (ADR-0064 D7)


@dataclass
class HardwareConfig:
    """PE topology; ``units`` maps a port name to ``{_target_: kbframe..., params}``."""

    name: str = MISSING
    n_pes: int = 1
    clock_ghz: float = 1.0
    hbm_gbps: float = 204.8
    hbm_bytes: int = 64 * 1024**3  # HBM capacity shared by the PEs, bytes (pre-flight check)
    tcm_bytes: int = 16 * 1024 * 1024
    allow_external_targets: bool = False
    pes_per_cube: int = 8  # PEs sharing one cube's HBM and NoC
    cubes_x: int = 1  # cubes per row of the mesh (PE i is in cube i // pes_per_cube, row by row)
    cubes_y: int = 1
    cube_fabric: str = "mesh"  # mesh: die-to-die links, XY routing; switch: any two cubes one crossing apart
    hbm_mode: str = "partitioned"  # partitioned: each PE owns its channels; shared: a cube's PEs contend
    hbm_arbitration: str = "submission"  # shared HBM: submission | arrival order (kbframe.hw.hbm)
    cube_hbm_gbps: float = 1638.4  # a cube's HBM bandwidth in shared mode (64 channels × 32 GB/s × 0.8)
    units: Dict[str, Any] = field(default_factory=dict)


@dataclass
class EnergyConfig:
    """Energy per action and static power (DESIGN.md decision 15; kbframe.run.energy): one
    table per unit role, each ``{<key>: value}`` with the keys the unit serving that role
    declares (``kbframe.hw.unit.PeUnit.energy_keys``, pJ per action) plus ``static_mw``,
    its leakage power in mW. A new role is a field here; a new unit type only declares
    its keys. ``node``: the process node the figures are for."""

    name: str = MISSING
    node: str = MISSING
    dispatch: Dict[str, float] = field(default_factory=dict)
    admission: Dict[str, float] = field(default_factory=dict)
    tcm: Dict[str, float] = field(default_factory=dict)
    dma_read: Dict[str, float] = field(default_factory=dict)
    dma_write: Dict[str, float] = field(default_factory=dict)
    gemm: Dict[str, float] = field(default_factory=dict)
    math: Dict[str, float] = field(default_factory=dict)
    ipcq_send: Dict[str, float] = field(default_factory=dict)
    ipcq_recv: Dict[str, float] = field(default_factory=dict)


@dataclass
class RunConfig:
    """Run options: the sanitizer (``check``), the progress bar, the timeline (``trace``) and
    fast-forward of periodic timing-only runs (``fast_forward``, kbframe.run.fastforward)."""

    check: bool = True
    progress: bool = True
    trace: bool = True  # write trace.json; python -m kbframe.report.trace RUN_DIR makes it later
    fast_forward: str = "on"  # off | on | verify: a periodic timing-only schedule is written, not simulated
    max_records: int = 20_000_000  # op_log records a simulated run may make (checked before it simulates)
    power_track: bool = False  # trace.json gets a power counter track per PE (kbframe.report.trace)


def workload_classes() -> dict:
    """Every workload class in :mod:`kbframe.workloads`, by schema name (its module's name):
    found by walking the package, so a new workload is a new module and nothing else."""
    import importlib
    import pkgutil

    from .. import workloads
    from ..workloads.base import Workload
    found = {}
    for info in pkgutil.iter_modules(workloads.__path__):
        mod = importlib.import_module(f"{workloads.__name__}.{info.name}")
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, Workload) and obj is not Workload and obj.__module__ == mod.__name__:
                found[info.name] = obj
    return found


def register() -> None:
    """Register the schemas in Hydra's ConfigStore: group ``schema`` (hardware,
    calibration, run, energy) and ``schema/workload/<module>`` (each workload's typed bench config,
    which a bench yaml extends: ``defaults: [/schema/workload@_here_: gqa_decode]``)."""
    cs = ConfigStore.instance()
    cs.store(group="schema", name="hardware", node=HardwareConfig)
    cs.store(group="schema", name="calibration", node=CalibrationConfig)
    cs.store(group="schema", name="run", node=RunConfig)
    cs.store(group="schema", name="energy", node=EnergyConfig)
    for name, cls in workload_classes().items():
        cs.store(group="schema/workload", name=name, node=cls.Config)
