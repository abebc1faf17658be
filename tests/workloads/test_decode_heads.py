"""decode_heads: GQA decode of a batch of sequences × KV heads over the PEs.

Every head of every sequence against an independent float64 reference, a sequence of length
0 giving 0 (not NaN), G = 7 (Qwen2.5-7B), the blocked and round-robin mappings (the same
numbers, the work on the PEs the mapping names), one item on one PE identical to decode_opt2,
and the model presets."""
import math

import numpy as np
import pytest

from conftest import compose_cfg, load_out, read_oplog, ref64, run
from kbframe.cli.main import presets_after_bench
from kbframe.run.bench import validate

TOL = 1e-5


def _ref_per_item(t, H_q, H_kv, lengths):
    """Independent reference: q rows (b·H_q + h·G + g), k/v stacked per (sequence, head)."""
    G, d = H_q // H_kv, t["q"].shape[1]
    out = np.zeros((len(lengths) * H_q, d))
    r = 0
    for b, S in enumerate(lengths):
        for h in range(H_kv):
            q0 = b * H_q + h * G
            if S:
                out[q0:q0 + G] = ref64(t["q"][q0:q0 + G], t["k"][r:r + S], t["v"][r:r + S], float(t["scale"]))
            r += S
    return out


@pytest.mark.parametrize("inner", ["opt2", "opt3"])
@pytest.mark.parametrize("mapping", ["blocked", "round_robin"])
def test_every_head_matches_float64_with_an_empty_sequence_and_g7(tmp_path, inner, mapping):
    """Qwen2.5-7B's heads (28 query, 4 KV: G = 7), three sequences of 70, 0 and 9 keys:
    12 items on 5 PEs; the empty sequence's 28 output rows are exactly 0."""
    lengths = [70, 0, 9]
    m = run(tmp_path, "+model=qwen25_7b", "bench.d=16", f"bench.S_kv={lengths}".replace(" ", ""),
            f"bench.inner={inner}", f"bench.mapping={mapping}", "bench.tile=16", "bench.inputs.peak=4",
            "hardware.n_pes=5", bench="decode_heads")
    t = load_out(tmp_path)
    assert t["q"].shape == (3 * 28, 16) and t["k"].shape == (4 * 79, 16)
    ref = _ref_per_item(t, 28, 4, lengths)
    assert np.all(np.isfinite(t["out"]))
    np.testing.assert_array_equal(t["out"][28:56], 0.0)  # the empty sequence
    err = np.abs(t["out"] - ref).max()
    assert err <= TOL and m["numerics"]["max_abs_err"] == pytest.approx(err, rel=1e-6, abs=1e-12)
    assert np.abs(ref[:28] - t["v"][:70].mean(axis=0)).max() > 0.1  # peaked enough to be a real check
    # 4 heads × (5 tiles of 16 over 70 keys + 0 + 1 tile over 9 keys)
    assert m["shape"] == {"model": "qwen25_7b", "B": 3, "H_q": 28, "H_kv": 4, "G": 7, "d": 16, "S_kv": lengths,
                          "tile": 16, "inner": inner, "mapping": mapping, "pes": 5, "n_tiles": 24}


def test_mappings_give_the_same_numbers_on_the_pes_they_name(tmp_path):
    """6 items on 4 PEs: blocked puts items {0}, {1, 2}, {3}, {4, 5} on PEs 0-3, round-robin
    {0, 4}, {1, 5}, {2}, {3}; each PE's DMA reads are exactly its items' q, K and V bytes;
    the outputs are bit-identical (each item runs the same commands wherever it runs)."""
    outs, reads = {}, {}
    for mapping in ("blocked", "round_robin"):
        d = tmp_path / mapping
        run(d, "bench.H_q=6", "bench.H_kv=3", "bench.d=8", "bench.S_kv=[40,24]", "bench.tile=16",
            f"bench.mapping={mapping}", "hardware.n_pes=4", bench="decode_heads")
        outs[mapping] = load_out(d)["out"]
        reads[mapping] = {}
        for r in read_oplog(d / "op_log.jsonl"):
            if r["unit"] == "dma_read":
                reads[mapping][r["pe"]] = reads[mapping].get(r["pe"], 0) + r["bytes"]
    np.testing.assert_array_equal(outs["blocked"], outs["round_robin"])
    item = [2 * 8 * 2 + 2 * S * 8 * 2 for S in (40, 40, 40, 24, 24, 24)]  # q (G=2, d) + K + V, fp16
    assert reads["blocked"] == {0: item[0], 1: item[1] + item[2], 2: item[3], 3: item[4] + item[5]}
    assert reads["round_robin"] == {0: item[0] + item[4], 1: item[1] + item[5], 2: item[2], 3: item[3]}


