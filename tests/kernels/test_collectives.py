"""All-reduce over IPCQ (kbframe/kernels/collectives.py): every rank ends with the sum, in the
algorithm's fixed order, and the simulated time equals the α-β model exactly when the
ranks' partials are ready together and nothing else uses the links and units."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import Sim
from kbframe.kernels.collectives import ALGORITHMS, all_reduce, model_ps, plan
from kbframe.report.record_columns import as_records
from kbframe.tl.context import TL
from kbframe.timebase import bytes_to_ps


def _run(tmp_path, P, algorithm, hw="cube", first=0, rows=8, cols=4096):
    """Each rank's partial is (rank + 1)·2 everywhere, made by a long MATH op so that PE_CPU
    has dispatched the whole all-reduce before it is ready; ``(ns, model_ns, sums, phases)``."""
    sim = Sim(tmp_path, {}, data=True, overrides=(f"hardware={hw}",))
    eng = sim.engine
    pes = [first + i for i in range(P)]
    tls = {p: TL(eng.pes[p], eng.hbm, sim.recipes, "float16") for p in pes}
    out = {}

    def prog(p):
        tl = tls[p]
        y = tl.full((rows, cols), float(pes.index(p) + 1), "x")
        big = tl.full((256, 4096), 0.0, "big")
        tl.add(big, big, out=big)  # 16K cycles of MATH: PE_CPU runs ahead
        tl.add(y, y, out=y)
        all_reduce(tl, y, pes=pes, rank=pes.index(p), algorithm=algorithm)
        out[p] = y
    eng.run({p: (lambda p=p: prog(p)) for p in pes})
    sim.oplog.close()
    rec = as_records(sim.oplog.waits)
    done = {(rec.pe[i], rec.cmd[i]): rec.t1[i] for i in range(rec.n) if rec.unit[i] == "scheduler"}
    start = max(done[(p, tls[p].phases[0][3]["after"])] for p in pes)
    end = max(done[(p, tls[p].phases[0][2])] for p in pes)
    return end - start, tls[pes[0]].phases[0][3]["model_ps"], [sim.read(out[p]) for p in pes]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("P", [2, 4, 8])
def test_all_reduce_sums_on_every_rank_and_takes_its_model_time(tmp_path, algorithm, P):
    ns, model, sums = _run(tmp_path, P, algorithm)
    assert ns == model > 0
    for s in sums:
        np.testing.assert_array_equal(s, np.full((8, 4096), 2.0 * P * (P + 1) / 2))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_all_reduce_across_cubes_takes_its_model_time(tmp_path, algorithm):
    """16 ranks over two cubes of cube_mesh (die-to-die links on the ring), and 8 ranks
    straddling two cubes (PEs 4..11)."""
    for P, first in ((16, 0), (8, 4)):
        (tmp_path / f"{P}_{first}").mkdir()
        ns, model, sums = _run(tmp_path / f"{P}_{first}", P, algorithm, hw="cube_mesh", first=first)
        assert ns == model > 0
        np.testing.assert_array_equal(sums[-1], np.full((8, 4096), float(P * (P + 1))))


def test_the_model_on_equal_links_is_the_textbook_alpha_beta_form():
    """α = 16 ns, β⁻¹ = 256 GB/s, γ(n) = ⌈n/64⌉ ns: ring 2(P−1)(α + n/P·β) + (P−1)γ(n/P),
    tree ⌈log₂P⌉(2(α + nβ) + γ(n)), direct α + (P−1)nβ + (P−1)γ(n)."""
    n, isz, alpha, gbps = 8 * 4096, 2, 16_000, 256.0
    link = lambda a, b: (alpha, gbps)  # noqa: E731
    gamma = lambda k: -(-k // 64) * 1000  # noqa: E731
    t = lambda elems: bytes_to_ps(elems * isz, gbps)  # noqa: E731
    for P in (2, 4, 8):
        c = n // P
        assert model_ps(P, "ring", n, isz, link, gamma) == 2 * (P - 1) * (alpha + t(c)) + (P - 1) * gamma(c)
        rounds = (P - 1).bit_length()
        assert model_ps(P, "tree", n, isz, link, gamma) == rounds * (2 * (alpha + t(n)) + gamma(n))
        assert model_ps(P, "direct", n, isz, link, gamma) == alpha + (P - 1) * t(n) + (P - 1) * gamma(n)


def test_the_ring_plan_reduces_each_chunk_once_in_ring_order():
    """Reduce-scatter: chunk c is summed along the ring ending at rank c − 1 (P − 1 adds),
    then passed on: every rank receives P − 1 chunks in each half."""
    P = 4
    steps = plan(P, "ring")
    for r in range(P):
        kinds = [s[0] for s in steps[r]]
        assert kinds.count("send") == 2 * (P - 1) and kinds.count("recv") == 2 * (P - 1)
        assert kinds.count("add") == P - 1
        assert [s[3][1] for s in steps[r] if s[0] == "add"] == [(r - s - 1) % P for s in range(P - 1)]
    assert plan(1, "ring") == [[]]
    with pytest.raises(ValueError, match="unknown all-reduce algorithm 'bus'"):
        plan(2, "bus")
