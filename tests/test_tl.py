"""tl layer: tl.composite lowering of softmax_merge (DDD-0065 §6) and the emit-time errors
(ADR-0065 D6, Test Requirements 2, 8, 9, 10, 11)."""
import numpy as np
import pytest

from kbframe.ir.commands import CompositeCmd, PrimitiveCmd, Scope
from kbframe.errors import ValidationError

from conftest import emit

G, TILE, D = 8, 64, 128
TENSORS = {"q": np.ones((G, D)), "k": np.ones((TILE, D)), "v": np.ones((TILE, D)),
           "S": np.ones((G, TILE)), "out": np.zeros((G, D))}
MERGE_KINDS = ["rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma", "mul_bcast", "copy"]


def _state(tl):
    s = tl.empty((G, TILE), "S_j")
    m = tl.full((G, 1), float("-inf"), "m")
    l = tl.zeros((G, 1), "l")
    O = tl.zeros((G, D), "O")
    return s, m, l, O


def _merge(tl, hs, **kw):
    s, m, l, O = hs["s"], hs["m"], hs["l"], hs["O"] = _state(tl)
    args = dict(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}],
                op="gemm", b=tl.ref("v"), out=O, epilogue=[{"op": "add", "other": O}])
    args.update(kw)
    hs["ret"] = tl.composite(**args)


def _lower(tmp_path, **kw):
    hs = {}
    cmds, sim = emit(lambda tl: _merge(tl, hs, **kw), tmp_path, TENSORS)
    return cmds, hs, sim


def test_adr0065_tr2_softmax_merge_lowers_to_10_ops(tmp_path):
    cmds, hs, _ = _lower(tmp_path)
    assert [type(c) for c in cmds] == [PrimitiveCmd] * 3 + [CompositeCmd]  # fill m, l, O; #2
    cmd = cmds[-1]
    assert [op.kind for op in cmd.ops] == MERGE_KINDS + ["gemm", "add"]
    assert len(cmd.ops) == 10
    assert [op.scope for op in cmd.ops] == [Scope.KERNEL] * 9 + [Scope.OUTPUT_TILE]
    m, l, O = hs["m"], hs["l"], hs["O"]
    assert len(cmd.rw_handles) == 3
    assert all(x is y for x, y in zip(cmd.rw_handles, (m, l, O)))


def test_ddd0065_s10_recipe_lowering_operands_and_addresses(tmp_path):
    cmds, hs, _ = _lower(tmp_path)
    cmd = cmds[-1]
    s, m, l, O = hs["s"], hs["m"], hs["l"], hs["O"]
    ops = cmd.ops
    m_loc, m_new, corr, P, l_loc = ops[0].out, ops[1].out, ops[2].out, ops[3].out, ops[4].out
    wiring = [(op.kind, dict(op.operands), op.out, op.extra) for op in ops[:8]]
    assert wiring == [
        ("rmax", {"src": s}, m_loc, {"reduce_axis": -1}),
        ("max_elem", {"src_a": m, "src_b": m_loc}, m_new, {}),
        ("exp_diff", {"src_a": m, "src_b": m_new}, corr, {}),
        ("exp_diff", {"src_a": s, "src_b": m_new}, P, {"bcast_axis": 0}),
        ("rsum", {"src": P}, l_loc, {"reduce_axis": -1}),
        ("fma", {"src_a": l, "src_b": corr, "src_c": l_loc}, l, {}),
        ("mul_bcast", {"src_a": O, "src_b": corr}, O, {"bcast_axis": 1}),
        ("copy", {"src": m_new}, m, {}),
    ]
    # scratch shapes derived from the operands; all in TCM, distinct, at concrete addresses
    assert [h.shape for h in (m_loc, m_new, corr, P, l_loc)] == [(G, 1), (G, 1), (G, 1), (G, TILE), (G, 1)]
    assert P.dtype == s.dtype == "float16"
    scratch = (m_loc, m_new, corr, P, l_loc)
    assert len({id(h) for h in scratch}) == 5
    for op in ops:
        for h in (*op.operands.values(), *([op.out] if op.out is not None else [])):
            assert isinstance(h.addr, int) and h.addr >= 0, (op.kind, h)
    assert all(h.space == "tcm" for h in scratch)
    # P auto-bound to the GEMM's a; b is the V tile in HBM; out and the add target are O
    gemm, add = ops[8], ops[9]
    assert gemm.operands["a"] is P and gemm.operands["b"].space == "hbm"
    assert gemm.out is O and gemm.extra == {"m": G, "k": TILE, "n": D}
    assert add.operands == {"other": O} and add.out is None
    # returns the output handle, pending on this composite (chainable like tl.dot)
    assert hs["ret"] is O and O.pending is cmd.completion


