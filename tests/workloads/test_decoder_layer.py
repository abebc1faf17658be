"""The decoder_layer workload (kbframe/workloads/decoder_layer.py, kernels/decoder_layer.py):
its float64 reference against hand-made cases, data-mode parity over tensor parallelism,
fusions, all-reduce algorithms, GQA group sizes, ragged caches, batches and layers; the
all-reduces' time against their model; fused against unfused dispatch; the attention
commands against decode_heads'; the model presets against their published numbers."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, copies_only, load_out, read_oplog, run
from kbframe.errors import ConfigError, RecordBudgetError
from kbframe.run.metrics import summary
from kbframe.workloads.decoder_layer import FILE_ARRAYS, reference_layers

SMALL = ("bench.H=64", "bench.H_q=4", "bench.H_kv=2", "bench.d=16", "bench.F=96", "bench.S_kv=100")


def _inputs(L, B, H, H_q, H_kv, d, F, S, theta=10000.0, eps=1e-12, pos=0):
    z = lambda *s: np.zeros(s)  # noqa: E731
    return {"x": z(B, H), "attn_norm": np.ones((L, H)), "ffn_norm": np.ones((L, H)), "wq": z(L, H, H_q * d),
            "wk": z(L, H, H_kv * d), "wv": z(L, H, H_kv * d), "wo": z(L, H_q * d, H), "w_gate": z(L, H, F),
            "w_up": z(L, H, F), "w_down": z(L, F, H), "k_cache": z(L, B, H_kv, S, d), "v_cache": z(L, B, H_kv, S, d),
            "positions": np.full(B, pos), "rope_theta": np.float64(theta), "eps": np.float64(eps)}


def test_reference_of_a_one_hot_token_through_identity_weights():
    """x = e0 (H = 4), wq = wo = I, wk = wv = the first two columns of I, an empty cache, a
    zero FFN, position 0 (RoPE is the identity there): h = rms(x) = 2·e0, every query head
    attends to the one new key, o = [v, v] = [2, 0, 2, 0], out = x + o = [3, 0, 2, 0]."""
    inp = _inputs(1, 1, 4, 2, 1, 2, 4, 0)
    inp["x"][0, 0] = 1.0
    inp["wq"][0] = np.eye(4)
    inp["wk"][0] = np.eye(4)[:, :2]
    inp["wv"][0] = np.eye(4)[:, :2]
    inp["wo"][0] = np.eye(4)
    ref = reference_layers(inp, 2, 1)
    np.testing.assert_allclose(ref["out"], [[3.0, 0.0, 2.0, 0.0]], atol=1e-9)
    np.testing.assert_allclose(ref["k_new"][0, 0, 0], [2.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(ref["v_new"][0, 0, 0], [2.0, 0.0], atol=1e-9)


def test_reference_rope_rotates_each_pair_by_position_times_frequency():
    """d = 4, theta = 100: frequencies 1 and 1/10; at position p the pair (k_i, k_{i+2}) turns
    by p·freq_i: k' = (k_i cos − k_{i+2} sin, k_{i+2} cos + k_i sin). Position 0 leaves it."""
    for pos in (0, 3):
        inp = _inputs(1, 1, 4, 1, 1, 4, 4, 0, theta=100.0, pos=pos)
        inp["x"][0] = [1.0, 2.0, 3.0, 4.0]
        inp["wk"][0] = np.eye(4)
        k = reference_layers(inp, 1, 1)["k_new"][0, 0, 0]
        h = np.array([1.0, 2.0, 3.0, 4.0]) / math.sqrt(7.5)
        a = pos * np.array([1.0, 0.1])
        want = np.concatenate([h[:2] * np.cos(a) - h[2:] * np.sin(a), h[2:] * np.cos(a) + h[:2] * np.sin(a)])
        np.testing.assert_allclose(k, want, atol=1e-12)


def test_reference_attention_over_the_cache_and_the_new_key():
    """Two cached keys and the new one: softmax over all three scores (scale 1/sqrt(d)), the
    output the weighted values, added to the residual stream by wo = I."""
    inp = _inputs(1, 1, 2, 1, 1, 2, 2, 2)
    inp["x"][0] = [1.0, 1.0]  # rms = 1: h = x
    inp["wq"][0] = inp["wk"][0] = inp["wv"][0] = inp["wo"][0] = np.eye(2)
    inp["k_cache"][0, 0, 0] = [[1.0, 0.0], [0.0, -1.0]]
    inp["v_cache"][0, 0, 0] = [[5.0, 0.0], [0.0, 7.0]]
    ref = reference_layers(inp, 1, 1)
    s = np.array([1.0, -1.0, 2.0]) / math.sqrt(2)
    p = np.exp(s) / np.exp(s).sum()
    o = p[0] * np.array([5.0, 0.0]) + p[1] * np.array([0.0, 7.0]) + p[2] * np.array([1.0, 1.0])
    np.testing.assert_allclose(ref["out"][0], np.array([1.0, 1.0]) + o, atol=1e-12)


CASES = [  # (hardware, overrides): every tp, fusion, all-reduce, G ∈ {1, 2, 4, 7, 8}, ragged S, B > 1, L = 2
    ("default", ("bench.fusion=none",)),
    ("default", ("bench.fusion=fused", "bench.inner=opt3", "bench.layers=2", "bench.batch=2")),
    ("cube", ("bench.tp=2", "bench.fusion=none", "bench.allreduce=ring", "bench.S_kv=65")),
    ("cube", ("bench.tp=2", "bench.fusion=fused", "bench.allreduce=tree", "bench.batch=3", "bench.layers=2")),
    ("cube", ("bench.tp=2", "bench.fusion=fused", "bench.allreduce=direct", "bench.S_kv=0")),
    ("cube", ("bench.tp=4", "bench.H_q=4", "bench.H_kv=4", "bench.F=64", "bench.fusion=none",
              "bench.allreduce=direct", "bench.S_kv=1")),  # G = 1
    ("cube", ("bench.tp=4", "bench.H_q=16", "bench.H_kv=4", "bench.F=64", "bench.allreduce=tree",
              "bench.layers=2", "bench.S_kv=129")),  # G = 4
    ("cube", ("bench.tp=8", "bench.H_q=56", "bench.H_kv=8", "bench.d=8", "bench.F=64", "bench.allreduce=ring",
              "bench.batch=2", "bench.S_kv=63")),  # G = 7
    ("cube", ("bench.tp=8", "bench.H_q=64", "bench.H_kv=8", "bench.d=8", "bench.F=64", "bench.fusion=none",
              "bench.allreduce=tree", "bench.inner=opt3")),  # G = 8
    ("cube_mesh", ("bench.tp=16", "bench.H_q=32", "bench.H_kv=16", "bench.d=8", "bench.F=64",
                   "bench.allreduce=ring", "bench.S_kv=17")),  # across cubes
    ("cube", ("bench.tp=4", "bench.H_q=8", "bench.H_kv=2", "bench.F=64", "bench.allreduce=tree",
              "bench.batch=2", "bench.layers=2", "bench.S_kv=70")),  # tp > H_kv: 2 replicas of each KV head
    ("cube_mesh", ("bench.tp=32", "bench.H_q=32", "bench.H_kv=8", "bench.d=8", "bench.F=64",
                   "bench.allreduce=ring", "bench.fusion=none", "bench.S_kv=9")),  # 4 replicas, one query head a PE
    # (each replica attends over its own copy of the cache with the key it appended: out covers them all)
]


