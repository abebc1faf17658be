"""decode_splitk: split-K flash-decoding over PEs. The parts that need no IPCQ:
key ranges (even, chunked, empty splits), merge plans (rounds per topology), the PEs each
item uses, and a one-split run (no merge) identical to decode_opt2."""
import math

import numpy as np
import pytest

from conftest import compose_cfg, load_out, read_oplog, ref64, run
from kbframe.kernels.collectives import merge_plan
from kbframe.run.bench import validate


def _wl(*overrides):
    return validate(compose_cfg(*overrides, bench="decode_splitk"))


def test_even_split_covers_every_key_once_with_empty_splits_when_short():
    wl = _wl("hardware.n_pes=8")
    assert wl.splits == 8
    assert wl.ranges(3) == [(0, 0), (0, 0), (0, 1), (1, 1), (1, 1), (1, 2), (2, 2), (2, 3)]
    assert wl.ranges(9) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 9)]
    assert wl.ranges(4096) == [(512 * r, 512 * (r + 1)) for r in range(8)]
    for S in (1, 7, 65, 1000):
        keys = [j for a, b in wl.ranges(S) for j in range(a, b)]
        assert keys == list(range(S))


def test_chunked_split_leaves_trailing_splits_empty():
    wl = _wl("hardware.n_pes=8", "bench.splits=4", "bench.chunk=100", "bench.S_kv=250")
    assert wl.ranges(250) == [(0, 100), (100, 200), (200, 250), (250, 250)]
    assert wl.shape()["n_tiles"] == 2 + 2 + 1  # tiles of 64 per split: 100, 100, 50, 0 keys


def _depth(P, topology):
    """Merge steps on the longest path to rank 0: a rank merges its receives one after
    another, and a receive can be merged once its sender's partial is final."""
    plan = merge_plan(P, topology)
    done = {}

    def final(r):
        if r not in done:
            t = 0
            for action, p in plan[r]:
                if action == "recv":
                    t = max(t, final(p)) + 1
            done[r] = t
        return done[r]
    return final(0), plan


@pytest.mark.parametrize("P", [1, 2, 3, 5, 8, 32])
def test_merge_plans_merge_every_partial_once(P):
    """tree: ⌈log₂ P⌉ rounds; chain: P − 1; gather: P − 1 merges on rank 0 but one round of
    transfers (every rank sends to rank 0 at once)."""
    for topology, depth in (("tree", math.ceil(math.log2(P))), ("chain", P - 1), ("gather", P - 1)):
        got, plan = _depth(P, topology)
        assert got == depth, topology
        sends = [(r, p) for r, steps in enumerate(plan) for a, p in steps if a == "send"]
        recvs = sorted((p, r) for r, steps in enumerate(plan) for a, p in steps if a == "recv")
        assert sorted(sends) == recvs  # every send has its receive
        assert sorted(r for r, _ in sends) == list(range(1, P))  # every rank but 0 sends, once
        assert all(steps[-1][0] == "send" for steps in plan[1:])  # a send is a rank's last step
    assert all(p == 0 for steps in merge_plan(P, "gather")[1:] for _, p in steps)


def test_items_use_consecutive_pes():
    wl = _wl("+model=llama3_70b", "hardware=cube_mesh", "bench.splits=4", "bench.data=false")
    assert wl.splits == 4 and wl.shape()["pes"] == 32
    progs = wl.programs(lambda tl, **kw: None, lambda i: _FakeTL(i), None)
    assert sorted(progs) == list(range(32))


class _FakeTL:
    def __init__(self, i):
        self.i = i

    def ref(self, name):
        return _FakeHandle()


class _FakeHandle:
    def __getitem__(self, key):
        return self


def test_one_split_is_decode_opt2_byte_for_byte(tmp_path):
    run(tmp_path / "s", "bench.S_kv=130", "run.trace=false", bench="decode_splitk")
    run(tmp_path / "o", "bench.S_kv=130", "run.trace=false", bench="decode_opt2")
    assert (tmp_path / "s" / "op_log.jsonl").read_bytes() == (tmp_path / "o" / "op_log.jsonl").read_bytes()
    np.testing.assert_array_equal(load_out(tmp_path / "s")["out"], load_out(tmp_path / "o")["out"])


