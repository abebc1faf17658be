"""Stage plans from flat ops (kbframe.hw.tiling.plan_stages; DDD-0065 §7, ADR-0065 D3/D4/D8,
Test Requirements 1 and 5)."""
import numpy as np
import pytest

from kbframe.hw.tiling import plan_stages
from kbframe.sim.numerics import Numerics

from conftest import Sim, emit

G, TILE, D = 8, 64, 128
TENSORS = {"q": np.ones((G, D)), "k": np.ones((TILE, D)), "v": np.ones((TILE, D)),
           "x": np.ones((G, 256)), "w": np.ones((256, 256)), "out": np.zeros((G, D))}
MERGE = ["rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma", "mul_bcast", "copy"]


def _plan(cmd, sim):
    stages = plan_stages(cmd, sim.pe.stage_units, Numerics())
    return stages


def _rows(stages):
    return [(s.unit.name, s.op_kind, s.tile, s.nbytes) for s in stages]


def _preds(stages):
    """For each stage, the indices of the stages it waits on."""
    idx = {id(s): i for i, s in enumerate(stages)}
    preds = [[] for _ in stages]
    for i, s in enumerate(stages):
        for t in s.succs:
            preds[idx[id(t)]].append(i)
    return preds


def _merge_kernel(out_hbm: bool):
    def kern(tl):
        s = tl.empty((G, TILE), "S_j")
        m, l, O = tl.full((G, 1), float("-inf"), "m"), tl.zeros((G, 1), "l"), tl.zeros((G, D), "O")
        out = tl.ref("out") if out_hbm else O
        tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}],
                     op="gemm", b=tl.ref("v"), out=out, epilogue=[{"op": "add", "other": O}])
    return kern


def test_ddd0065_s10_plan_softmax_merge_composite(tmp_path):
    """8 prologue MATH stages, no prologue DMA, one DMA_READ (V), GEMM, add; no DMA_WRITE."""
    cmds, sim = emit(_merge_kernel(out_hbm=False), tmp_path, TENSORS)
    stages = _plan(cmds[-1], sim)
    # bytes: MATH stages read their operands and write their out (fp16):
    #   rmax s 1024 + m_loc 16 = 1040; max_elem 3·16 = 48; exp_diff 48; exp_diff s 1024 + 16 + P 1024
    #   = 2064; rsum 1024 + 16 = 1040; fma 4·16 = 64; mul_bcast O 2048 + 16 + O 2048 = 4112; copy 32
    #   V tile 64·128·2 = 16384; GEMM (8·64 + 64·128)·2 = 17408; add reads O: 2048
    assert _rows(stages) == [
        ("math", "rmax", -1, 1040), ("math", "max_elem", -1, 48), ("math", "exp_diff", -1, 48),
        ("math", "exp_diff", -1, 2064), ("math", "rsum", -1, 1040), ("math", "fma", -1, 64),
        ("math", "mul_bcast", -1, 4112), ("math", "copy", -1, 32),
        ("dma_read", "dma_read", 0, 16384), ("gemm", "gemm", 0, 17408), ("math", "add", 0, 2048)]
    prologue = stages[:8]
    assert all(s.unit.name == "math" for s in prologue)
    assert [s.op_kind for s in prologue] == MERGE
    assert sum(s.unit.name == "dma_read" for s in stages) == 1
    assert not any(s.unit.name == "dma_write" for s in stages)
    # the prologue is a chain; the V DMA waits for the last prologue op (K-before-V, D6.2);
    # the GEMM waits for the V DMA; the add for the GEMM
    assert _preds(stages) == [[], [0], [1], [2], [3], [4], [5], [6], [7], [8], [9]]
    # MATH sizes: n = max elements touched (s (8,64) = 512 → 8 cycles; O (8,128) → 16 cycles)
    assert [s.n_elements for s in prologue] == [512, 8, 8, 512, 512, 8, 1024, 8]


def test_adr0065_tr5_dma_write_only_for_hbm_out(tmp_path):
    cmds, sim = emit(_merge_kernel(out_hbm=True), tmp_path, TENSORS)
    stages = _plan(cmds[-1], sim)
    # out (8, 128) fp16 = 2048 B written once, after the add epilogue
    assert _rows(stages)[-3:] == [("gemm", "gemm", 0, 17408), ("math", "add", 0, 2048),
                                  ("dma_write", "dma_write", 0, 2048)]
    assert _preds(stages)[-1] == [len(stages) - 2]


