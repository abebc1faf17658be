"""Structured config schemas (Hydra ConfigStore). Every yaml in ``conf/`` extends one of
these, so a wrong type, an unknown key (also one added with ``+``) or a missing required
value fails at composition, naming the key, before any simulation starts."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

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
    units: Dict[str, Any] = field(default_factory=dict)


@dataclass
class InputsConfig:
    """Where inputs come from: ``path`` to an .npz with q, k, v (and optional 0-d scale),
    else generated from ``bench.seed`` with score spread ``peak`` (std of q·kᵀ·scale)."""

    path: Optional[str] = None
    peak: float = 1.0


@dataclass
class BenchConfig:
    """A bench: which kernel, on which shapes, in which mode."""

    name: str = MISSING
    kernel: str = MISSING  # dotted path of a kernel function under kbframe.
    G: int = 8  # query heads per KV head
    d: int = 128  # head dim
    S_kv: int = 4096  # keys
    tile: int = 64  # keys per KV tile (TILE)
    dtype: str = "float16"  # timing dtype: bytes moved and TCM footprint
    data: bool = True  # data mode: compute real numbers and check them
    data_dtype: str = "float32"  # storage dtype of the numbers in data mode
    scale: Optional[float] = None  # softmax scale; None → 1/sqrt(d)
    seed: int = 0
    pe: int = 0  # PE the kernel runs on
    inputs: InputsConfig = field(default_factory=InputsConfig)


@dataclass
class RunConfig:
    """Run options: the sanitizer (``check``), the progress bar and the timeline (``trace``)."""

    check: bool = True
    progress: bool = True
    trace: bool = True  # write trace.json; python -m kbframe.report.trace RUN_DIR makes it later


def register() -> None:
    """Register the schemas in Hydra's ConfigStore (group ``schema``)."""
    cs = ConfigStore.instance()
    cs.store(group="schema", name="hardware", node=HardwareConfig)
    cs.store(group="schema", name="calibration", node=CalibrationConfig)
    cs.store(group="schema", name="bench", node=BenchConfig)
    cs.store(group="schema", name="run", node=RunConfig)