# ---- over IPCQ (hardware=cube / cube_mesh) ------------------------------------------------
SMALL = ("bench.H_q=4", "bench.H_kv=1", "bench.d=16", "bench.tile=16", "bench.inputs.peak=5")


def _ref_items(t, H_q, H_kv, lengths):
    G = H_q // H_kv
    out = np.zeros_like(t["out"])
    r = 0
    for b, S in enumerate(lengths):
        for h in range(H_kv):
            q0 = b * H_q + h * G
            if S:
                out[q0:q0 + G] = ref64(t["q"][q0:q0 + G], t["k"][r:r + S], t["v"][r:r + S], float(t["scale"]))
            r += S
    return out


@pytest.mark.parametrize("S_kv, merge, inner", [(1, "tree", "opt2"), (3, "chain", "opt3"), (7, "gather", "opt2"),
                                                (9, "tree", "opt3"), (65, "chain", "opt2"), (65, "gather", "opt3"),
                                                (65, "tree", "opt2")])
def test_split_over_8_pes_matches_float64_with_empty_and_ragged_splits(tmp_path, S_kv, merge, inner):
    """8 splits on one cube: S_kv < 8 leaves splits empty (their partial is the identity),
    65 keys make ragged splits of 8 and 9; the merged output is within 1e-5 of float64 and
    the sanitizer (run.check, with its IPCQ rules) passes."""
    m = run(tmp_path, "hardware=cube", "bench.splits=8", f"bench.merge={merge}", f"bench.S_kv={S_kv}",
            f"bench.inner={inner}", *SMALL, bench="decode_splitk")
    t = load_out(tmp_path)
    err = np.abs(t["out"] - _ref_items(t, 4, 1, [S_kv])).max()
    assert err <= 1e-5 and m["numerics"]["max_abs_err"] == pytest.approx(err, rel=1e-6, abs=1e-12)
    assert m["sanitizer"]["rules_checked"] > 0
    recs = read_oplog(tmp_path / "op_log.jsonl")
    # 7 partials sent, each as 3 messages (m, l, O), and as many received
    assert sum(r["op_kind"] == "send" for r in recs if r["unit"] == "ipcq_send") == 21
    assert sum(r["op_kind"] == "recv" for r in recs if r["unit"] == "ipcq_recv") == 21
    # only the splits with keys read K/V; every PE's q is loaded only if its split has keys
    readers = {r["pe"] for r in recs if r["unit"] == "dma_read"}
    assert readers == {p for p, (a, b) in enumerate(validate(compose_cfg(
        "hardware=cube", "bench.splits=8", f"bench.S_kv={S_kv}", bench="decode_splitk")).ranges(S_kv)) if b > a}


def test_heads_times_splits_with_an_empty_sequence_on_the_mesh(tmp_path):
    """A batch of 4 sequences (100, 0, 5, 300 keys) × 2 KV heads × 4 splits = 32 PEs of the
    2×2 mesh: every head within 1e-5, the empty sequence's output exactly 0."""
    lengths = [100, 0, 5, 300]
    m = run(tmp_path, "hardware=cube_mesh", "bench.splits=4", "bench.merge=tree", "bench.H_q=8", "bench.H_kv=2",
            "bench.d=16", "bench.tile=32", "bench.S_kv=[100,0,5,300]", bench="decode_splitk")
    t = load_out(tmp_path)
    assert m["shape"]["pes"] == 32 and t["out"].shape == (32, 16)
    np.testing.assert_array_equal(t["out"][8:16], 0.0)
    assert np.abs(t["out"] - _ref_items(t, 8, 2, lengths)).max() <= 1e-5


def test_tree_merges_faster_than_chain_and_split_k_beats_one_pe(tmp_path):
    """Timing only, one KV head of S_kv = 4096 on one cube: 8 splits take a fraction of one
    PE's time, and the tree (3 rounds) beats the chain (7 rounds)."""
    lat = {}
    for name, ov in (("one", ["bench.splits=1"]), ("tree", ["bench.merge=tree"]), ("chain", ["bench.merge=chain"])):
        lat[name] = run(tmp_path / name, "hardware=cube", "bench.data=false", "run.trace=false", *ov,
                        bench="decode_splitk")["sim"]["latency_ns"]
    assert lat["tree"] < lat["chain"] < lat["one"] / 4
