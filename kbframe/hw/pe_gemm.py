"""PE_GEMM: the matrix unit. Latency of one GEMM stage is the larger of its compute time
at peak (``2·m·n·k / peak``) and the time to read its operands from TCM, plus a fixed
pipeline latency. The model never looks at the op kind (ADR-0065 D7)."""
from __future__ import annotations

from dataclasses import dataclass

from ..timebase import bytes_to_ps, flops_to_ps, ns_to_ps
from ..params import duration, param
from .unit import Stage, Unit


@dataclass
class GemmParams:
    """The matrix unit's parameters."""

    peak_tflops: float = param(doc="peak throughput (= 1000 flop/ns)", unit="TFLOP/s", lo=0, lo_open=True)
    operand_read_gbps: float = param(doc="TCM read bandwidth feeding the operands", unit="GB/s", lo=0, lo_open=True)
    pipeline_latency_ns: float = duration(0.0, doc="fixed fill/drain latency per stage")
    tile_m: int = param(128, doc="tile shape of the GEMM tile loop, rows", unit="elements", lo=1)
    tile_n: int = param(128, doc="tile shape of the GEMM tile loop, columns", unit="elements", lo=1)
    tile_k: int = param(128, doc="tile shape of the GEMM tile loop, reduction", unit="elements", lo=1)


class GemmUnit(Unit):
    """Matrix unit; its parameters: :class:`GemmParams` (kbframe.hw.unit.PeUnit)."""

    Params = GemmParams

    roles = ("gemm",)
    label = "GEMM"
    energy_keys = ("float16_pj_per_mac", "bfloat16_pj_per_mac", "float32_pj_per_mac", "float64_pj_per_mac")

    def energy_actions(self, work) -> list:
        """Its multiply-accumulates (``flops / 2``) at the run's dtype (``bench.dtype``)."""
        return [("macs", f"{work.dtype}_pj_per_mac", work.flops // 2)]

    def tcm_traffic(self, work) -> tuple:
        """The operand bytes its stages read (the accumulator stays in the unit; its
        write-back is the DMA write's read, or in place in TCM, not counted: an
        approximation)."""
        return work.bytes, 0

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.pipeline_ps = ns_to_ps(self.pipeline_latency_ns)
        self._cache: dict = {}  # (flops, nbytes) -> ps: a kernel repeats a few GEMM shapes

    def duration_ps(self, stage: Stage) -> int:
        key = (stage.flops, stage.nbytes)
        ps = self._cache.get(key)
        if ps is None:
            compute = flops_to_ps(stage.flops, self.peak_tflops)
            feed = bytes_to_ps(stage.nbytes, self.operand_read_gbps)
            ps = self._cache[key] = self.pipeline_ps + (compute if compute > feed else feed)
        return ps
