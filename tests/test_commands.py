"""DDD-0065 §4: OpSpec / CompositeCmd / PrimitiveCmd logical_bytes and the flat shape."""
import dataclasses


from kbframe.ir.commands import CompositeCmd, OpSpec, PrimitiveCmd, Scope, command_kind, hazard_ranges
from kbframe.ir.handles import Completion, TensorHandle


def _h(name, shape=(8, 128), space="tcm", addr=0):
    return TensorHandle(name, shape, "float16", space, addr, f"buf.{name}", shape)


A, B, O, M, L = (_h(n, addr=i * 4096) for i, n in enumerate("ABOML"))


def test_opspec_logical_bytes_formula():
    # 1 opcode + 1 scope + 1 count + 8/operand + 8 if out + 1 count + 4/scalar
    assert OpSpec("copy", Scope.KERNEL).logical_bytes == 1 + 1 + 1 + 0 + 0 + 1 + 0 == 4
    assert OpSpec("copy", Scope.KERNEL, {"src": A}, {}, O).logical_bytes == 3 + 8 + 8 + 1 == 20
    # GEMM: a, b, out, extra {m, k, n}: 3 + 16 + 8 + 1 + 12 = 40
    gemm = OpSpec("gemm", Scope.KERNEL, {"a": A, "b": B}, {"m": 8, "k": 64, "n": 128}, O)
    assert gemm.logical_bytes == 40
    # epilogue add: operand other, no out, no extra: 3 + 8 + 1 = 12
    assert OpSpec("add", Scope.OUTPUT_TILE, {"other": O}).logical_bytes == 12
    # epilogue scale: no operands, one scalar: 3 + 1 + 4 = 8
    assert OpSpec("scale", Scope.OUTPUT_TILE, {}, {"factor": 0.5}).logical_bytes == 8
    # fma: 3 operands + out: 3 + 24 + 8 + 1 = 36
    assert OpSpec("fma", Scope.KERNEL, {"src_a": L, "src_b": M, "src_c": L}, {}, L).logical_bytes == 36


def test_composite_logical_bytes_formula():
    gemm = OpSpec("gemm", Scope.KERNEL, {"a": A, "b": B}, {"m": 8, "k": 64, "n": 128}, O)
    scale = OpSpec("scale", Scope.OUTPUT_TILE, {}, {"factor": 0.5})
    c = CompositeCmd(Completion(1, "composite"), (gemm, scale))
    # 4 framing + 1 count + (40 + 8) + 1 count + 0 rw = 54
    assert c.logical_bytes == 4 + 1 + 48 + 1 + 0 == 54
    c2 = CompositeCmd(Completion(2, "composite"), (gemm, scale), (M, L, O))
    assert c2.logical_bytes == 54 + 3 * 8 == 78


def test_primitive_logical_bytes_is_framing_plus_op():
    op = OpSpec("load", Scope.KERNEL, {"src": A}, {}, B)
    p = PrimitiveCmd(Completion(3, "load"), op)
    assert p.logical_bytes == 4 + 20 == 24
    assert p.ops == (op,) and p.rw_handles == ()
    assert command_kind(p) == "load"


def test_ddd0065_s10_repeated_handle_costs_exactly_32_bytes_more():
    """DDD §10 invariant guard: the same handle O in 3 OpSpecs + in rw_handles is charged per
    reference: 3 × 8 (operand references) + 8 (rw_handles entry) = 32 bytes more than the
    de-duplicated twin (the same ops without those references)."""
    corr = _h("corr", (8, 1))
    with_o = (
        OpSpec("mul_bcast", Scope.KERNEL, {"src_a": O, "src_b": corr}, {"bcast_axis": 1}, O),
        OpSpec("gemm", Scope.KERNEL, {"a": A, "b": O}, {"m": 8, "k": 128, "n": 128}, B),
        OpSpec("add", Scope.OUTPUT_TILE, {"other": O}),
    )
    dedup = (
        OpSpec("mul_bcast", Scope.KERNEL, {"src_b": corr}, {"bcast_axis": 1}, O),
        OpSpec("gemm", Scope.KERNEL, {"a": A}, {"m": 8, "k": 128, "n": 128}, B),
        OpSpec("add", Scope.OUTPUT_TILE, {}),
    )
    full = CompositeCmd(Completion(1, "c"), with_o, (O,))
    twin = CompositeCmd(Completion(2, "c"), dedup, ())
    assert full.logical_bytes - twin.logical_bytes == 3 * 8 + 8 == 32
    # and the absolute numbers: ops 32+40+12 = 84 → 4+1+84+1+8 = 98; twin 24+32+4 = 60 → 66
    assert (full.logical_bytes, twin.logical_bytes) == (98, 66)


def test_composite_has_no_head_or_epilogue_fields():
    names = {f.name for f in dataclasses.fields(CompositeCmd)}
    assert names == {"completion", "ops", "rw_handles"}
    assert {f.name for f in dataclasses.fields(OpSpec)} == {"kind", "scope", "operands", "extra", "out"}
    assert [s.name for s in Scope] == ["KERNEL", "K_TILE", "OUTPUT_TILE"]


def test_hazard_ranges_cover_operands_outs_and_rw_handles():
    """Reads: every operand; writes: rw_handles, then every op out; each range once."""
    op1 = OpSpec("copy", Scope.KERNEL, {"src": A}, {}, B)
    op2 = OpSpec("add", Scope.OUTPUT_TILE, {"other": O})
    op3 = OpSpec("add", Scope.OUTPUT_TILE, {"other": O, "again": A}, {}, B)
    c = CompositeCmd(Completion(1, "c"), (op1, op2, op3), (M,))
    reads, writes = hazard_ranges(c)
    assert reads == [(h.space, *h.byte_range) for h in (A, O)]
    assert writes == [(h.space, *h.byte_range) for h in (M, B)]


def test_primitive_hazard_ranges_are_its_ops_once_computed():
    """A primitive command's hazard lists follow the same rule (reads each once, the out as
    the write) and are its OpSpec's, shared by every command of that op."""
    op = OpSpec("max_elem", Scope.KERNEL, {"src_a": A, "src_b": A}, {}, B)
    c1, c2 = PrimitiveCmd(Completion(1, "x"), op), PrimitiveCmd(Completion(2, "x"), op)
    assert hazard_ranges(c1) == ([(A.space, *A.byte_range)], [(B.space, *B.byte_range)])
    assert hazard_ranges(c1) is hazard_ranges(c2)
    assert hazard_ranges(PrimitiveCmd(Completion(3, "f"), OpSpec("add", Scope.KERNEL, {"x": A}))) == \
        ([(A.space, *A.byte_range)], [])
