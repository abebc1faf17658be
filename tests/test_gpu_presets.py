"""The GPU presets (conf/hardware/h100_sxm*.yaml, a100_sxm_80g.yaml; DESIGN.md decision 14):
each parameter equals the arithmetic of the figures its YAML comments quote, and each quoted
figure is in the file, so a value cannot drift from its source unnoticed."""
import pytest

from conftest import REPO, compose_cfg

# preset -> [(dotted key, value from the quoted figures, the quoted figures)]
FIGURES = {
    "h100_sxm": [
        ("n_pes", 132, ['"132 SMs']),
        ("pes_per_cube", 132, []),
        ("clock_ghz", 1.83, ['"1.83 GHz (low precision)"']),
        ("cube_hbm_gbps", 3350 * 0.84, ['"3.35 TB/s', '"Matrix load (coalesced) | 2.8 TB/s | 84%"']),
        ("hbm_gbps", 3350 * 0.84, []),
        ("hbm_bytes", 80 * 1024 ** 3, ['"80 GB HBM3"']),
        ("tcm_bytes", 228 * 1024, ['"max shared memory per SM (kB) | 228"']),
        ("units.cpu.launch_ns", 5.0 * 1000, ['"This usually takes 5–50 µs on modern systems"']),
        ("units.tcm.read_gbps", round(32348 / 144, 2), ['"shared memory bandwidth (GB/s) | 32348"', "144 SMs"]),
        ("units.dma_read.setup_latency_ns", round(400 / 1.83, 1), ['"global memory latency (clock cycles) | 400"']),
        ("units.dma_write.setup_latency_ns", round(400 / 1.83, 1), []),
        ("units.dma_read.max_outstanding", 4, ['"4-stage pipeline"']),
        ("units.gemm.peak_tflops", round(989.4 / 132 * 0.75, 9), ['"BF16 | 133.8 | 989.4 | 1978.9"',
                                                                  '"FP16 reaching up to 740 TFLOPs/s (75% utilization)"']),
        ("units.math.vector_width", 128, ['"128 per SM"']),
        ("units.gemm.tile_m", 128, ['"cutlass_80_tensorop_bf16_s16816gemm_bf16_128x128_64x3"']),
        ("units.gemm.tile_k", 64, ['"128x128_64x3"']),
        ("units.ipcq_send.intra_latency_ns", round(200 / 1.83, 1), ['"L2 cache latency (clock cycles) | 200"']),
        ("units.ipcq_send.intra_gbps", round(8986 / 144, 1), ['"L2 cache bandwidth (GB/s) | 8986"']),
        ("units.ipcq_send.d2d_latency_ns", 1.0 * 1000, ['"NVLink 4.0 | 900 GB/s per GPU | ~1-2 us"']),
        ("units.ipcq_send.d2d_gbps", 900 / 2, ['"900 GB/s NVLink (D2D)"']),
    ],
    "a100_sxm_80g": [
        ("n_pes", 108, ['"there are 108 SMs total"']),
        ("pes_per_cube", 108, []),
        ("clock_ghz", 1.41, ['"Max Core Boost Clock 1755 MHz 1410 MHz"']),
        ("cube_hbm_gbps", 2039 * 0.88, ['"An A100 can perform', '2,039 GB/s of memory bandwidth"',
                                        '"it too agrees that I am at 88% of peak bandwidth"']),
        ("hbm_bytes", 80 * 1024 ** 3, ['"A100 80GB SXM BF16 TC / HBM2e | 312 | 2 | 156"']),
        ("tcm_bytes", 164 * 1024, ['"max shared memory per SM (kB) | 96 | 164 | 228"']),
        ("units.cpu.launch_ns", 5.0 * 1000, ['"This usually takes 5–50 µs on modern systems"']),
        ("units.tcm.read_gbps", round(23101 / 128, 2), ['"shared memory bandwidth (GB/s) | 16451 | 23101"',
                                                        "128 SMs"]),
        ("units.dma_read.setup_latency_ns", round(400 / 1.41, 1), ['"global memory latency (clock cycles) | 400"']),
        ("units.dma_read.max_outstanding", 3, ['"128x128_64x3"']),
        ("units.gemm.peak_tflops", round(312 / 108 * 0.73, 9), ['"A100 80GB SXM BF16 TC / HBM2e | 312',
                                                                '"reaching 50-73% of A100 peak']),
        ("units.math.vector_width", 64, ['"64 FP32 CUDA Cores/SM, 6912 FP32 CUDA']),
        ("units.gemm.tile_m", 128, ['"cutlass_80_tensorop_bf16_s16816gemm_bf16_128x128_64x3"']),
        ("units.gemm.tile_k", 64, ['"128x128_64x3"']),
        ("units.ipcq_send.intra_latency_ns", round(200 / 1.41, 1), ['"L2 cache latency (clock cycles) | 200"']),
        ("units.ipcq_send.intra_gbps", round(7219 / 128, 1), ['"L2 cache bandwidth (GB/s) | 3133 | 7219"']),
    ],
}