def test_adr0065_tr9_composite_within_cap(tmp_path):
    cmds, _, _ = _lower(tmp_path)
    # ops: rmax 24 (1 operand + out + 1 scalar), max_elem 28, exp_diff 28, exp_diff 32 (bcast_axis),
    #      rsum 24, fma 36, mul_bcast 32, copy 20 → 224; gemm 40; add 12 → 276
    # composite: 4 + 1 + 276 + 1 + 8·3 rw = 306
    assert [op.logical_bytes for op in cmds[-1].ops] == [24, 28, 28, 32, 24, 36, 32, 20, 40, 12]
    assert cmds[-1].logical_bytes == 306
    assert cmds[-1].logical_bytes < 1024


def test_adr0065_tr10_auto_bind_conflict(tmp_path):
    hs = {}

    def kern(tl):
        a = tl.empty((G, TILE), "A")
        _merge(tl, hs, a=a)

    with pytest.raises(ValidationError) as e:
        emit(kern, tmp_path, TENSORS)
    assert str(e.value) == ("auto-bind conflict: prologue recipe declares primary_out 'softmax_merge.P', which "
                            "binds to the GEMM's a, but a=<tcm:A (8, 64)> was also given (ADR-0065 D6.6)")


def test_adr0065_tr11_math_operand_must_be_tcm(tmp_path):
    """As built (DDD §0, §6 step 8): D6.7 applies to prologue recipe operands; an HBM handle
    there is refused at emit."""
    def kern(tl):
        s, m, l, O = _state(tl)
        tl.composite(prologue=[{"op": "softmax_merge", "s": tl.ref("S"), "m": m, "l": l, "O": O}],
                     op="gemm", b=tl.ref("v"), out=O)

    with pytest.raises(ValidationError) as e:
        emit(kern, tmp_path, TENSORS)
    assert str(e.value) == ("MATH operand must be TCM: recipe 'softmax_merge' operand 's' is "
                            "<hbm:S (8, 64)> (ADR-0065 D6.7; tl.load it first)")


def test_adr0065_tr8_two_gemms_rejected(tmp_path):
    """A recipe whose engine_seq has a GEMM, plus the head GEMM → two GEMMs (D6.1)."""
    recipes = {"pre_mm": {"operands": {"x": "R", "w": "R"},
                          "primary_out": {"name": "Y", "from_shape": "x"},
                          "engine_seq": [{"engine": "GEMM", "op": "gemm", "src_a": "x", "src_b": "w",
                                          "dst": "Y"}]}}

    def kern(tl):
        x, w = tl.zeros((G, G), "x"), tl.zeros((G, G), "w")
        tl.composite(prologue=[{"op": "pre_mm", "x": x, "w": w}], op="gemm", b=tl.zeros((G, D), "B"))

    with pytest.raises(ValidationError) as e:
        emit(kern, tmp_path, TENSORS, recipes=recipes)
    assert str(e.value) == "two GEMMs in one composite (2 gemm ops in [gemm, gemm]); at most one (ADR-0065 D6.1)"


def test_over_cap_composite_is_an_error_not_segmented(tmp_path):
    hs = {}
    with pytest.raises(ValidationError) as e:
        emit(lambda tl: _merge(tl, hs), tmp_path, TENSORS, overrides=["calibration.cap_bytes=305"])
    assert str(e.value) == (
        "composite over the size cap: 306 logical bytes > cap 305 (calibration.cap_bytes); "
        "ops [rmax,max_elem,exp_diff,exp_diff,rsum,fma,mul_bcast,copy,gemm,add]; "
        "split it (no silent segmentation, ADR-0064 D7)")
    # exactly at the cap is fine
    cmds, _ = emit(lambda tl: _merge(tl, {}), tmp_path, TENSORS, overrides=["calibration.cap_bytes=306"])
    assert cmds[-1].logical_bytes == 306


def test_over_cap_error_dispatches_nothing(tmp_path):
    """No silent segmentation: the kernel stops at the over-cap composite, nothing of it is sent."""
    sent = []

    def kern(tl):
        try:
            _merge(tl, {})
        except ValidationError:
            sent.append("raised")
            raise

    with pytest.raises(ValidationError):
        emit(kern, tmp_path, TENSORS, overrides=["calibration.cap_bytes=100"])
    assert sent == ["raised"]
    cmds, _ = emit(lambda tl: _state(tl), tmp_path, TENSORS)
    assert len(cmds) == 3  # only the fills exist without the composite


