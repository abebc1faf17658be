"""The gemm workload (ADR-0044 harness): numerics against an independent float64 reference
for every staging variant and epilogue, op sequences, and its config errors."""
import math

import numpy as np
import pytest

from kbframe.errors import ConfigError

from conftest import load_out, read_oplog, run

SHAPE = ("bench.M=70", "bench.K=200", "bench.N=150", "bench.block_m=32")


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


# each epilogue written out here in numpy, independently of kbframe.ir.micro_ops
EPILOGUES = {
    "none": ([], lambda c, t: c),
    "bias": ([{"op": "bias"}], lambda c, t: c + t["bias"]),
    "relu": ([{"op": "relu"}], lambda c, t: np.maximum(c, 0)),
    "gelu": ([{"op": "gelu"}], lambda c, t: _gelu(c)),
    "sigmoid": ([{"op": "sigmoid"}], lambda c, t: 1 / (1 + np.exp(-c))),
    "scale": ([{"op": "scale", "factor": 0.25}], lambda c, t: c * 0.25),
    "clamp": ([{"op": "clamp", "lo": -0.3, "hi": 0.4}], lambda c, t: np.clip(c, -0.3, 0.4)),
    "dequant": ([{"op": "dequant", "scale": 0.125}], lambda c, t: c * 0.125),
    "add": ([{"op": "add"}], lambda c, t: c + t["other"]),
    "chain": ([{"op": "dequant", "scale": 2.0}, {"op": "bias"}, {"op": "gelu"}, {"op": "add"}],
              lambda c, t: _gelu(2.0 * c + t["bias"]) + t["other"]),
}


def _ep(items) -> str:
    inner = ", ".join("{" + ", ".join(f"{k}: {v}" for k, v in e.items()) + "}" for e in items)
    return f"bench.epilogue=[{inner}]"


@pytest.mark.parametrize("staging", ["ref_ref", "load_ref", "load_load"])
@pytest.mark.parametrize("name", list(EPILOGUES))
def test_gemm_matches_float64_for_every_staging_and_epilogue(tmp_path, staging, name):
    items, ref = EPILOGUES[name]
    m = run(tmp_path, *SHAPE, _ep(items), bench=f"gemm_{staging}")
    t = load_out(tmp_path)
    c = t["A"].astype(np.float64) @ t["B"].astype(np.float64)
    want = ref(c, {k: v.astype(np.float64) for k, v in t.items()})
    np.testing.assert_allclose(t["C"], want, rtol=0, atol=1e-5)
    assert m["numerics"]["max_abs_err"] <= 1e-5
    assert m["shape"] == {"M": 70, "K": 200, "N": 150, "block_m": 32, "staging": staging, "n_blocks": 3}
    assert m["dispatch"]["unit"] == "output block" and m["dispatch"]["n_units"] == 3


def test_staging_variants_differ_in_exactly_their_dma(tmp_path):
    """ref_ref streams A and B tiles per GEMM tile; load_ref loads 3 A blocks then streams B;
    load_load loads B once and the 3 A blocks: the DMA read counts say so exactly."""
    reads = {}
    for s in ("ref_ref", "load_ref", "load_load"):
        run(tmp_path / s, *SHAPE, "bench.data=false", bench=f"gemm_{s}")
        log = read_oplog(tmp_path / s / "op_log.jsonl")
        reads[s] = sum(r["unit"] == "dma_read" for r in log)
        assert [r["op_kind"] for r in log if r["unit"] == "cpu"].count("composite") == 3
    # GEMM tiles per composite: (32 rows) × 2 n-tiles × 2 k-tiles = 4, each reading a and b
    assert reads == {"ref_ref": 3 * 4 * 2, "load_ref": 3 + 3 * 4, "load_load": 1 + 3}


def test_dequant_defaults_to_k_tile_and_scales_each_partial_product(tmp_path):
    """With K = 200 (two K tiles), a k_tile dequant runs twice per output tile."""
    run(tmp_path, *SHAPE, _ep([{"op": "dequant", "scale": 0.5}]), "bench.data=false", bench="gemm_ref_ref")
    log = read_oplog(tmp_path / "op_log.jsonl")
    assert sum(r["op_kind"] == "dequant" for r in log) == 3 * 2 * 2  # blocks × n-tiles × k-tiles


@pytest.mark.parametrize("ov, msg", [
    ("bench.staging=ref_load", "bench.staging must be one of ref_ref, load_ref, load_load, got 'ref_load'"),
    ("bench.M=0", "bench.M must be ≥ 1, got 0"),
    ("bench.epilogue=[{op: tanh}]", "bench.epilogue[0]: op must be one of bias, relu, gelu, sigmoid, scale, "
                                    "clamp, dequant, add, got 'tanh'"),
    ("bench.epilogue=[{op: clamp, lo: 0}]", "bench.epilogue[0] (clamp): needs scalar(s) ['hi', 'lo'], got ['lo']"),
])
def test_gemm_config_errors_name_the_key(tmp_path, ov, msg):
    with pytest.raises(ConfigError) as e:
        run(tmp_path, ov, bench="gemm_ref_ref")
    assert str(e.value) == msg
