"""PE_GEMM latency: pipeline + max(compute at peak, operand feed from TCM); op-kind opaque."""
import pytest

from kbframe.hw.pe_gemm import GemmUnit
from kbframe.hw.unit import Stage


def _g(**kw):
    base = dict(peak_tflops=8.0, operand_read_gbps=512.0)
    base.update(kw)
    return GemmUnit(**base)


def test_gemm_feed_bound_decode_tile():
    g = _g()
    # q·K_jᵀ: M=8, K=128, N=64 → flops 2·8·64·128 = 131 072 → /8000 flop/ns = 16.384 ns;
    # operands (8·128 + 128·64)·2 B = 18 432 B / 512 GB/s = 36 ns → feed-bound: 36 ns
    st = Stage(g, "gemm", None, flops=131072, nbytes=18432)
    assert g.duration_ps(st) == 36_000


def test_gemm_compute_bound_square_tile():
    g = _g()
    # 128³: flops 2·128³ = 4 194 304 → 524.288 ns; operands 2·128·128·2 B = 65 536 B → 128 ns
    st = Stage(g, "gemm", None, flops=2 * 128 ** 3, nbytes=65536)
    assert g.duration_ps(st) == 524_288


def test_gemm_pipeline_latency_adds():
    g = _g(pipeline_latency_ns=10.0)
    st = Stage(g, "gemm", None, flops=2 * 128 ** 3, nbytes=65536)
    assert g.duration_ps(st) == 534_288


def test_gemm_latency_ignores_op_kind():
    g = _g()
    a = Stage(g, "gemm", None, flops=131072, nbytes=18432)
    b = Stage(g, "anything_else", None, flops=131072, nbytes=18432)
    assert g.duration_ps(a) == g.duration_ps(b)


def test_gemm_rejects_bad_parameters():
    with pytest.raises(ValueError, match="peak_tflops must be > 0, got 0"):
        _g(peak_tflops=0)
    with pytest.raises(ValueError, match="tile_k must be ≥ 1, got -1"):
        _g(tile_k=-1)
    with pytest.raises(ValueError, match="^pipeline_latency_ns must be ≥ 0, got -5$"):
        _g(pipeline_latency_ns=-5)
    with pytest.raises(ValueError, match="^peak_tflops must be a finite number, got inf$"):
        _g(peak_tflops=float("inf"))