@pytest.mark.parametrize("a_hbm, b_hbm, n_reads", [(False, True, 1), (False, False, 0), (True, True, 2)])
def test_adr0065_tr5_dma_read_only_for_hbm_operands(tmp_path, a_hbm, b_hbm, n_reads):
    """DMA from ``space`` alone (DESIGN.md decision 2): tl.ref → DMA_READ; tl.load'ed → none."""
    def kern(tl):
        a = tl.ref("q") if a_hbm else tl.load(tl.ref("q"))
        b = tl.ref("k").T if b_hbm else tl.load(tl.ref("k")).T
        tl.composite(op="gemm", a=a, b=b, epilogue=[{"op": "scale", "factor": 0.5}])

    cmds, sim = emit(kern, tmp_path, TENSORS)
    stages = _plan(cmds[-1], sim)
    reads = [s for s in stages if s.unit.name == "dma_read"]
    assert len(reads) == n_reads
    # a = q (8, 128) → 2048 B; b = Kᵀ (128, 64) → 16384 B
    assert sorted(s.nbytes for s in reads) == sorted(([2048] if a_hbm else []) + ([16384] if b_hbm else []))
    assert [s.op_kind for s in stages if s.unit.name != "dma_read"] == ["gemm", "scale"]


def test_adr0065_tr1_ddd0065_s10_refactor_safety_legacy_composite(tmp_path):
    """The legacy shape tl.composite(op="gemm", a, b, epilogue=[...]) lowers to flat ops
    (gemm, then the epilogue op) and runs the same unit sequence and numbers as the
    primitive path (load, dot, scale)."""
    rng = np.random.default_rng(0)
    t = {"q": rng.standard_normal((G, D)), "k": rng.standard_normal((TILE, D))}
    hs = {}

    def legacy(tl):
        hs["s"] = tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.ref("k").T,
                               epilogue=[{"op": "scale", "factor": 0.125}])

    def prim(tl):
        hs["s"] = tl.scale(tl.dot(tl.load(tl.ref("q")), tl.load(tl.ref("k")).T), 0.125)

    cmds, sim = emit(legacy, tmp_path, t)
    assert [(o.kind, o.scope.name) for o in cmds[-1].ops] == [("gemm", "KERNEL"), ("scale", "OUTPUT_TILE")]
    seqs, vals = [], []
    for i, kern in enumerate((legacy, prim)):
        d = tmp_path / str(i)
        d.mkdir()
        s = Sim(d, t)
        log = s.run(kern)
        seqs.append([(r["unit"], r["op_kind"]) for r in log if r["unit"] not in ("cpu", "scheduler")])
        vals.append(s.read(hs["s"]))
    assert seqs[0] == [("dma_read", "dma_read"), ("dma_read", "dma_read"), ("gemm", "gemm"), ("math", "scale")]
    assert sorted(seqs[0]) == sorted(seqs[1])
    np.testing.assert_array_equal(vals[0], vals[1])
    np.testing.assert_allclose(vals[0], (t["q"] @ t["k"].T) * 0.125, rtol=1e-5, atol=1e-5)


def test_no_gemm_composite_runs_ops_in_order(tmp_path):
    def kern(tl):
        s = tl.empty((G, TILE), "S_j")
        m, l, O = tl.full((G, 1), float("-inf"), "m"), tl.zeros((G, 1), "l"), tl.zeros((G, D), "O")
        tl.composite(op=None, prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}])

    cmds, sim = emit(kern, tmp_path, TENSORS)
    assert [o.kind for o in cmds[-1].ops] == MERGE
    stages = _plan(cmds[-1], sim)
    assert [s.op_kind for s in stages] == MERGE
    assert _preds(stages) == [[], [0], [1], [2], [3], [4], [5], [6]]


