"""Stage plans from flat ops (ADR-0065 D3/D4/D8, DDD-0065 §7).

PE_SCHEDULER calls :func:`plan_stages` with a command; it reads only the flat ``ops``
(it knows no recipe). For a command with a GEMM at position ``g``:

* ops ``0..g-1`` (KERNEL scope) run once, in order, before the tile loop;
* the GEMM drives the tile loop over output tiles ``(m, n)`` and K tiles; a DMA_READ is
  inserted only for an operand whose ``space`` is ``"hbm"`` (DESIGN.md decision 2) and it
  waits for the pre-loop ops (so #2's V DMA never runs during its prologue);
* K_TILE ops run after each K tile's GEMM stage on that K tile's partial product, which is
  then added to the accumulator (e.g. ``dequant``: per-K-block scales); OUTPUT_TILE ops run
  after each output tile, on the accumulator; the tile is then written to ``out``, with a DMA_WRITE only when
  ``out.space == "hbm"``;
* KERNEL ops after the GEMM run once after the whole tile loop.

A command with no GEMM runs its ops in order; a DMA op (``load`` / ``store``) is one
DMA stage, an IPCQ op (``send`` / ``recv``, extra ``peer``: the other PE) one stage on the
unit serving ``ipcq_send`` / ``ipcq_recv``. Stage durations belong to the units; this module only orders stages.

In timing-only runs a plan depends only on the command's *shape* (:func:`plan_key`), and
a kernel repeats a few shapes once per KV tile, so :class:`PlanCache` plans each shape
once and copies the plan for later commands of that shape.

A run that fast-forwards in one simulation (kbframe.sim.steady) may leave out a steady
stretch of a weight-streaming GEMM's output tiles (:func:`leave_out`): the command is
planned as if those tiles were not there, the later ones numbered on without a gap (the
run is exactly the run of a GEMM with fewer columns), and kbframe.run.skipped puts them back.
"""
from __future__ import annotations

import copy

from ..ir.commands import Scope
from .unit import Stage

# Stages are built with positional arguments (this is the simulator's hottest loop):
# Stage(unit, op_kind, cmd, tile, nbytes, flops, n_elements, effect).


def _chain(e1, e2):
    if e1 is None:
        return e2
    if e2 is None:
        return e1

    def both():
        e1()
        e2()
    return both


#: the command attribute that names output tiles a plan leaves out (:func:`leave_out`)
_LEFT_OUT = "tiles_left_out"


def leave_out(cmd, first: int, count: int) -> None:
    """Plan ``cmd``, a GEMM with one row of output tiles, without its output tiles
    ``first .. first + count - 1`` (timing only; kbframe.sim.steady decides, at admission)."""
    cmd.__dict__[_LEFT_OUT] = (first, count)


def left_out(cmd) -> tuple | None:
    """``(first, count)`` of the output tiles ``cmd``'s plan leaves out, or None."""
    return cmd.__dict__.get(_LEFT_OUT)


def whole(cmd):
    """``cmd`` as it was dispatched: a copy that leaves out none of its tiles."""
    c = copy.copy(cmd)
    c.__dict__.pop(_LEFT_OUT, None)
    return c