@pytest.mark.parametrize("change, message", [
    ({"op": "softmax_mrege"}, "unknown recipe 'softmax_mrege' (known: lse_merge, rmsnorm, softmax_merge, swiglu)"),
    ({"O": None}, "recipe 'softmax_merge': missing operand(s) ['O']"),
    ({"x": "O"}, "recipe 'softmax_merge': unknown operand(s) ['x'] (takes ['s', 'm', 'l', 'O'])"),
], ids=["unknown_recipe", "missing_recipe_operand", "extra_recipe_operand"])
def test_bad_recipe_item(tmp_path, change, message):
    def kern(tl):
        s, m, l, O = _state(tl)
        item = {"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}
        for key, val in change.items():
            if val is None:
                del item[key]
            else:
                item[key] = O if val == "O" else val
        tl.composite(prologue=[item], op="gemm", b=tl.ref("v"), out=O)

    with pytest.raises(ValidationError) as e:
        emit(kern, tmp_path, TENSORS)
    assert str(e.value) == message


def test_recipe_operand_shape_mismatch_names_step(tmp_path):
    """m of shape (G, 3): max_elem broadcasts m_new to (G, 3), which exp_diff (step 4) cannot
    broadcast against s (G, TILE); the error names the recipe file and the step."""
    def kern(tl):
        s, _, l, O = _state(tl)
        m = tl.zeros((G, 3), "m3")
        tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}], op="gemm",
                     b=tl.ref("v"), out=O)

    with pytest.raises(ValidationError) as e:
        emit(kern, tmp_path, TENSORS)
    assert str(e.value) == ("recipe 'softmax_merge' (recipes/softmax_merge.yaml) step 4 (exp_diff): "
                            "shapes (8, 64) and (8, 3) do not broadcast")


def test_composite_op_must_be_gemm_or_none(tmp_path):
    with pytest.raises(ValidationError) as e:
        emit(lambda tl: tl.composite(op="math", a=tl.ref("q")), tmp_path, TENSORS)
    assert str(e.value) == "tl.composite: op must be 'gemm' or None, got 'math'"


def test_composite_out_omitted_is_auto_tcm_and_chainable(tmp_path):
    hs = {}

    def kern(tl):
        q = tl.load(tl.ref("q"))
        hs["s"] = tl.composite(op="gemm", a=q, b=tl.ref("k").T, epilogue=[{"op": "scale", "factor": 0.5}])
        hs["p"] = tl.exp_diff(hs["s"], tl.rmax(hs["s"]))

    cmds, _ = emit(kern, tmp_path, TENSORS)
    s = hs["s"]
    assert s.space == "tcm" and s.shape == (G, TILE) and s.pending is cmds[1].completion
    assert cmds[2].op.operands["src"] is s  # rmax consumes the composite's output handle


def test_composite_out_ptr_is_hbm_shorthand(tmp_path):
    hs = {}

    def kern(tl):
        hs["o"] = tl.composite(op="gemm", a=tl.load(tl.ref("S")), b=tl.ref("v"), out_ptr="out")

    cmds, sim = emit(kern, tmp_path, TENSORS)
    assert hs["o"] is sim.engine.hbm["out"] and hs["o"].space == "hbm"
    assert cmds[-1].ops[0].out is hs["o"]


def test_recipe_scratch_in_scratch_scope_is_freed(tmp_path):
    marks = {}

    def kern(tl):
        s, m, l, O = _state(tl)
        top0 = tl.pe.tcm.top
        with tl.scratch_scope():
            tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}], op="gemm",
                         b=tl.ref("v"), out=O, epilogue=[{"op": "add", "other": O}])
            marks["inside"] = tl.pe.tcm.top - top0
        marks["after"] = tl.pe.tcm.top - top0

    emit(kern, tmp_path, TENSORS)
    # 4 row vectors (8·1·2 B = 16 → 64 B aligned) + P (8·64·2 = 1024 B) = 4·64 + 1024 = 1280 B
    assert marks == {"inside": 1280, "after": 0}


def test_recipe_scratch_outside_scope_reuses_arena_slots(tmp_path):
    cmds = []

    def kern(tl):
        s, m, l, O = _state(tl)
        for _ in range(2):
            tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}], op="gemm",
                         b=tl.ref("v"), out=O)
        cmds.append(tl.pe.tcm.top)

    got, _ = emit(kern, tmp_path, TENSORS)
    a, b = got[-2], got[-1]
    assert a.ops[3].out is b.ops[3].out  # the same P slot both times