def test_tile_loop_k_tile_and_output_tile_ops(tmp_path):
    """x (8, 256) @ w (256, 256) with 128-element GEMM tiles: 2 output tiles × 2 K tiles.
    K_TILE ops follow every K step; OUTPUT_TILE ops and the DMA_WRITE each output tile."""
    def kern(tl):
        x = tl.load(tl.ref("x"))
        tl.composite(op="gemm", a=x, b=tl.ref("w"), out=tl.ref("out2"),
                     epilogue=[{"op": "scale", "factor": 2.0, "scope": "k_tile"},
                               {"op": "scale", "factor": 0.5}])

    t = dict(TENSORS, out2=np.zeros((G, 256)))
    cmds, sim = emit(kern, tmp_path, t)
    stages = _plan(cmds[-1], sim)
    # w tile (128 × 128) fp16 = 32768 B; GEMM stage (8·128 + 128·128)·2 = 34816 B; out tile 8·128·2 = 2048 B
    per_out_tile = lambda t0: [
        ("dma_read", "dma_read", t0, 32768), ("gemm", "gemm", t0, 34816), ("math", "scale", t0, 0),
        ("dma_read", "dma_read", t0 + 1, 32768), ("gemm", "gemm", t0 + 1, 34816),
        ("math", "scale", t0 + 1, 0), ("math", "scale", t0 + 1, 0), ("dma_write", "dma_write", t0 + 1, 2048)]
    assert _rows(stages) == per_out_tile(0) + per_out_tile(2)
    gemms = [s for s in stages if s.unit.name == "gemm"]
    assert [g.flops for g in gemms] == [2 * 8 * 128 * 128] * 4


def test_head_math_op_stages_hbm_operand_by_dma(tmp_path):
    """The head op keeps DMA staging from HBM (DDD §0, D6.7 as built): tl.math on an HBM
    operand plans a DMA_READ, then the MATH stage."""
    cmds, sim = emit(lambda tl: tl.scale(tl.ref("q"), 2.0), tmp_path, TENSORS)
    stages = _plan(cmds[-1], sim)
    # q (8, 128) fp16 = 2048 B in; the MATH stage reads 2048 and writes 2048
    assert _rows(stages) == [("dma_read", "dma_read", -1, 2048), ("math", "scale", -1, 4096)]
    assert _preds(stages) == [[], [0]]


def test_kernel_scope_op_after_gemm_runs_once_after_tile_loop(tmp_path):
    """ADR-0065 D3: a KERNEL op after the GEMM runs once after the whole tile loop, on out.
    (Regression: it used to crash plan_stages with an AttributeError on ``out=None``.)"""
    rng = np.random.default_rng(3)
    t = {"x": rng.standard_normal((G, 256)), "w": rng.standard_normal((256, 256))}
    hs = {}

    def kern(tl):
        hs["o"] = tl.composite(op="gemm", a=tl.load(tl.ref("x")), b=tl.ref("w"),
                               epilogue=[{"op": "scale", "factor": 0.5, "scope": "kernel"}])
        hs["mx"] = tl.rmax(hs["o"])

    cmds, sim = emit(kern, tmp_path, t)
    comp = cmds[1]
    post = comp.ops[-1]
    assert (post.kind, post.scope.name, post.out is hs["o"], post.operands) == ("scale", "KERNEL", True,
                                                                                 {"src": hs["o"]})
    assert comp.rw_handles == (hs["o"],)
    stages = _plan(comp, sim)
    # 2 output tiles × 2 K tiles of (dma_read, gemm), then one scale on out (8, 256): n = 2048
    assert [(s.unit.name, s.op_kind, s.tile) for s in stages] == [
        ("dma_read", "dma_read", 0), ("gemm", "gemm", 0), ("dma_read", "dma_read", 1), ("gemm", "gemm", 1),
        ("dma_read", "dma_read", 2), ("gemm", "gemm", 2), ("dma_read", "dma_read", 3), ("gemm", "gemm", 3),
        ("math", "scale", -1)]
    assert _preds(stages)[-1] == [3, 7]  # after the last stage of each output tile
    assert stages[-1].n_elements == G * 256
    d = tmp_path / "run"
    d.mkdir()
    s = Sim(d, t)
    s.run(kern)
    want = (t["x"] @ t["w"]) * 0.5
    np.testing.assert_allclose(s.read(hs["o"]), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(s.read(hs["mx"])[:, 0], want.max(axis=1), rtol=1e-5, atol=1e-4)


def test_bad_epilogue_scope_is_a_validation_error(tmp_path):
    from kbframe.errors import ValidationError
    with pytest.raises(ValidationError) as e:
        emit(lambda tl: tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.ref("k").T,
                                     epilogue=[{"op": "scale", "factor": 2.0, "scope": "tile"}]),
             tmp_path, TENSORS)
    assert str(e.value) == "epilogue 'scale': scope must be one of ['kernel', 'k_tile', 'output_tile'], got 'tile'"


