"""The rmsnorm_linear workload: RMSNorm as a YAML prologue recipe ahead of a GEMM that
streams W, against an independent float64 reference, at Llama-3-8B's hidden size."""
import numpy as np
import pytest

from conftest import load_out, read_oplog, run


@pytest.mark.parametrize("T", [1, 8, 128])
def test_rmsnorm_linear_matches_float64(tmp_path, T):
    m = run(tmp_path, f"bench.T={T}", "bench.N=256", bench="rmsnorm_linear")
    t = load_out(tmp_path)
    x = t["x"].astype(np.float64)
    rms = np.sqrt(np.mean(x ** 2, axis=1, keepdims=True) + 1e-5)
    want = (x / rms * t["gamma"].astype(np.float64)) @ t["W"].astype(np.float64)
    assert t["y"].shape == (T, 256)
    np.testing.assert_allclose(t["y"], want, rtol=0, atol=1e-5)
    assert m["numerics"]["max_abs_err"] <= 1e-5 and m["shape"]["H"] == 4096


def test_the_rmsnorm_recipe_is_one_composite_with_the_gemm(tmp_path):
    """Per token block: one composite whose MATH prologue is the recipe's 6 steps, then the
    GEMM streaming W; no primitive MATH command for the norm."""
    run(tmp_path, "bench.T=8", "bench.N=128", "bench.H=256", "bench.data=false", bench="rmsnorm_linear")
    log = read_oplog(tmp_path / "op_log.jsonl")
    assert [r["op_kind"] for r in log if r["unit"] == "cpu"] == ["load", "fill", "load", "composite"]
    comp = next(r["cmd"] for r in log if r["unit"] == "cpu" and r["op_kind"] == "composite")
    math_ops = [r["op_kind"] for r in log if r["cmd"] == comp and r["unit"] == "math"]
    assert math_ops == ["mul_bcast", "rmean", "add", "rsqrt", "mul_bcast", "mul_bcast"]