def test_scope_scratch_at_the_same_address_is_reused_with_its_ops(tmp_path):
    """Per-tile scopes: the recipe's scratch lands at the same TCM address every time, so
    its handles and the prologue OpSpecs naming them are reused (tl._scratch); each scope
    still allocates (and frees) its scratch in the TCM record. A scratch slot that lands
    elsewhere (an extra buffer allocated first) gets a new handle and new ops."""
    def kern(tl):
        s, m, l, O = _state(tl)
        for shift in (False, False, True):
            with tl.scratch_scope():
                if shift:
                    tl.empty((G, 1), "extra")
                tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}], op="gemm",
                             b=tl.ref("v"), out=O, epilogue=[{"op": "add", "other": O}])

    cmds, sim = emit(kern, tmp_path, TENSORS)
    a, b, c = cmds[-3:]
    assert [op.kind for op in a.ops[:8]] == MERGE_KINDS
    assert a.ops[:8] == b.ops[:8] and all(x is y for x, y in zip(a.ops[:8], b.ops[:8]))
    assert a.ops[3].out is b.ops[3].out  # P
    assert a.ops[3].out is not c.ops[3].out and a.ops[3].out.addr + 64 == c.ops[3].out.addr
    assert not any(x is y for x, y in zip(a.ops[:8], c.ops[:8]))
    assert a.ops[8] is not b.ops[8]  # the GEMM op is built per call
    # 5 scratch allocations (m_loc, m_new, corr, l_loc, P) per scope, 1 extra in the third
    names = [r[0] for r in sim.pe.tcm.allocations]
    assert names[4:] == ["softmax_merge.m_loc", "softmax_merge.m_new", "softmax_merge.corr",
                         "softmax_merge.l_loc", "softmax_merge.P"] * 2 + ["extra", "softmax_merge.m_loc",
                         "softmax_merge.m_new", "softmax_merge.corr", "softmax_merge.l_loc", "softmax_merge.P"]


@pytest.mark.parametrize("other_shape, msg", [
    ((3, 3), "epilogue 'add': shapes (8, 64) and (3, 3) do not broadcast (out <tcm:composite_out (8, 64)>)"),
    ((8, 64, 2), "epilogue 'add': shapes (8, 64) and (8, 64, 2) do not broadcast (out <tcm:composite_out (8, 64)>)"),
])
def test_epilogue_operand_shape_checked_at_emit(tmp_path, other_shape, msg):
    """An epilogue operand that cannot combine with the GEMM output is an emit-time error (it
    used to surface as a numpy error mid-simulation, or not at all in timing mode)."""
    with pytest.raises(ValidationError) as e:
        emit(lambda tl: tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.ref("k").T,
                                     epilogue=[{"op": "add", "other": tl.zeros(other_shape, "bad")}]),
             tmp_path, TENSORS)
    assert str(e.value) == msg


def test_epilogue_result_must_keep_out_shape(tmp_path):
    with pytest.raises(ValidationError) as e:
        emit(lambda tl: tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.zeros((D, 1), "col"),
                                     epilogue=[{"op": "add", "other": tl.zeros((G, 5), "wide")}]),
             tmp_path, TENSORS)
    assert str(e.value) == "epilogue 'add': result shape (8, 5) differs from out <tcm:composite_out (8, 1)>"


def test_scope_empty_at_the_same_address_is_one_handle_and_its_math_ops_one_opspec(tmp_path):
    """opt3's per-tile scratch: tl.empty in a scope at the address an earlier scope used
    (same shape, name) returns that scope's handle, and a MATH op on the same handles is
    the same OpSpec (tl.math), so its sizes and byte ranges are computed once. A tensor
    that lands elsewhere (one more allocation first) is a new handle with a new op; ops
    with scalars (scale) are built per call."""
    outs = []

    def kern(tl):
        m = tl.full((G, 1), 0.0, "m")
        for shift in (False, False, True):
            with tl.scratch_scope():
                if shift:
                    tl.empty((G, 1), "extra")
                x = tl.empty((G, TILE), "x")
                r = tl.rmax(x)
                tl.maximum(m, r, out=m)
                outs.append((x, r, tl.scale(x, 0.5)))

    cmds, sim = emit(kern, tmp_path, TENSORS)
    ops = [c.op for c in cmds[1:]]
    assert [op.kind for op in ops] == ["rmax", "max_elem", "scale"] * 3
    (x1, r1, s1), (x2, r2, s2), (x3, r3, _) = outs
    assert x1 is x2 and r1 is r2 and s1 is s2
    assert ops[0] is ops[3] and ops[1] is ops[4]
    assert ops[2] is not ops[5] and ops[2].extra == ops[5].extra == {"factor": 0.5}
    assert x3 is not x1 and x3.addr == x1.addr + 64 and ops[6] is not ops[0]
    assert [r[0] for r in sim.pe.tcm.allocations][1:] == ["x", "rmax", "scale"] * 2 + ["extra", "x", "rmax", "scale"]
