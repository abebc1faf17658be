"""PE_GEMM: the matrix unit. Latency of one GEMM stage is the larger of its compute time
at peak (``2·m·n·k / peak``) and the time to read its operands from TCM, plus a fixed
pipeline latency. The model never looks at the op kind (ADR-0065 D7)."""
from __future__ import annotations

from ..timebase import bytes_to_ps, flops_to_ps, ns_to_ps
from .params import at_least_one, duration_ns, positive
from .unit import Stage, Unit


class GemmUnit(Unit):
    """Matrix unit.

    Args:
        peak_tflops: peak throughput, TFLOP/s (= 1000 flop/ns).
        operand_read_gbps: TCM read bandwidth feeding the operands, GB/s.
        pipeline_latency_ns: fixed fill/drain latency per stage, ns.
        tile_m / tile_n / tile_k: tile shape of the GEMM tile loop (elements).
    Raises:
        ValueError: a non-positive rate or tile size.
    """

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

    def __init__(self, peak_tflops: float, operand_read_gbps: float, pipeline_latency_ns: float = 0.0,
                 tile_m: int = 128, tile_n: int = 128, tile_k: int = 128, description: str = "",
                 roles=None, label=None):
        super().__init__(description, roles, label)
        positive("peak_tflops", peak_tflops)
        positive("operand_read_gbps", operand_read_gbps)
        duration_ns("pipeline_latency_ns", pipeline_latency_ns)
        for key, val in (("tile_m", tile_m), ("tile_n", tile_n), ("tile_k", tile_k)):
            at_least_one(key, val)
        self.peak_tflops = float(peak_tflops)
        self.operand_read_gbps = float(operand_read_gbps)
        self.pipeline_ps = ns_to_ps(pipeline_latency_ns)
        self.tile_m, self.tile_n, self.tile_k = int(tile_m), int(tile_n), int(tile_k)
        self._cache: dict = {}  # (flops, nbytes) -> ps: a kernel repeats a few GEMM shapes

    def duration_ps(self, stage: Stage) -> int:
        key = (stage.flops, stage.nbytes)
        ps = self._cache.get(key)
        if ps is None:
            compute = flops_to_ps(stage.flops, self.peak_tflops)
            feed = bytes_to_ps(stage.nbytes, self.operand_read_gbps)
            ps = self._cache[key] = self.pipeline_ps + (compute if compute > feed else feed)
        return ps
