"""Structured config schemas (Hydra ConfigStore). Every yaml in ``conf/`` extends one of
these, so a wrong type, an unknown key (also one added with ``+``) or a missing required
value fails at composition, naming the key, before any simulation starts."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ..params import Choice, param
from ..sim.engine import MAX_PES
from ..workloads.base import BenchConfig


class HbmMode(Choice):
    """How a cube's PEs reach its HBM (kbframe.hw.hbm)."""

    partitioned = "partitioned"  # each PE owns its channels (hardware.hbm_gbps each)
    shared = "shared"  # a cube's PEs contend for one port (hardware.cube_hbm_gbps)


class HbmArbitration(Choice):
    """The order a shared HBM port serves transfers in (kbframe.hw.hbm)."""

    submission = "submission"
    arrival = "arrival"


class CubeFabric(Choice):
    """How cubes are joined (kbframe.hw.ipcq.Fabric)."""

    mesh = "mesh"  # die-to-die links, XY routing
    switch = "switch"  # any two cubes one crossing apart


@dataclass
class CalibrationConfig:
    """Dispatch cost model (ADR-0064 Rev2): PE_CPU cycles per command = FIXED + R × bytes."""

    FIXED: float = param(40.0, unit="cycles", lo=0, doc="PE_CPU cycles per command, the fixed issue cost (ADR-0064 D1)")
    R: float = param(0.0625, unit="cycles/byte", lo=0, doc="PE_CPU cycles per logical byte (16 B/cycle)")
    cap_bytes: int = param(1024, unit="bytes", lo=1, doc="largest composite, logical bytes; larger is an error "
                                                          "at emit (ADR-0064 D7)")


@dataclass
class HardwareConfig:
    """PE topology; ``units`` maps a port name to ``{_target_: kbframe..., params}`` (each
    unit class declares its own parameters: ``Params``, kbframe.hw.unit.PeUnit)."""

    name: str = MISSING
    n_pes: int = param(1, lo=1, hi=MAX_PES, doc="PEs built by the engine; pes_per_cube × cubes_x × cubes_y")
    clock_ghz: float = param(1.0, unit="GHz", lo=0, lo_open=True, doc="PE clock")
    hbm_gbps: float = param(204.8, unit="GB/s", lo=0, lo_open=True, doc="effective HBM bandwidth per PE")
    hbm_bytes: int = param(64 * 1024**3, unit="bytes", lo=0, lo_open=True,
                           doc="HBM capacity shared by the PEs (a pre-flight check)")
    tcm_bytes: int = param(16 * 1024 * 1024, unit="bytes", lo=0, lo_open=True, doc="TCM per PE")
    allow_external_targets: bool = param(False, doc="allow _target_s outside kbframe.")
    pes_per_cube: int = param(8, lo=1, doc="PEs sharing one cube's HBM and NoC")
    cubes_x: int = param(1, lo=1, doc="cubes per row of the mesh (PE i is in cube i // pes_per_cube, row by row)")
    cubes_y: int = param(1, lo=1, doc="rows of cubes")
    cube_fabric: CubeFabric = param(CubeFabric.mesh, choices=CubeFabric, doc="mesh: die-to-die links, XY routing; switch: any two "
                                                             "cubes one crossing apart")
    hbm_mode: HbmMode = param(HbmMode.partitioned, choices=HbmMode, doc="partitioned: each PE owns its channels; shared: "
                                                              "a cube's PEs contend")
    hbm_arbitration: HbmArbitration = param(HbmArbitration.submission, choices=HbmArbitration,
                                 doc="shared HBM: served in submission or arrival order (kbframe.hw.hbm)")
    cube_hbm_gbps: float = param(1638.4, unit="GB/s", lo=0, lo_open=True,
                                 doc="a cube's HBM bandwidth in shared mode (64 channels × 32 GB/s × 0.8)")
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


class FastForward(Choice):
    """Fast-forward of periodic timing-only runs (kbframe.run.fastforward)."""

    off = "off"
    on = "on"  # a periodic timing-only schedule is written from short copies, not simulated
    verify = "verify"  # written and simulated in full, and compared


class OplogForm(Choice):
    """How a fast-forwarded run writes ``op_log.jsonl`` (kbframe.records: record by record,
    or periodic); a run simulated in full writes it record by record."""

    auto = "auto"  # periodic from kbframe.run.fastforward.PERIODIC_FROM records on
    full = "full"  # record by record
    periodic = "periodic"  # periodic whenever the run was fast-forwarded


@dataclass
class RunConfig:
    """Run options: the sanitizer (``check``), the progress bar, the timeline (``trace``) and
    fast-forward of periodic timing-only runs (``fast_forward``, kbframe.run.fastforward)."""

    check: bool = param(True, doc="run the simulation sanitizer after each run")
    progress: bool = param(True, doc="tqdm progress bar on a terminal")
    trace: bool = param(True, doc="write trace.json (python -m kbframe.report.trace RUN_DIR makes it later)")
    fast_forward: FastForward = param(FastForward.on, choices=FastForward,
                              doc="off | on | verify: a periodic timing-only schedule is written, not simulated")
    max_records: int = param(20_000_000, lo=0, doc="op_log records a run may hold (checked before it "
                                                    "simulates; a model step: its simulated layers'; 0: no limit)")
    power_track: bool = param(False, doc="trace.json gets a power counter track per PE (kbframe.report.trace)")
    oplog: OplogForm = param(OplogForm.auto, choices=OplogForm,
                             doc="auto | full | periodic: a fast-forwarded run's op_log.jsonl record by record, or "
                                 "in periodic form (auto: from 1,000,000 records on; python -m kbframe.report.oplog "
                                 "expands it)")


def declaration(key: str):
    """The :class:`kbframe.params.Spec` declaring a dotted config key (``hardware.hbm_mode``,
    ``bench.v_staging``: BenchConfig's, else the first workload Config declaring it), or None."""
    section, _, name = key.rpartition(".")
    classes = {"run": [RunConfig], "calibration": [CalibrationConfig], "hardware": [HardwareConfig],
               "bench": [BenchConfig, *(c.Config for c in workload_classes().values())]}.get(section, [])
    for cls in classes:
        for f in fields(cls):
            if f.name == name and "param" in f.metadata:
                return f.metadata["param"]
    return None


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