@pytest.mark.parametrize("hw,overrides", CASES, ids=[f"{h}-" + "-".join(o.split("=")[1] for o in ov)
                                                      for h, ov in CASES])
def test_data_mode_matches_the_float64_reference(tmp_path, hw, overrides):
    m = run(tmp_path, f"hardware={hw}", *SMALL, "bench.data=true", "run.trace=false", *overrides,
            bench="decoder_layer")
    assert m["numerics"]["max_rel_err"] <= 1e-5, m["numerics"]
    out = load_out(tmp_path)
    assert set(out) >= {*FILE_ARRAYS, "out", "k_new", "v_new", "ref_out", "ref_k_new", "ref_v_new"}
    c = m["shape"]
    assert out["out"].shape == (c["B"], c["H"])
    assert out["k_new"].shape == out["v_new"].shape == (c["layers"], c["B"], c["H_kv"], c["d"])
    # the kernel's k_new, v_new are what the reference appends, and the reference is recomputed from the saved inputs
    ref = reference_layers({n: out[n] for n in FILE_ARRAYS}, c["H_q"], c["H_kv"])
    for name in ("out", "k_new", "v_new"):
        np.testing.assert_allclose(out[name], ref[name], rtol=0, atol=1e-5 * np.abs(ref[name]).max())
        np.testing.assert_array_equal(out[f"ref_{name}"], ref[name])