def test_one_item_on_one_pe_is_decode_opt2_byte_for_byte(tmp_path):
    """One sequence, one KV head: the same inputs (the same random stream), the same op_log
    bytes and the same output as decode_opt2."""
    run(tmp_path / "h", "bench.H_q=8", "bench.H_kv=1", "bench.S_kv=130", "run.trace=false", bench="decode_heads")
    run(tmp_path / "o", "bench.S_kv=130", "run.trace=false", bench="decode_opt2")
    assert (tmp_path / "h" / "op_log.jsonl").read_bytes() == (tmp_path / "o" / "op_log.jsonl").read_bytes()
    h, o = load_out(tmp_path / "h"), load_out(tmp_path / "o")
    for name in ("q", "k", "v", "out", "ref"):
        np.testing.assert_array_equal(h[name], o[name])


def test_heads_on_their_own_pes_run_in_parallel(tmp_path):
    """8 KV heads on the 8 PEs of a cube (timing only) take as long as one head on one PE:
    partitioned HBM gives each PE its own pseudo-channels."""
    one = run(tmp_path / "1", "bench.H_q=8", "bench.H_kv=1", "bench.S_kv=512", "bench.data=false",
              bench="decode_heads")
    eight = run(tmp_path / "8", "+model=llama3_70b", "bench.S_kv=512", "bench.data=false", "hardware=cube",
                bench="decode_heads")
    assert eight["sim"]["latency_ns"] == one["sim"]["latency_ns"]
    pes = {r["pe"] for r in read_oplog(tmp_path / "8" / "op_log.jsonl")}
    assert pes == set(range(8))


PRESETS = {"llama3_8b": (32, 8, 128), "llama3_70b": (64, 8, 128), "llama31_405b": (128, 8, 128),
           "mistral_7b": (32, 8, 128), "qwen2_72b": (64, 8, 128), "qwen25_7b": (28, 4, 128),
           "gemma2_9b": (16, 8, 256)}


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_model_presets_set_the_published_heads(model):
    cfg = compose_cfg(f"+model={model}", "hardware.n_pes=8", bench="decode_heads")
    wl = validate(cfg)
    b = cfg.bench
    assert (b.model, b.H_q, b.H_kv, b.d) == (model, *PRESETS[model])
    assert wl.G == PRESETS[model][0] // PRESETS[model][1]


def test_a_preset_applies_whatever_its_place_on_the_command_line():
    assert presets_after_bench(["+model=gemma2_9b", "+bench=decode_heads", "bench.S_kv=9"]) == [
        "+bench=decode_heads", "+model=gemma2_9b", "bench.S_kv=9"]
    assert presets_after_bench(["-m", "+model=a,b", "x=1", "+bench=decode_heads,decode_splitk"]) == [
        "-m", "x=1", "+bench=decode_heads,decode_splitk", "+model=a,b"]
    same = ["+bench=decode_heads", "+model=llama3_8b"]
    assert presets_after_bench(same) == same and presets_after_bench(["+model=x"]) == ["+model=x"]


# ---- inputs files: the batch is taken from the file ----------------------------------

def _stacked(path, lengths, H_q, H_kv, d=16, with_lengths=True, seed=3):
    r = np.random.default_rng(seed)
    rows = H_kv * sum(lengths)
    arrays = {"q": r.standard_normal((len(lengths) * H_q, d)), "k": r.standard_normal((rows, d)),
              "v": r.standard_normal((rows, d))}
    if with_lengths:
        arrays["S_kv"] = np.array(lengths)
    np.savez(path, **arrays)
    return arrays


