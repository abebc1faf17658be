"""decode_splitk (issue 12): split-K flash-decoding over PEs. The parts that need no IPCQ:
key ranges (even, chunked, empty splits), merge plans (rounds per topology), the PEs each
item uses, and a one-split run (no merge) identical to decode_opt2."""
import math

import numpy as np
import pytest

from conftest import compose_cfg, load_out, run
from kbframe.kernels.decode_splitk import merge_plan
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