def gemm_tile_loop(cmd, units: dict) -> tuple | None:
    """``(output tiles, K tiles per output tile)`` of a command whose GEMM streams its
    weights (``b`` in HBM) over one row of output tiles (``M`` at most ``tile_m``: a
    decode GEMV), or None."""
    for op in cmd.ops:
        if op.kind == "gemm":
            a, b = op.operands["a"], op.operands["b"]
            gu = units["gemm"]
            if b.space != "hbm" or a.shape[0] > gu.tile_m:
                return None
            return -(-b.shape[1] // gu.tile_n), -(-a.shape[1] // gu.tile_k)
    return None


def _region_nbytes(rows: slice, cols: slice, itemsize: int) -> int:
    return (rows.stop - rows.start) * (cols.stop - cols.start) * itemsize


def plan_stages(cmd, units: dict, nx) -> list[Stage]:
    """All stages of ``cmd`` with their dependencies set.

    Args:
        cmd: a ``PrimitiveCmd`` or ``CompositeCmd``.
        units: the PE's units by port name (``dma_read``, ``dma_write``, ``gemm``, ``math``).
        nx: the :class:`~kbframe.sim.numerics.Numerics` that supplies numeric effects.
    Returns:
        Stages in a valid order; those with ``deps == 0`` are ready at once.
    """
    ops = cmd.ops
    # DMA staging buffers and GEMM accumulators live in the PE: their keys name it, as
    # command ids are PE-local and the PEs of a run share one memory model
    tcm = units.get("tcm")
    tag = f"pe{tcm.pe_index}.c{cmd.id}" if tcm is not None else f"c{cmd.id}"
    stages: list[Stage] = []
    gi = next((i for i, op in enumerate(ops) if op.kind == "gemm"), None)
    prev = None
    for op in ops[:gi] if gi is not None else ops:
        prev = _op_stage(op, cmd, tag, units, nx, stages, prev)
    if gi is None:
        return stages
    ends = _tile_loop(ops[gi], ops[gi + 1:], cmd, tag, units, nx, stages, prev, left_out(cmd))
    post = None
    for op in ops[gi + 1:]:
        if op.scope is Scope.KERNEL:
            post = _op_stage(op, cmd, tag, units, nx, stages, post)
            if len(ends):
                post.after(*ends)
                ends = []
    return stages


def _op_stage(op, cmd, tag, units, nx, stages, prev) -> Stage:
    """One non-GEMM op: a DMA stage for load/store, else a MATH stage (HBM operands of a
    head MATH op are staged in by DMA_READ first, ADR-0065 D4)."""
    kind, out = op.kind, op.out
    if kind in ("send", "recv"):
        peer = op.extra["peer"]
        if kind == "send":
            unit = units["ipcq_send"]
            src = op.operands["src"]
            st = Stage(unit, "send", cmd, -1, src.nbytes, 0, 0, nx.send((src, None), (unit.pe.index, peer)), peer)
        else:
            unit = units["ipcq_recv"]
            st = Stage(unit, "recv", cmd, -1, out.nbytes, 0, 0, nx.recv((peer, unit.pe.index), (out, None)), peer)
        stages.append(st.after(prev))
        return st
    if kind in ("load", "store"):
        src = op.operands["src"]
        port = "dma_read" if kind == "load" else "dma_write"
        st = Stage(units[port], port, cmd, -1, src.nbytes, 0, 0, nx.copy((src, None), (out, None)))
        stages.append(st.after(prev))
        return st
    srcs, dmas = [], []
    n, nbytes = out.n_elements, out.nbytes  # elements produced or read, whichever is more
    for name, h in op.operands.items():
        if h.space == "hbm":
            key = f"{tag}.{len(stages)}.{name}"
            d = Stage(units["dma_read"], "dma_read", cmd, -1, h.nbytes, 0, 0,
                      nx.copy((h, None), key)).after(prev)
            stages.append(d)
            dmas.append(d)
            srcs.append(key)
        else:
            srcs.append((h, None))
        if h.n_elements > n:
            n = h.n_elements
        nbytes += h.nbytes
    st = Stage(units["math"], kind, cmd, -1, nbytes, 0, n, nx.math(kind, srcs, out, op.extra))
    stages.append(st.after(prev, *dmas))
    return st


def _tile_loop(gemm, after_ops, cmd, tag, units, nx, stages, pre_end, skip=None) -> list:
    a, b, out = gemm.operands["a"], gemm.operands["b"], gemm.out
    M, K = a.shape
    N = b.shape[1]
    gu = units["gemm"]
    tm, tn, tk = gu.tile_m, gu.tile_n, gu.tile_k
    k_ops = [op for op in after_ops if op.scope is Scope.K_TILE]
    o_ops = [op for op in after_ops if op.scope is Scope.OUTPUT_TILE]
    isz_a, isz_b = a.nbytes // a.n_elements, b.nbytes // b.n_elements
    ends, tile = [], 0
    skipped = range(0) if skip is None else range(skip[0] * tn, (skip[0] + skip[1]) * tn, tn)
    for m0 in range(0, M, tm):
        rm = slice(m0, min(M, m0 + tm))
        for n0 in range(0, N, tn):
            if n0 in skipped:  # left out (leave_out): the tiles after it numbered on without a gap
                continue
            rn = slice(n0, min(N, n0 + tn))
            ro = (rm, rn)
            acc = f"{tag}.acc{m0}.{n0}"
            prev = None
            for k0 in range(0, K, tk):
                rk = slice(k0, min(K, k0 + tk))
                srcs, dmas = [], []
                for name, h, reg, isz in (("a", a, (rm, rk), isz_a), ("b", b, (rk, rn), isz_b)):
                    if h.space == "hbm":
                        key = f"{tag}.t{tile}.{name}"
                        d = Stage(units["dma_read"], "dma_read", cmd, tile, _region_nbytes(*reg, isz), 0, 0,
                                  nx.copy((h, reg), key)).after(pre_end)
                        stages.append(d)
                        dmas.append(d)
                        srcs.append(key)
                    else:
                        srcs.append((h, reg))
                mm, nn, kk = rm.stop - rm.start, rn.stop - rn.start, rk.stop - rk.start
                part = f"{acc}.k" if k_ops else acc  # K_TILE ops act on the K tile's product
                g = Stage(gu, "gemm", cmd, tile, (mm * kk) * isz_a + (kk * nn) * isz_b, 2 * mm * nn * kk, 0,
                          nx.gemm(srcs[0], srcs[1], part, first=k0 == 0 or bool(k_ops)))
                g.after(*dmas, prev if prev is not None else (None if dmas else pre_end))
                stages.append(g)
                prev = g
                for op in k_ops:
                    prev = _epilogue_stage(op, cmd, units, nx, stages, prev, tile, part, ro)
                if k_ops:
                    prev.effect = _chain(prev.effect, nx.accumulate(part, acc, first=k0 == 0))
                tile += 1
            for op in o_ops:
                prev = _epilogue_stage(op, cmd, units, nx, stages, prev, tile - 1, acc, ro)
            if out.space == "hbm":
                w = Stage(units["dma_write"], "dma_write", cmd, tile - 1,
                          _region_nbytes(rm, rn, out.nbytes // out.n_elements), 0, 0,
                          nx.writeback(acc, (out, ro))).after(prev)
                stages.append(w)
                ends.append(w)
            else:
                prev.effect = _chain(prev.effect, nx.writeback(acc, (out, ro)))
                ends.append(prev)
    return ends


def _operand_region(h, region) -> tuple:
    """An epilogue operand's part of an output tile: a size-1 (broadcast) axis, e.g. of a
    ``(rows, 1)`` row vector, is read whole in every tile."""
    return tuple(slice(None) if n == 1 else r for n, r in zip(h.shape, region))


def _epilogue_stage(op, cmd, units, nx, stages, prev, tile, acc, region) -> Stage:
    others, nbytes = [], 0
    for h in op.operands.values():
        others.append((h, _operand_region(h, region)))
        nbytes += h.nbytes
    n = (region[0].stop - region[0].start) * (region[1].stop - region[1].start)
    st = Stage(units["math"], op.kind, cmd, tile, nbytes, 0, n,
               nx.epilogue(op.kind, acc, others, op.extra)).after(prev)
    stages.append(st)
    return st


def plan_key(cmd) -> tuple:
    """Everything of ``cmd`` a timing-only plan depends on: per op its kind, scope, operand
    names and, per operand and output, space, shape and bytes, an IPCQ op's peer, and the
    output tiles the plan leaves out (:func:`leave_out`); addresses and numbers do not
    change a plan's stages, sizes or edges."""
    key = tuple([op.shape_sig if "peer" not in op.extra else (op.shape_sig, op.extra["peer"]) for op in cmd.ops])
    skip = cmd.__dict__.get(_LEFT_OUT)
    return key if skip is None else (*key, skip)


def plan_units_key(units: dict) -> tuple:
    """What of a PE's units (by role, as a plan takes them) a stage plan reads: which unit
    serves each role, its type and the GEMM tile. Two PEs with equal keys plan a command
    alike."""
    return tuple([(role, u.name, type(u), getattr(u, "tile_m", None), getattr(u, "tile_n", None),
                   getattr(u, "tile_k", None)) for role, u in units.items()])


class PlanCache:
    """Stage plans of timing-only runs, one per command shape (:func:`plan_key`).

    A cached plan is a template: per stage its unit, op kind, tile, sizes, dependency
    count and successors (by index, in order: successors are submitted in that order, which
    sets FIFO order on the units). :meth:`stages` gives fresh Stage objects equal to what
    ``plan`` would build. Only for effect-free plans: a data-mode effect is bound to one
    command's handles.

    The PEs of one engine are copies of one PE's units and run the same command shapes (a
    tensor-parallel layer's GEMMs are thousands of stages each): with ``shared`` (one dict
    for all of them, :meth:`share`) a shape is planned on the first PE that meets it, and
    the others take its template with their own units, found by name.

    Args:
        plan: the planner, ``plan(cmd, units, nx) -> [Stage]`` (:func:`plan_stages`).
        max_templates: shapes kept; later new shapes are planned each time (a kernel whose
            commands never repeat a shape costs no memory for templates it cannot reuse).
    """

    def __init__(self, plan, max_templates: int = 1024):
        self.plan = plan
        self.max_templates = max_templates
        self.templates: dict = {}
        self.shared: dict | None = None
        self._units = None  # (units, their key in shared, units by name): the PE's, found once

    def share(self, shared: dict) -> None:
        """Take and give templates through ``shared`` (by units and shape, units by name)."""
        self.shared = shared

    def _units_of(self, units: dict) -> tuple:
        got = self._units
        if got is None or got[0] is not units:
            got = self._units = (units, plan_units_key(units), {u.name: u for u in units.values()})
        return got

    def _template(self, cmd, units: dict, nx) -> tuple:
        """``(template, None)`` of ``cmd``'s shape, or ``(template or None, stages)`` when
        the command was just planned (None: over ``max_templates``, not kept)."""
        key = plan_key(cmd)
        tpl = self.templates.get(key)
        if tpl is not None:
            return tpl, None
        if len(self.templates) >= self.max_templates:
            return None, self.plan(cmd, units, nx)
        shared = self.shared
        if shared is not None:
            _, ukey, by_name = self._units_of(units)
            named = shared.get((ukey, key))
            if named is not None:  # planned on another PE: with this PE's units
                tpl = self.templates[key] = tuple([(by_name[row[0]], *row[1:]) for row in named])
                return tpl, None
        stages = self.plan(cmd, units, nx)
        index = {st: i for i, st in enumerate(stages)}
        tpl = self.templates[key] = tuple((st.unit, st.op_kind, st.tile, st.nbytes, st.flops, st.n_elements,
                                           st.deps, tuple([index[s] for s in st.succs]), st.peer) for st in stages)
        if shared is not None:
            shared[(self._units_of(units)[1], key)] = tuple([(row[0].name, *row[1:]) for row in tpl])
        return tpl, stages

    def count(self, cmd, units: dict, nx) -> int:
        """How many stages ``cmd`` has (from its shape's template: none copied)."""
        tpl, stages = self._template(cmd, units, nx)
        return len(stages) if stages is not None else len(tpl)

    def stages(self, cmd, units: dict, nx) -> list[Stage]:
        tpl, stages = self._template(cmd, units, nx)
        if stages is not None:
            return stages
        new = [Stage(unit, kind, cmd, tile, nbytes, flops, n, None, peer)
               for unit, kind, tile, nbytes, flops, n, _, _, peer in tpl]
        for st, row in zip(new, tpl):
            st.deps = row[6]
            if row[7]:
                st.succs = [new[i] for i in row[7]]
        return new