@pytest.mark.parametrize("bench", ["decode_heads", "decode_splitk"])
def test_a_file_with_its_lengths_gives_the_whole_batch(tmp_path, bench):
    """q, k, v and the lengths S_kv (ragged, one empty): B, H_q, H_kv, d and S_kv are the
    file's, whatever the bench's defaults (64 / 8 heads, d 128, 4096 keys), and every head
    matches float64."""
    lengths, path = [40, 0, 23], tmp_path / "in.npz"
    a = _stacked(path, lengths, H_q=6, H_kv=2)
    m = run(tmp_path / "run", "hardware=cube", f"bench.inputs.path={path}", "bench.tile=16", bench=bench)
    s = m["shape"]
    assert (s["B"], s["H_q"], s["H_kv"], s["d"], s["S_kv"]) == (3, 6, 2, 16, lengths)
    out = load_out(tmp_path / "run")["out"]
    want = _ref_per_item({**a, "scale": np.array(1 / math.sqrt(16))}, 6, 2, lengths)
    np.testing.assert_allclose(out, want, atol=TOL, rtol=TOL)


def test_a_file_without_lengths_gives_an_equal_length_batch_for_the_keys_heads(tmp_path):
    path = tmp_path / "in.npz"
    _stacked(path, [30] * 4, H_q=8, H_kv=2, with_lengths=False)
    m = run(tmp_path / "run", "hardware=cube", f"bench.inputs.path={path}", "bench.H_q=8", "bench.H_kv=2",
            "bench.tile=16", bench="decode_heads")
    assert (m["shape"]["B"], m["shape"]["S_kv"], m["shape"]["d"]) == (4, 30, 16)


def test_inputs_files_that_fit_no_batch_are_one_line(tmp_path):
    from kbframe.errors import InputsError
    from kbframe.run.bench import run_bench
    path = tmp_path / "in.npz"
    _stacked(path, [30] * 4, H_q=8, H_kv=2, with_lengths=False)
    with pytest.raises(InputsError) as e:
        run(tmp_path / "a", f"bench.inputs.path={path}", bench="decode_heads")
    assert str(e.value) == (
        f"bench.inputs.path: shapes in '{path}' (q (32, 16), k (240, 16)) fit no batch of H_q=64, H_kv=8 (q needs "
        f"B·H_q rows, k and v H_kv·B·S_kv); set bench.H_q and bench.H_kv (+model=NAME), or store the sequence "
        f"lengths in the file as an integer array 'S_kv'")
    _stacked(path, [30, 10], H_q=8, H_kv=2)
    np.savez(path, **{**dict(np.load(path)), "S_kv": np.array([30, 11])})
    with pytest.raises(InputsError) as e:
        run(tmp_path / "b", f"bench.inputs.path={path}", bench="decode_heads")
    assert str(e.value) == (f"bench.inputs.path: shapes in '{path}' (q rows 16, k rows 80) do not fit its S_kv "
                            f"[30, 11]: need q B·H_q rows and k, v H_kv·ΣS_kv rows, H_kv dividing H_q")
    np.savez(path, **{**dict(np.load(path)), "S_kv": np.array([30.0, 10.0])})
    with pytest.raises(InputsError) as e:
        run(tmp_path / "c", f"bench.inputs.path={path}", bench="decode_heads")
    assert str(e.value) == (f"bench.inputs.path: '{path}' S_kv must be the sequence lengths, integers >= 0 (one "
                            f"per sequence), got array([30., 10.])")
    np.savez(path, **{**dict(np.load(path)), "S_kv": np.array([30, 10])})
    cfg = compose_cfg("run.progress=false", f"bench.inputs.path={path}", "bench.H_q=16", bench="decode_heads")
    with pytest.raises(InputsError) as e:
        run_bench(cfg, tmp_path / "d", {"bench.H_q"})
    assert str(e.value) == (f"bench.inputs.path: '{path}' contradicts explicit shape key(s): bench.H_q=16 but the "
                            f"file has H_q=8 (drop the key(s) to use the file's shapes)")
    assert not any((tmp_path / n).exists() for n in "abcd")