@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct"])
def test_a_layers_all_reduces_take_their_model_time(tmp_path, algorithm):
    """Llama-3-8B's dimensions on a cube, tp 8, a short cache, unfused: the o-projection and
    the down projection take long enough for PE_CPU to have dispatched each all-reduce
    before its partials are ready, and every rank's partial is ready at once, so each
    takes exactly its α-β model's time. (Fused, rank 0's partial also adds the residual
    in its epilogue and is ready last; the tree, rooted there, then starts before it.)"""
    m = run(tmp_path, "hardware=cube", "bench.tp=8", "bench.S_kv=64", f"bench.allreduce={algorithm}",
            "bench.fusion=none", "run.trace=false", bench="decoder_layer")
    coll = m["collectives"]
    assert len(coll) == 2 and all(c["algorithm"] == algorithm and c["pes"] == list(range(8)) for c in coll)
    assert all(c["bytes"] == 4096 * 2 and c["ns"] == c["model_ns"] > 0 for c in coll)
    # the links' roofline term: the busiest PE's sends at 256 GB/s (ring: 14 of n/8 bytes;
    # tree: the root's 3 broadcasts of n; direct: 7 of n), two all-reduces a layer
    n = 4096 * 2
    sent = {"ring": 14 * n // 8, "tree": 3 * n, "direct": 7 * n}[algorithm]
    assert m["phases"]["link_bound_ns"] == pytest.approx(2 * sent / 256)
    link_row = next(line for line in summary(m, tmp_path).splitlines() if line.split()[:1] == ["link"])
    assert link_row.split()[1:4] == [f"{2 * sent / 256:.1f}", f"{2 * sent / 256 / m['sim']['latency_ns']:.1%}",
                                     f"{2 * n:,}"]


def test_fused_saves_dispatch_over_none(tmp_path):
    """Per layer and PE: RMSNorm 6 → 0 extra commands (prologue of the QKV GEMM) and 6 → 1
    (the FFN's), RoPE 1 → 0, SiLU·mul 2 → 0, the residual adds 2 → 0 (epilogues)."""
    ms = {f: run(tmp_path / f, "hardware=cube", "bench.tp=2", *SMALL, f"bench.fusion={f}", "run.trace=false",
                 bench="decoder_layer") for f in ("none", "fused")}
    none, fused = ms["none"]["dispatch"], ms["fused"]["dispatch"]
    assert none["commands"] - fused["commands"] == 2 * (6 + 5 + 1 + 2 + 2)
    assert fused["cycles"] < none["cycles"]
    names = {f: [e["phase"] for e in m["phases"]["by_phase"]] for f, m in ms.items()}
    assert names["none"] == ["load", "norm", "qkv", "rope", "kv_append", "attention", "o_proj", "all_reduce",
                             "residual", "ffn", "store"]
    assert names["fused"] == ["load", "norm+qkv+rope", "kv_append", "attention", "o_proj+residual", "all_reduce",
                              "norm", "ffn+residual", "store"]
    for f, m in ms.items():  # every phase of either fusion has its analytic estimate, and the step their sum
        an = [e["analytic_ns"] for e in m["phases"]["by_phase"]]
        assert None not in an and m["step"]["analytic_ns"] == pytest.approx(sum(an), abs=1e-3), f


def _dispatches(path: Path) -> list:
    return [(r["op_kind"], r["bytes"]) for r in read_oplog(path / "op_log.jsonl") if r["unit"] == "cpu"]


def test_attention_issues_the_commands_decode_heads_issues(tmp_path):
    """tp 1, one layer: each (sequence, KV head)'s attention is decode_heads' item over the
    S_kv + 1 keys, less decode_heads' q load (q is already in TCM) and its final store
    (the layer writes O/l into its o buffer)."""
    S = 70
    m = run(tmp_path / "layer", *SMALL, f"bench.S_kv={S}", "bench.batch=2", "run.trace=false", bench="decoder_layer")
    run(tmp_path / "heads", "bench.H_q=4", "bench.H_kv=2", "bench.d=16", f"bench.S_kv={S + 1}", "bench.batch=2",
        "bench.data=false", "run.trace=false", bench="decode_heads")
    heads = _dispatches(tmp_path / "heads")
    layer = _dispatches(tmp_path / "layer")
    # decode_heads: per item load q, the state's fills, the loop, div_bcast, store; items back to back
    assert heads[0][0] == "load" and heads[-1][0] == "store"
    per_item = len(heads) // 4
    item = heads[1:per_item - 1]
    assert [k for k, _ in item].count("composite") == 2 * math.ceil((S + 1) / 64) and item[-1][0] == "div_bcast"
    at = next(i for i in range(len(layer)) if layer[i:i + len(item)] == item)
    assert layer[at:at + 4 * len(item)] == item * 4  # the four items, each ending in O/l into the o buffer
    assert m["phases"]["by_phase"][[e["phase"] for e in m["phases"]["by_phase"]].index("attention")]["count"] == 1


def test_phases_cover_the_layer_and_name_the_critical_path(tmp_path):
    m = run(tmp_path, "hardware=cube", "bench.tp=2", *SMALL, "bench.layers=2", bench="decoder_layer")
    ph = m["phases"]
    assert len(ph["layers_ns"]) == 2 and all(ns > 0 for ns in ph["layers_ns"])
    path = sum(e["critical_path_ns"] for e in ph["by_phase"]) + ph["critical_path_other_ns"]
    assert path == pytest.approx(m["sim"]["latency_ns"], abs=1e-6)
    for e in ph["by_phase"]:
        assert e["bound_ns"] == max(e["busy_ns"].values())
        assert e["binding"] in ("chain", *e["busy_ns"])
    trace = json.loads((tmp_path / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e.get("cat") == "phase"]
    assert {e["pid"] for e in slices} == {0, 1}
    assert {e["name"] for e in slices} == {e["phase"] for e in ph["by_phase"]}
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert (0, "layer") in names


PRESETS = ["llama3_8b", "llama3_70b", "llama31_405b", "mistral_7b", "qwen2_72b", "qwen25_7b", "gemma2_9b"]
COMMENT_KEYS = {"hidden_size": "H", "num_attention_heads": "H_q", "num_key_value_heads": "H_kv", "head dim": "d",
                "intermediate_size": "F", "num_hidden_layers": "layers", "rope_theta": "rope_theta",
                "rms_norm_eps": "eps"}


@pytest.mark.parametrize("name", PRESETS)
def test_model_preset_matches_the_numbers_its_comment_quotes(name):
    text = (REPO / "conf" / "model" / f"{name}.yaml").read_text()
    comment = " ".join(line for line in text.splitlines() if line.startswith("#"))
    import yaml
    values = yaml.safe_load(text)
    for quoted, key in COMMENT_KEYS.items():
        found = re.search(rf"{quoted} ([0-9.e+-]+)", comment)
        assert found, f"{name}: the comment quotes no {quoted}"
        assert float(found.group(1).rstrip(".,")) == float(values[key]), (name, quoted)
    assert values["H_q"] % values["H_kv"] == 0


@pytest.mark.parametrize("name", PRESETS[:-1])
def test_every_llama_family_preset_composes_for_the_layer(tmp_path, name):
    """The preset's dimensions reach the workload (one layer of a short cache, timing only:
    its shape in metrics.json is the preset's)."""
    import yaml
    values = yaml.safe_load((REPO / "conf" / "model" / f"{name}.yaml").read_text())
    from conftest import compose_cfg
    from kbframe.run.bench import validate
    cfg = compose_cfg(f"+model={name}", "hardware=cube", "bench.tp=4", bench="decoder_layer")
    wl = validate(cfg)
    s = wl.shape()
    assert (s["H"], s["H_q"], s["H_kv"], s["d"], s["F"], s["layers"]) == (
        values["H"], values["H_q"], values["H_kv"], values["d"], values["F"], values["layers"])


def _random_file(path, seed: int, w_scale: float, positions, *dims, **scalars) -> dict:
    """An inputs file of :func:`_inputs`'s shapes (``dims``), normal random arrays (weights
    scaled by ``w_scale``) and these positions; returns its arrays."""
    rng = np.random.default_rng(seed)
    inp = _inputs(*dims, **scalars)
    for n, a in inp.items():
        if n not in ("positions", "rope_theta", "eps"):
            inp[n] = rng.standard_normal(a.shape) * (w_scale if n.startswith("w") else 1.0)
    inp["positions"] = np.array(positions)
    np.savez(path, **inp)
    return inp


def test_an_inputs_file_sets_every_shape_key_and_its_positions(tmp_path):
    """From a file: L = 2, B = 2, H = 16, 4/2 heads, d = 4, F = 12, S_kv = 5, each sequence's
    own position; the file's shapes and scalars are the run's (metrics.json shape) and the
    output matches the float64 reference of the file's arrays."""
    inp = _random_file(tmp_path / "layer.npz", 3, 0.3, [5, 2], 2, 2, 16, 4, 2, 4, 12, 5, theta=5000.0, eps=1e-6)
    m = run(tmp_path / "run", "hardware=cube", "bench.tp=2", f"bench.inputs.path={tmp_path / 'layer.npz'}",
            "bench.data=true", "run.trace=false", bench="decoder_layer")
    s = m["shape"]
    assert (s["layers"], s["B"], s["H"], s["H_q"], s["H_kv"], s["d"], s["F"], s["S_kv"]) == (2, 2, 16, 4, 2, 4, 12, 5)
    out = load_out(tmp_path / "run")
    ref = reference_layers(inp, 4, 2)
    assert m["numerics"]["max_rel_err"] <= 1e-5
    np.testing.assert_allclose(out["k_new"], ref["k_new"], atol=1e-5 * np.abs(ref["k_new"]).max())
    np.testing.assert_array_equal(out["positions"], [5, 2])


def test_an_inputs_files_dimensions_decide_the_parallelism(tmp_path):
    """tp 12 over a file's 6 KV heads and 12 query heads (a replica of each KV head on two
    PEs) runs, though the bench's own dimensions (8 KV heads, 32 query heads) refuse tp 12."""
    _random_file(tmp_path / "layer.npz", 5, 0.2, [50, 50], 1, 2, 48, 12, 6, 16, 48, 50)
    m = run(tmp_path / "run", "hardware=cube_mesh", "bench.tp=12", f"bench.inputs.path={tmp_path / 'layer.npz'}",
            "bench.data=true", "run.trace=false", bench="decoder_layer")
    assert (m["shape"]["tp"], m["shape"]["H_kv"], m["shape"]["H_q"]) == (12, 6, 12)
    assert m["numerics"]["max_rel_err"] <= 1e-5
    with pytest.raises(ConfigError, match=r"^bench.tp=12 must divide bench.H_kv=8 and bench.F=14336"):
        run(tmp_path / "own", "hardware=cube_mesh", "bench.tp=12", "bench.data=false", bench="decoder_layer")


SMALL_STEP = ("bench.H=256", "bench.H_q=8", "bench.H_kv=2", "bench.d=32", "bench.F=512", "bench.S_kv=200",
              "bench.layers=60")


def test_a_step_of_many_layers_fast_forwards_exactly(tmp_path):
    """60 layers of a small model on two PEs, timing only: the layers repeat from the third,
    the run is written from copies of 3 to 6 layers, and run.fast_forward=verify finds it
    identical to the full simulation (op_log, totals, wait records); metrics, phases of all
    60 layers, the step and trace.json are the full run's."""
    args = ("hardware=cube", "bench.tp=2", *SMALL_STEP, "bench.data=false")
    full = run(tmp_path / "full", *args, "run.fast_forward=off", bench="decoder_layer")
    m = run(tmp_path / "ff", *args, "run.fast_forward=verify", bench="decoder_layer")
    assert m["fast_forward"]["applied"] and "verified" in m["fast_forward"]["note"]
    for key in set(full) - {"fast_forward", "sim"}:
        assert m[key] == full[key], key
    assert len(m["phases"]["layers_ns"]) == 60 and m["step"]["layers"] == 60
    for name in ("op_log.jsonl", "trace.json"):
        assert (tmp_path / "ff" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name


@pytest.mark.parametrize("topology", [("hardware=default", "bench.tp=1"),
                                      ("hardware=cube", "bench.tp=8", "bench.fusion=none"),
                                      ("hardware=cube_mesh", "bench.tp=8", "bench.placement=spread",
                                       "bench.fusion=none")], ids=["tp1", "tp8", "tp8-2x2-cubes"])
def test_a_step_fast_forwards_exactly_on_one_pe_eight_and_across_cubes(tmp_path, topology):
    """One PE, a cube's 8 PEs, and 8 PEs dealt over 2×2 cubes (all-reduces across the
    die-to-die links): 60 layers of a small model are simulated as 6, the layer loop
    leaving out 54 once steady (kbframe.sim.steady), and run.fast_forward=verify finds the
    step made from them identical to the full simulation."""
    m = run(tmp_path, *topology, "bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=64",
            "bench.S_kv=40", "bench.layers=60", "bench.data=false", "run.fast_forward=verify", "run.check=false",
            "run.trace=false", bench="decoder_layer")
    assert m["fast_forward"]["applied"], m["fast_forward"]["note"]
    assert m["fast_forward"]["note"].startswith("fast-forwarded in one simulation: 54 period(s) of 1 step(s) along "
                                                "layers left out of 1 loop(s)"), m["fast_forward"]["note"]
    assert "verified" in m["fast_forward"]["note"] and m["step"]["layers"] == 60


NESTED = ("bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=64", "bench.S_kv=8192")


@pytest.mark.parametrize("topology, note", [
    (("hardware=default", "bench.tp=1", "bench.layers=3"),
     "2640 period(s) of 1 step(s) along S_kv left out of 24 loop(s) (47520 of 56319 records"),
    (("hardware=cube", "bench.tp=8", "bench.layers=3"),
     "330 period(s) of 1 step(s) along S_kv left out of 3 loop(s) (47520 of 62313 records"),
    (("hardware=cube_mesh", "bench.tp=8", "bench.placement=spread", "bench.layers=3"),
     "330 period(s) of 1 step(s) along S_kv left out of 3 loop(s) (47520 of 62313 records"),
], ids=["tp1", "tp8", "tp8-2x2-cubes"])
def test_a_step_fast_forwards_along_the_kv_tiles_inside_its_layers(tmp_path, topology, note):
    """A layer's KV loops (128 tiles each) leave out a steady stretch in every layer: one
    loop per KV head on one PE (8 a layer), one per layer on 8 PEs, a cube's or dealt over
    2×2 cubes (with layers whose loop jumps too, and weight GEMMs:
    test_a_steps_weight_gemms_leave_out_their_output_tiles). run.fast_forward=verify finds
    each identical to the full simulation."""
    m = run(tmp_path, *topology, *NESTED, "bench.data=false", "run.fast_forward=verify", "run.check=false",
            "run.trace=false", bench="decoder_layer")
    assert m["fast_forward"]["note"] == (f"fast-forwarded in one simulation: {note} by shifting); verified against "
                                         f"the full simulation")


WIDE = ("bench.H=1280", "bench.H_q=8", "bench.H_kv=8", "bench.d=128", "bench.F=24576", "bench.S_kv=512")


@pytest.mark.parametrize("topology, note", [
    (("hardware=default", "bench.tp=1", "bench.layers=3"),
     "576 period(s) of 1/2 step(s) along weight tiles left out of 12 loop(s) (26145 of 40971 records"),
    (("hardware=cube", "bench.tp=8", "bench.layers=3"),
     "51 period(s) of 1/2 step(s) along weight tiles left out of 9 loop(s) (16905 of 46767 records"),
    (("hardware=cube_mesh", "bench.tp=8", "bench.placement=spread", "bench.layers=3"),
     "51 period(s) of 1/2 step(s) along weight tiles left out of 9 loop(s) (16905 of 46767 records"),
    (("hardware=default", "bench.tp=1", "bench.layers=16", "bench.S_kv=8192", "bench.F=12288", "bench.H_q=2",
      "bench.H_kv=2"),
     "10 period(s) of 1 step(s) along layers and 1068 period(s) of 1 step(s) along S_kv and 534 period(s) of 1/2 "
     "step(s) along weight tiles left out of 31 loop(s) (149868 of 170460 records"),
    (("bench.H=4096", "bench.H_q=1", "bench.H_kv=1", "bench.F=1024", "bench.layers=1",
      "hardware.units.dma_read.setup_latency_ns=500"),
     "11 period(s) of 2 step(s) along weight tiles left out of 1 loop(s) (374 of 2081 records"),
], ids=["tp1", "tp8", "tp8-2x2-cubes", "tp1-layers-kv-and-weight-tiles", "one-gemv-setup-bound"])
def test_a_steps_weight_gemms_leave_out_their_output_tiles(tmp_path, topology, note):
    """A weight GEMM streams its weights over one row of output tiles (a decode GEMV): all
    but its first three periods, one checked and the last two tiles are left out, a period
    holding 16 K tiles or more and a multiple of the DMA's 4 transfers in flight (1 or 2
    output tiles of 10 to 24 K tiles here), and put back (their tiles, times and the records
    that name them moved) before the layers are. The GEMMs of 3 layers on one PE, on a
    cube's 8 and on 8 dealt over 2×2 cubes; of 16 layers whose layer loop and KV loops jump
    too; and one GEMM of 8 K tiles an output tile whose transfers, bound by their setup
    latency, end in groups of 4 (a period of 2 output tiles): run.fast_forward=verify finds
    each identical to the full simulation, the sanitizer's counts included."""
    m = run(tmp_path, *WIDE, *topology, "bench.data=false", "run.fast_forward=verify", "run.trace=false",
            bench="decoder_layer")
    assert m["fast_forward"]["note"] == (f"fast-forwarded in one simulation: {note} by shifting); verified against "
                                         f"the full simulation")


@pytest.mark.parametrize("overrides, why", [
    ((*WIDE, "hardware=default", "bench.tp=1", "calibration.FIXED=10000"),
     "record 141, of PE0's command 6, ran beside the tiles after the jump"),
    (("bench.H=4096", "bench.H_q=1", "bench.H_kv=1", "bench.d=128", "bench.F=1024", "bench.S_kv=512",
      "hardware.units.gemm.pipeline_latency_ns=50000"),
     "record 1614, of tile 0 before the jump, comes after the periods checked"),
], ids=["slow-pe-cpu", "gemm-bound"])
def test_weight_tiles_that_do_not_run_alone_are_not_left_out(tmp_path, overrides, why):
    """Weight tiles are left out only when nothing but the GEMM runs from the jump to its
    last transfer, and its units keep pace with its transfers. A PE_CPU that dispatches
    slower than the GEMM streams its tiles (10,000 cycles a command) still dispatches the
    commands behind it while they run; a GEMM stage 50 µs deep lags every transfer, so its
    first tile's records come after the periods checked. Neither would move with the
    tiles: the jump is refused, and the layer (too short to leave its KV tiles out) is the
    full simulation."""
    m = run(tmp_path, *overrides, "bench.layers=1", "bench.data=false", "run.fast_forward=verify", "run.trace=false",
            bench="decoder_layer")
    assert m["fast_forward"]["note"] == ("simulated in full: no loop along layers or S_kv looked steady with a stretch "
                                         f"to leave out (before: along layers and S_kv and weight tiles, loop 0 of weight tiles: {why})")


def test_a_unit_idle_across_a_kv_loop_held_repeated_waits_as_in_the_full_run(tmp_path):
    """One KV loop's jump, the run's only one, is held repeated (kbframe.repeated): the
    DMA write channel, idle from the new key and value's stores to the output's store,
    waits across the periods left out, and the critical path's per-unit waits are the
    full simulation's (323649.254 ns on the admission of the store), not the simulated
    records' alone; verify finds metrics.json the full simulation's (but for the wall time),
    and names the first value that is not."""
    on = run(tmp_path / "on", *HELD_KV, "run.fast_forward=verify", bench="decoder_layer")
    assert on["fast_forward"]["note"].startswith("fast-forwarded in one simulation: 984 period(s) of 1 step(s) along "
                                                 "S_kv left out of 1 loop(s)")
    assert on["fast_forward"]["note"].endswith("; verified against the full simulation")
    assert on["critical_path"]["units"]["dma_write"]["waited_for"] == {"admission (hazard)": 323649.254,
                                                                       "setup": 154.0}


HELD_KV = ("bench.H=1280", "bench.H_q=1", "bench.H_kv=1", "bench.d=128", "bench.F=1024", "bench.S_kv=65536",
           "bench.layers=1", "bench.data=false", "run.trace=false", "run.check=false")


def test_verify_names_a_metric_the_held_run_reports_unlike_the_full_one(tmp_path, monkeypatch):
    """A defect only in the analyses of a run held repeated (here: the critical path's
    setup wait of the DMA write channel one ns more) is a difference verify names: the key
    in metrics.json and both values."""
    from kbframe.errors import SanitizerError
    from kbframe.report import critical_path
    analyse = critical_path.analyse

    def one_more(*a, **k):
        cp = analyse(*a, **k)
        if len(a) > 4 or "repeat" in k:  # the held run's
            cp.metrics["units"]["dma_write"]["waited_for"]["setup"] += 1.0
        return cp
    monkeypatch.setattr(critical_path, "analyse", one_more)
    with pytest.raises(SanitizerError, match=re.escape(
            "fast-forward: metrics.json critical_path.units.dma_write.waited_for.setup is 155.0, the full "
            "simulation's 154.0")):
        run(tmp_path, *HELD_KV, "run.fast_forward=verify", bench="decoder_layer")


@pytest.mark.parametrize("compared", [True, False], ids=["compared-as-decided", "refused-after"])
def test_a_step_whose_kv_jumps_do_not_hold_jumps_along_its_layers_alone(tmp_path, monkeypatch, compared):
    """With 79 KV tiles of 128 a loop looks steady before its records repeat. Its records
    before the jump are compared as it is decided (kbframe.run.jump_checks.repeats): no KV
    loop jumps, and the layers do, in the first simulation. Without that comparison the
    KV jump is made and refused after it: the step is simulated once more with its layer
    loop jumping alone, as it would without nested axes (no weight GEMM left out tiles, so
    not first with its KV loops alone, which would be the same simulation), and the note
    says why. Verify finds both exact."""
    from kbframe.run import jump_checks
    if not compared:
        monkeypatch.setattr(jump_checks, "repeats", lambda *a: True)
    m = run(tmp_path, *NESTED[:-1], "bench.S_kv=10000", "bench.tile=128", "bench.layers=20", "bench.data=false",
            "run.fast_forward=verify", "run.check=false", "run.trace=false", bench="decoder_layer")
    again = ("" if compared else " (simulated once more: along layers and S_kv and weight tiles, loop 0 of S_kv: record "
             "303 is not record 285 a period of 1 later (name))")
    assert m["fast_forward"]["note"] == ("fast-forwarded in one simulation: 14 period(s) of 1 step(s) along layers "
                                         f"left out of 1 loop(s) (161966 of 231392 records by shifting){again}; "
                                         "verified against the full simulation")


FUSED_8 = ("bench.H=256", "bench.H_q=8", "bench.H_kv=8", "bench.d=128", "bench.F=256", "bench.S_kv=512",
           "bench.layers=48")


TP1_SMALL = ("hardware=default", "bench.tp=1", "bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=64",
             "bench.S_kv=40", "bench.layers=60")


# short copies on one PE and on a cube's 8 (over 2×2 cubes they are the same copies, with other HBM ports)
@pytest.mark.parametrize("topology, mechanism", [
    (TP1_SMALL, "one"), (TP1_SMALL, "copies"), (("hardware=cube", "bench.tp=8", *FUSED_8), "one"),
    (("hardware=cube", "bench.tp=8", *FUSED_8), "copies"),
    (("hardware=cube_mesh", "bench.tp=8", "bench.placement=spread", *FUSED_8), "one"),
], ids=["one-tp1", "copies-tp1", "one-tp8", "copies-tp8", "one-tp8-2x2-cubes"])
def test_a_fused_step_fast_forwards_exactly_on_one_pe_eight_and_across_cubes(tmp_path, topology, mechanism,
                                                                              monkeypatch):
    """Fused layers (rank 0's residual epilogues) on one PE repeat every layer; on 8 PEs, a
    cube's or dealt over 2×2 cubes, every 4 layers (each fourth 2 ns later than the other three).
    In one simulation the layer loop leaves out whole periods of 4. With short copies, a
    period of one layer first looks like a stream settling: the longer periods are tried on
    the same short copies before longer copies, and the ties between two PEs' records of
    neighbouring periods are ordered as in the copy that holds two. run.fast_forward=verify
    finds the written step identical to the full simulation. (48 layers are fewer than a
    model's: the copies of a 4-layer period, 49 layers with the candidates ruled out before
    it, may cost more than the step here.)"""
    from kbframe.workloads.decoder_layer import DecoderLayer
    monkeypatch.setattr(DecoderLayer, "ff_budget", 1.2)
    if mechanism == "copies":
        copies_only(monkeypatch)
    m = run(tmp_path, *topology, "bench.data=false", "run.fast_forward=verify", "run.check=false", "run.trace=false",
            bench="decoder_layer")
    assert m["fast_forward"]["applied"], m["fast_forward"]["note"]
    want = {("one", True): "in one simulation: 54 period(s) of 1 step(s) along layers left out",
            ("one", False): "in one simulation: 8 period(s) of 4 step(s) along layers left out",
            ("copies", True): "54 of 57 periods of 1 step(s) along layers",
            ("copies", False): "8 of 11 periods of 4 step(s) along layers"}[mechanism, "bench.tp=1" in topology]
    assert m["fast_forward"]["note"].startswith(f"fast-forwarded {want}"), m["fast_forward"]["note"]
    assert "verified" in m["fast_forward"]["note"]  # the phases too: the step's layers, each one's span
    assert m["step"]["layers"] == len(m["phases"]["layers_ns"]) == (60 if "bench.tp=1" in topology else 48)


def test_a_layer_loop_simulates_one_layer_after_the_period_it_checks(tmp_path):
    """A layer's commands far outnumber PE_SCHEDULER's queue, so past its jump the layer
    loop simulates the period it checks and one layer more (a KV loop two): 51 fused layers
    on 8 PEs jump at layer 10 by 9 periods of 4 (36 layers; leaving two after the period,
    32), and the step written is the full simulation's."""
    m = run(tmp_path, "hardware=cube", "bench.tp=8", *FUSED_8[:-1], "bench.layers=51", "bench.data=false",
            "run.fast_forward=verify", "run.check=false", "run.trace=false", bench="decoder_layer")
    assert m["fast_forward"]["note"] == ("fast-forwarded in one simulation: 9 period(s) of 4 step(s) along layers "
                                         "left out of 1 loop(s) (130032 of 184287 records by shifting); verified "
                                         "against the full simulation")


def test_a_verified_step_beyond_host_memory_is_refused_before_it_simulates(tmp_path, monkeypatch):
    """run.fast_forward=verify simulates the full step too, every record's stages kept for
    the sanitizer: within the record budget but beyond this machine's memory (made 1 GiB
    here) it is refused with its estimate, before anything is simulated. Fast-forwarded
    alone, the same step holds its simulated layers only and goes on."""
    from conftest import compose_cfg
    from kbframe.run import preflight
    from kbframe.run.bench import run_bench, validate
    from kbframe.sim.targets import resolve_kernel
    from kbframe.tl.recipe import load_recipes
    monkeypatch.setattr(preflight, "physical_memory_bytes", lambda: 1 << 30)
    args = ("hardware=cube", "bench.tp=2", *SMALL, "bench.layers=3000", "bench.data=false", "run.trace=false",
            "run.progress=false")
    with pytest.raises(ConfigError) as e:
        run_bench(compose_cfg(*args, "run.fast_forward=verify", bench="decoder_layer"), tmp_path / "verify")
    assert str(e.value) == (
        "decoder_layer at B=1 H=64 H_q=4 H_kv=2 G=2 d=16 F=96 S_kv=100 layers=3000 tp=2 fusion=fused "
        "allreduce=ring inner=opt2 tile=64 would make about 768,021 op_log records (277 with 1 of its 3,000 steps of "
        "layers, 256 more with each further one), about 1.46 GiB of host memory (2048 B each with run.check=true); "
        "this machine has 1 GiB; shrink the run or use run.check=false")
    assert not (tmp_path / "verify").exists()
    cfg = compose_cfg(*args, bench="decoder_layer")
    wl = validate(cfg)
    held = preflight.check_records_estimate(cfg, wl, resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes))
    assert held == preflight.held_steps(cfg, wl, 3000)[1] * 277


def test_a_step_over_its_record_budget_is_refused_with_its_exact_count(tmp_path):
    """The estimate from one and two layers' dry runs is the step's count (the layers make
    the same records): one record under the budget refuses it, naming the count the full
    dry run gives; at the budget it runs."""
    args = ("hardware=cube", "bench.tp=2", *SMALL, "bench.layers=9", "run.trace=false", "run.fast_forward=off")
    with pytest.raises(ConfigError, match=r"would be simulated record by record: ([\d,]+) op_log") as full:
        run(tmp_path / "dry", *args, "run.max_records=1", "bench.layers=1", bench="decoder_layer")
    one = int(full.value.args[0].split("record by record: ")[1].split(" ")[0].replace(",", ""))
    run(tmp_path / "ok", *args, bench="decoder_layer")
    with open(tmp_path / "ok" / "op_log.jsonl") as f:
        n = sum(1 for _ in f)
    with pytest.raises(ConfigError, match=rf"would make about {n:,} op_log records \({one:,} with 1 of its 9 steps of "
                                          rf"layers, [\d,]+ more with each further one\), over run.max_records={n - 1:,}"):
        run(tmp_path / "over", *args, f"run.max_records={n - 1}", bench="decoder_layer")
    run(tmp_path / "at", *args, f"run.max_records={n}", bench="decoder_layer")
    # a step of a model (a preset's layer count): one layer estimates it
    with pytest.raises(ConfigError) as e:
        run(tmp_path / "model", *args, "bench.model_layers=9", f"run.max_records={n - 1}", bench="decoder_layer")
    assert str(e.value).endswith(f"over run.max_records={n - 1:,}; raise run.max_records or shrink the run, or "
                                 "simulate one (bench.layers=1: metrics.json step.model estimates the whole step "
                                 "from it)")


def test_a_run_of_fewer_layers_than_its_model_estimates_the_whole_step(tmp_path):
    """bench.model_layers (a preset sets it): one simulated layer gives the model's step as the
    run's latency plus the layer's span for each layer not simulated; a run of every layer has
    no estimate."""
    args = ("hardware=cube", "bench.tp=2", *SMALL, "bench.model_layers=6", "run.trace=false", "run.check=false")
    one = run(tmp_path / "one", *args, "bench.layers=1", bench="decoder_layer")
    six = run(tmp_path / "six", *args, "bench.layers=6", "run.fast_forward=off", bench="decoder_layer")
    mo = one["step"]["model"]
    assert mo == {"layers": 6, "latency_ns": one["step"]["latency_ns"] + 5 * one["phases"]["layers_ns"][-1],
                  "tokens_per_s": 1e9 / mo["latency_ns"],
                  "estimated": "1 simulated layer(s) and 5 more of the last one's latency"}
    # a tiny layer (7.6 µs) is short against what links two layers: 2.4 % under the simulated
    # step (a Llama-3-70B layer: 1.6e-5, docs/decoder_layer.md)
    assert round(mo["latency_ns"] / six["step"]["latency_ns"] - 1, 4) == -0.0237
    assert "model" not in six["step"]
    line = [x for x in summary(one, tmp_path).splitlines() if x.startswith("  model ")]
    assert line == [f"  model       {mo['latency_ns'] / 1e6:.3f} ms, {mo['tokens_per_s']:,.1f} tokens/s for the "
                    f"model's 6 layers, estimated (1 simulated layer(s) and 5 more of the last one's latency)"]


@pytest.mark.parametrize("tp", [1, 2])
def test_a_layers_latency_runs_from_the_end_of_the_layer_before_it(tmp_path, tp):
    """On one PE no all-reduce holds PE_CPU back: a layer's first command (its norm weights'
    load) runs while the layer before still does, so layers' spans overlap. A layer's latency
    runs from the previous layer's end: the layers after the first take the same time, and
    two simulated layers estimate the model's step as the simulated step of all its layers."""
    args = ("hardware=cube", f"bench.tp={tp}", *SMALL, "bench.model_layers=6", "run.trace=false", "run.check=false",
            "run.fast_forward=off")
    two = run(tmp_path / "two", *args, "bench.layers=2", bench="decoder_layer")
    six = run(tmp_path / "six", *args, "bench.layers=6", bench="decoder_layer")
    per = six["phases"]["layers_ns"]
    assert per[1:] == [two["phases"]["layers_ns"][1]] * 5 and per[0] == two["phases"]["layers_ns"][0]
    assert 4 * per[1] == pytest.approx(six["step"]["latency_ns"] - two["step"]["latency_ns"], rel=1e-12)
    assert two["step"]["model"]["latency_ns"] == pytest.approx(six["step"]["latency_ns"], rel=1e-12)
    assert two["step"]["model"]["estimated"] == "2 simulated layer(s) and 4 more of the last one's latency"


def test_a_model_whose_whole_step_would_not_fit_is_not_estimated(tmp_path):
    """step.model is given only for a model a run of every layer could simulate: one whose
    weights and KV cache exceed the HBM says why (and by how much), and estimates nothing."""
    args = ("hardware=cube", "bench.tp=2", *SMALL, "bench.layers=1", "bench.model_layers=1000",
            "hardware.hbm_bytes=1048576", "run.trace=false", "run.check=false")
    m = run(tmp_path, *args, bench="decoder_layer")
    why = ("HBM too small: x, attn_norm, ffn_norm, positions, wqkv, wo, w_gate_shards, w_up_shards, w_down, k_rows, "
           "v_rows, out need 74649600 B (0.0695 GiB) at B=1 H=64 H_q=4 H_kv=2 G=2 d=16 F=96 S_kv=100 "
           "layers=1000 tp=2 fusion=fused allreduce=ring inner=opt2 tile=64 (float16), hardware.hbm_bytes is 1048576 B "
           "(0.000977 GiB)")
    assert m["step"]["model"] == {"layers": 1000, "latency_ns": None, "tokens_per_s": None, "refused": why,
                                  "hbm_need_bytes": 74649600, "hbm_bytes": 1048576}
    line = [x for x in summary(m, tmp_path).splitlines() if x.startswith("  model ")]
    assert line == ["  model       not estimated: the model's 1000 layers would not fit (0.0695 GiB of HBM needed, "
                    "0.000977 GiB there; metrics.json step.model.refused)"]


def test_the_whole_model_of_an_inputs_file_is_checked_with_its_dimensions(tmp_path):
    """A layer from an inputs file (its dimensions the file's): the whole model is checked
    with them, a cube's HBM included."""
    _random_file(tmp_path / "layer.npz", 1, 0.3, [100], 1, 1, 64, 4, 2, 16, 96, 100)
    m = run(tmp_path / "run", "hardware=cube_mesh", "bench.tp=2", "bench.placement=spread", "bench.model_layers=1000",
            "hardware.hbm_bytes=100000000", f"bench.inputs.path={tmp_path / 'layer.npz'}", "bench.data=true",
            "run.trace=false", bench="decoder_layer")
    mo = m["step"]["model"]
    assert (mo["latency_ns"], mo["hbm_need_bytes"], mo["hbm_bytes"]) == (None, 37312129, 25000000)
    assert mo["refused"].startswith("bench.tp=2 (bench.placement=spread) puts 1 rank's shards, 37312129 B")


def test_a_step_that_fast_forwards_is_held_to_its_budget_by_the_layers_it_holds(tmp_path, monkeypatch):
    """A step whose layers fast-forward holds the records of its simulated layers alone (the
    period of layers is put back without being made), and knows how many once its layers
    look steady. Before it simulates it is refused only when even its fewest (3 to settle,
    in which two periods of 1 are seen, one period checked after the jump and the last
    layer) are over the budget; a budget under what it holds stops it once its layers are
    simulated, with their count; at that count it runs, though below the full step's. A
    step too short to leave layers out holds them all, and is refused before it simulates;
    one whose layers never look steady is simulated whole and then held to the budget."""
    args = ("hardware=default", "bench.tp=1", "bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=64",
            "bench.S_kv=40", "bench.layers=60", "run.trace=false", "run.check=false")
    with pytest.raises(RecordBudgetError, match=r"would make about ([\d,]+) op_log records \(([\d,]+) with 1 of its "
                                                r"60 steps of layers, ([\d,]+) more with each further one\) and hold "
                                                r"those of at least 5 steps, about ([\d,]+), over "
                                                r"run.max_records=1;") as e:
        run(tmp_path / "one", *args, "run.max_records=1", bench="decoder_layer")
    full, one, more, least = (int(v.replace(",", "")) for v in
                              re.search(r"about ([\d,]+) op_log records \(([\d,]+) with 1 .*, ([\d,]+) more .* "
                                        r"about ([\d,]+),", str(e.value)).groups())
    assert full == one + 59 * more and least == one + 4 * more
    held = one + 5 * more  # the run simulates 6 layers (54 periods of 1 left out)
    with pytest.raises(RecordBudgetError) as e:
        run(tmp_path / "least", *args, f"run.max_records={least}", bench="decoder_layer")
    assert str(e.value).endswith(f"would make {full:,} op_log records even fast-forwarded and hold {held:,} of them "
                                 f"(about 0.000852 GiB of host memory, 450 B each), over run.max_records={least:,}; "
                                 f"raise run.max_records or shrink the run")
    assert not (tmp_path / "least").exists()
    m = run(tmp_path / "held", *args, f"run.max_records={held}", bench="decoder_layer")
    assert m["sim"]["events"] == full > held and m["fast_forward"]["applied"] and m["step"]["layers"] == 60
    assert m["fast_forward"]["note"].endswith(f"54 period(s) of 1 step(s) along layers left out of 1 loop(s) "
                                              f"({full - held} of {full} records by shifting)")
    # run.fast_forward=verify simulates the full step as well: its budget counts every layer
    with pytest.raises(RecordBudgetError, match=rf"would make about {full:,} op_log records \({one:,} with 1 of its "
                                                rf"60 steps of layers, {more:,} more with each further one\), over "
                                                rf"run.max_records={held:,};"):
        run(tmp_path / "verify", *args, f"run.max_records={held}", "run.fast_forward=verify", bench="decoder_layer")
    # 15 layers: too few to leave any out (3 to settle, two periods of 4, one checked and the last)
    with pytest.raises(RecordBudgetError, match=rf"would make about {one + 14 * more:,} op_log records "
                                                rf"\({one:,} with 1 of its 15 steps of layers, {more:,} more with "
                                                rf"each further one\), over run.max_records={held:,};"):
        run(tmp_path / "short", *args, "bench.layers=15", f"run.max_records={held}", bench="decoder_layer")
    from kbframe.sim.steady import Steady
    monkeypatch.setattr(Steady, "_steady", lambda *a: None)  # no loop ever looks steady
    with pytest.raises(RecordBudgetError) as e:  # stopped while its layers could still repeat
        run(tmp_path / "never", *args, f"run.max_records={held}", bench="decoder_layer")
    got = re.fullmatch(rf"decoder_layer at B=1 .* tile=64 holds ([\d,]+) op_log records at step 7 of 60 along "
                       rf"layers before they repeat, over run.max_records={held:,}; raise run.max_records or shrink "
                       rf"the run", str(e.value))
    assert got and held < int(got.group(1).replace(",", "")) <= one + 6 * more  # the first step it is over
    with pytest.raises(RecordBudgetError) as e:  # over it only in its last layers, which can no longer repeat
        run(tmp_path / "never", *args, f"run.max_records={full - 1}", bench="decoder_layer")
    assert str(e.value).endswith(f"was simulated record by record (no loop along layers or S_kv or weight tiles looked steady with a "
                                 f"stretch to leave out): {full:,} op_log records, over run.max_records={full - 1:,}; "
                                 f"raise run.max_records or shrink the run")
    assert not (tmp_path / "never").exists()