@pytest.mark.parametrize("N", [128, 256])
def test_broadcast_epilogue_operand_over_several_output_tiles(tmp_path, N):
    """A ``(G, 1)`` row vector as an epilogue operand (``div_bcast`` by l) is read whole in every
    output tile. (Regression: with N = 256 > tile_n = 128 the second tile sliced it to (8, 0)
    and the data-mode effect raised a numpy broadcast error.)"""
    rng = np.random.default_rng(4)
    t = {"x": rng.standard_normal((G, 64)), "w": rng.standard_normal((64, N)), "l": rng.random((G, 1)) + 1}
    hs = {}

    def kern(tl):
        hs["o"] = tl.composite(op="gemm", a=tl.load(tl.ref("x")), b=tl.ref("w"),
                               epilogue=[{"op": "div_bcast", "other": tl.load(tl.ref("l"))}])

    sim = Sim(tmp_path, t)
    log = sim.run(kern)
    assert [r["tile"] for r in log if r["op_kind"] == "div_bcast"] == list(range(N // 128))
    np.testing.assert_allclose(sim.read(hs["o"]), (t["x"] @ t["w"]) / t["l"], rtol=1e-5, atol=1e-5)


def _full_rows(stages):
    return [(s.unit, s.op_kind, s.cmd, s.tile, s.nbytes, s.flops, s.n_elements, s.deps) for s in stages]


@pytest.mark.parametrize("kernel, n_shapes", [("gqa_decode_opt2", 9), ("gqa_decode_opt3", 24)])
def test_plan_cache_copies_equal_fresh_plans(tmp_path, kernel, n_shapes):
    """Timing-only plan reuse (PlanCache): every command's copied plan equals a fresh plan
    of that command, stage by stage and edge by edge (successor order too: it sets FIFO
    order on the units); one template per command shape."""
    from kbframe.hw.tiling import PlanCache, plan_key
    from kbframe.kernels import gqa_decode
    S_kv = 16 * TILE + 16  # ragged last tile: a second shape per composite
    tensors = {"q": np.ones((G, D)), "k": np.ones((S_kv, D)), "v": np.ones((S_kv, D)), "out": np.zeros((G, D))}
    kern = getattr(gqa_decode, kernel)
    cmds, sim = emit(lambda tl: kern(tl, G=G, d=D, S_kv=S_kv, tile=TILE, scale=0.5), tmp_path, tensors)
    cache = PlanCache(plan_stages)
    for cmd in cmds:
        copied, fresh = cache.stages(cmd, sim.pe.stage_units, Numerics()), _plan(cmd, sim)
        assert _full_rows(copied) == _full_rows(fresh)
        assert _preds(copied) == _preds(fresh)
        assert [[copied.index(t) for t in s.succs] for s in copied] == \
            [[fresh.index(t) for t in s.succs] for s in fresh]
    # opt2: load q, fill (G,1), fill (G,d), #1 and #2 for full and ragged tiles, div, store
    assert len(cache.templates) == len({plan_key(c) for c in cmds}) == n_shapes


def test_plan_key_separates_shapes_and_spaces(tmp_path):
    """Commands that plan differently never share a key: another tile length, or an output
    in HBM instead of TCM (a DMA_WRITE more)."""
    from kbframe.ir.commands import CompositeCmd
    from kbframe.hw.tiling import plan_key

    def kern(tl):
        O = tl.zeros((G, D), "O")
        tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.ref("k").T, out=tl.empty((G, TILE)))
        tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.ref("k")[0:32].T, out=tl.empty((G, 32)))
        tl.composite(op="gemm", a=tl.empty((G, TILE)), b=tl.ref("v"), out=O)
        tl.composite(op="gemm", a=tl.empty((G, TILE)), b=tl.ref("v"), out=tl.ref("out"))
    cmds, _ = emit(kern, tmp_path, TENSORS)
    composites = [c for c in cmds if isinstance(c, CompositeCmd)]
    assert len(composites) == 4
    assert len({plan_key(c) for c in composites}) == 4


def test_plan_cache_stops_growing_at_its_bound(tmp_path):
    """Past ``max_templates`` shapes, new shapes are planned each time and not kept."""
    from kbframe.hw.tiling import PlanCache

    def kern(tl):
        for n in (8, 16, 24):
            tl.zeros((G, n), f"z{n}")
    cmds, sim = emit(kern, tmp_path, TENSORS)
    cache = PlanCache(plan_stages, max_templates=2)
    for cmd in cmds + cmds:
        assert _full_rows(cache.stages(cmd, sim.pe.stage_units, Numerics())) == _full_rows(_plan(cmd, sim))
    # each key is one fill op's (kind, scope, operand names, operand sigs, out sig)
    assert [k[0][4] for k in cache.templates] == [("tcm", (G, 8), G * 8 * 2), ("tcm", (G, 16), G * 16 * 2)]