def _get(node, dotted):
    for part in dotted.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize("preset", list(FIGURES))
def test_each_parameter_equals_the_figures_its_comment_quotes(preset):
    text = (REPO / "conf" / "hardware" / f"{preset}.yaml").read_text(encoding="utf-8")
    hw = compose_cfg(f"hardware={preset}", bench=None).hardware
    for key, want, quotes in FIGURES[preset]:
        assert _get(hw, key) == pytest.approx(want, rel=1e-9, abs=0), key
        for q in quotes:
            assert q in text, f"{preset}.yaml does not quote {q!r} ({key})"
    assert hw.hbm_mode == "shared" and hw.hbm_arbitration == "arrival"
    assert (hw.units.gemm.tile_m, hw.units.gemm.tile_n, hw.units.gemm.tile_k) == (128, 128, 64)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_multi_gpu_presets_are_h100s_over_nvswitch(n):
    hw = compose_cfg(f"hardware=h100_sxm_x{n}", bench=None).hardware
    one = compose_cfg("hardware=h100_sxm", bench=None).hardware
    assert (hw.n_pes, hw.pes_per_cube, hw.cubes_x, hw.cubes_y, hw.cube_fabric) == (132 * n, 132, n, 1, "switch")
    assert hw.units == one.units and hw.cube_hbm_gbps == one.cube_hbm_gbps


def test_a_switch_puts_every_pair_of_gpus_one_crossing_apart():
    from kbframe.hw.ipcq import Fabric
    mesh, switch = Fabric([None] * 1056, 132, 8), Fabric([None] * 1056, 132, 8, switch=True)
    assert [mesh.cube_hops(0, 132 * g) for g in range(8)] == list(range(8))
    assert [switch.cube_hops(0, 132 * g) for g in range(8)] == [0] + [1] * 7
    assert switch.cube_hops(5, 131) == 0


def test_llama_gemm_shapes_are_the_models_projections():
    """conf/gemm_shape/llama3_*_tp*_*.yaml (swept by +sweep=gpu_llama_gemms) hold K and N of
    each projection, from conf/model/ (Llama-3-70B: H 8192, H_q 64, H_kv 8, d 128, F 28672)."""
    from omegaconf import OmegaConf
    want = {("llama3_70b", 1): {"qkv": (8192, 10240), "o": (8192, 8192), "gate_up": (8192, 57344),
                                "down": (28672, 8192)},
            ("llama3_70b", 8): {"qkv": (8192, 1280), "o": (1024, 8192), "gate_up": (8192, 7168),
                                "down": (3584, 8192)},
            ("llama3_8b", 4): {"qkv": (4096, 1536), "o": (1024, 4096), "gate_up": (4096, 7168),
                               "down": (3584, 4096)}}
    for (model, tp), gemms in want.items():
        for g, (K, N) in gemms.items():
            c = OmegaConf.load(REPO / "conf" / "gemm_shape" / f"{model}_tp{tp}_{g}.yaml")
            assert (c.K, c.N) == (K, N) and "M" not in c
    sweep = OmegaConf.load(REPO / "conf" / "sweep" / "gpu_llama_gemms.yaml").hydra.sweeper.params
    names = sweep["+gemm_shape"].split(",")
    assert len(names) == 32 and all((REPO / "conf" / "gemm_shape" / f"{n}.yaml").exists() for n in names)
    assert len(sweep.hardware.split(",")) * len(names) * len(str(sweep["bench.M"]).split(",")) == 384
