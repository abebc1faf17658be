"""Rule 6's accesses per command shape: planned once, shifted for every command of that
shape (the sanitizer's speed trick, in one place).

The sanitizer's ``data_dependencies`` rule (kbframe.sim.sanitizer) re-plans every command
with :class:`~kbframe.sim.footprint.FootprintNumerics` to learn the bytes each stage reads
and writes. A kernel repeats a few command shapes many times (two composites per KV tile),
and a command's accesses depend on its shape and on where its handles are, nothing else:

* the stages and their order depend only on :func:`~kbframe.hw.tiling.plan_key` (what
  :class:`~kbframe.hw.tiling.PlanCache` relies on too);
* each access is a handle of one of the command's operand slots (an op's operand or
  ``out``) and a region fixed by the shapes, or a DMA staging key or GEMM accumulator of
  the command alone (its own memory space);
* a handle's byte intervals are ``n`` strided rows (:func:`~kbframe.sim.footprint.strided`),
  all shifted by its base (``addr`` + the row window's first row × the row stride) when its
  space, dtype, buffer shape, window height and transposition are the same.

So a :class:`Template` is made by re-planning the first command of each
(plan key, slot geometry, slot aliasing), with every access stored relative to its slot's
base, and every command of that shape gets its accesses from the template and its own
bases, all at once with numpy. The accesses are exactly the re-planning's, and
:func:`~kbframe.sim.footprint.hazard_free_columns` checks them as the sanitizer's own
walk would decide. When anything is unlike that (a re-planning that fails, stages that do
not match, a source no slot holds), :func:`columns` answers None and the sanitizer re-plans
every command of the PE itself, which names what it finds.
"""
from __future__ import annotations

import numpy as np

from ..hw.tiling import plan_key, plan_units_key
from ..ir.handles import itemsize
from .footprint import _ADDR_LIMIT, FootprintNumerics, hazard_free_columns, strided

#: space ids below this are handle spaces (``hbm``, ``tcm``); each command's staging
#: buffers and accumulators get ids from here on
_LOCAL = 16


class _Unlike(Exception):
    """A command the templates cannot describe (the sanitizer re-plans it itself)."""


def _op_slots(op) -> tuple:
    """The slots of one op (its operands, then its ``out``): their handles, geometries,
    bases and ids (:func:`_geometry`)."""
    hs = [*op.operands.values()] + ([op.out] if op.out is not None else [])
    gb = [_geometry(h) for h in hs]
    return hs, [g for g, _ in gb], [b for _, b in gb], [id(h) for h in hs]


def _geometry(h) -> tuple:
    """``(geometry, base)`` of a handle: what its intervals' shape depends on, and what
    shifts them (kbframe.sim.footprint._footprint: ``addr + (w0 + r) * stride + c * isz``)."""
    shape = h.buf_shape
    c = 1
    for n in shape[1:]:
        c *= n
    stride = c * itemsize(h.dtype)
    rows = h.rows
    return ((h.space, h.dtype, shape, None if rows is None else rows[1] - rows[0], h.trans),
            h.addr + (rows[0] * stride if rows is not None else 0))


class Template:
    """The accesses of one command shape, per source (a handle region or a key) in
    program order: stage index, write or read, slot (``ref >= 0``) or command-local key
    (``ref = -1 - key``), and ``n`` intervals ``[lo + i·stride, lo + i·stride + width)``,
    ``lo`` relative to the slot's base."""

    __slots__ = ("sig", "n_local", "n_acc", "slot_space", "stage", "write", "is_slot", "slot", "key",
                 "lo", "width", "n", "stride", "on_pe")

    def __init__(self, sig, n_local, slot_space, rows):
        self.sig = sig  # (unit name, op kind, tile) per stage
        self.on_pe: dict = {}  # PE index -> the same with the PE's units
        self.n_local = n_local
        self.slot_space = np.array(slot_space, dtype=np.int64)
        cols = [np.array(c, dtype=np.int64) for c in zip(*rows)] if rows else [np.zeros(0, np.int64)] * 7
        self.stage, write, ref, self.lo, self.width, self.n, self.stride = cols
        self.write = write.astype(bool)
        self.is_slot = ref >= 0
        self.slot = np.where(self.is_slot, ref, 0)
        self.key = np.where(self.is_slot, 0, -1 - ref)
        self.n_acc = int(self.n.sum())

    def sig_on(self, pe) -> tuple:
        """:attr:`sig` with the ids of ``pe``'s units."""
        got = self.on_pe.get(pe.index)
        if got is None:
            got = self.on_pe[pe.index] = tuple([(id(pe.units[u]), k, t) for u, k, t in self.sig])
        return got


def _build(cmd, stages, hs, bases, units, planner, space_ids) -> Template:
    """The template of ``cmd`` (re-planned by ``planner`` with FootprintNumerics); raises
    :class:`_Unlike` when it cannot be one."""
    nx = FootprintNumerics()
    try:
        replanned = planner(cmd, units, nx)
    except Exception:  # noqa: BLE001 — the sanitizer's own re-planning raises it in order
        raise _Unlike from None
    if len(replanned) != len(stages) or any(a.unit is not b.unit or a.op_kind != b.op_kind or a.tile != b.tile
                                            for a, b in zip(replanned, stages)):
        raise _Unlike
    sig = tuple([(st.unit.name, st.op_kind, st.tile) for st in replanned])
    slot_of: dict = {}
    for i, h in enumerate(hs):
        slot_of.setdefault(id(h), i)
    local: dict = {}
    rows = []
    for j, rst in enumerate(replanned):
        reads, writes = nx.accesses(rst)
        for w, srcs in ((0, reads), (1, writes)):
            for src in srcs:
                space, lo, width, n, stride = strided(src)
                if n == 0:
                    continue  # no bytes: neither checked nor counted
                if isinstance(src, str):
                    ref, base = -1 - local.setdefault(space, len(local)), 0
                elif isinstance(src[0], str):
                    ref, base = -1 - local.setdefault(space, len(local)), 0
                else:
                    i = slot_of.get(id(src[0]))
                    if i is None:
                        raise _Unlike
                    ref, base = i, bases[i]
                rows.append((j, w, ref, lo - base, width, n, stride))
    slot_space = []
    for h in hs:
        if h.space not in space_ids:
            if len(space_ids) >= _LOCAL:
                raise _Unlike
            space_ids[h.space] = len(space_ids)
        slot_space.append(space_ids[h.space])
    return Template(sig, len(local), slot_space, rows)


class Templates:
    """The templates of one sanitizer check, shared by its PEs (PEs built from one config
    plan a command shape alike: the key holds what of its units a plan reads)."""

    def __init__(self):
        self.templates: dict = {}
        self.space_ids: dict = {}

    def columns(self, pe, plan, planner) -> tuple | None:
        """Rule 6 for one PE from templates: ``(accesses, hbm_writes)`` when no access is a
        hazard (``accesses`` counted as the sanitizer counts them, ``hbm_writes`` its
        ``(lo, hi, pe, stage)`` for rule 10, in program order), or None when that is not
        shown this way (a hazard, or a command unlike its template): then the sanitizer
        re-plans the PE's commands itself.

        Args:
            pe: the PE (its ``by_role`` units plan the commands).
            plan: ``[(cmd, stages that ran)]`` in program order.
            planner: :func:`~kbframe.hw.tiling.plan_stages` (as the sanitizer names it).
        """
        try:
            return _columns(pe, plan, planner, self.templates, self.space_ids)
        except _Unlike:
            return None


    def count(self, pe, plan, planner) -> int | None:
        """The accesses rule 6 counts for ``plan`` (as :meth:`columns` counts them), from
        the templates alone, nothing checked: for commands already checked (a period the
        run put back, kbframe.run.skipped). None when a command is unlike its template."""
        per_op: dict = {}
        ukey = plan_units_key(pe.by_role)
        total = 0
        for cmd, stages in plan:
            tpl, _ = _template(cmd, stages, pe.by_role, ukey, per_op, planner, self.templates, self.space_ids)
            if tuple([(id(st.unit), st.op_kind, st.tile) for st in stages]) != tpl.sig_on(pe):
                return None
            total += int(tpl.n.sum())
        return total


def _template(cmd, stages, units, ukey, per_op: dict, planner, templates: dict, space_ids: dict) -> tuple:
    """``(template, its slot bases)`` of a command: its shape's template, built once."""
    hs, gs, bases, ids = [], [], [], []  # the command's slots: per op its operands, then its out
    for op in cmd.ops:
        got = per_op.get(id(op))
        if got is None:
            got = per_op[id(op)] = _op_slots(op)  # OpSpecs repeat across commands
        hs += got[0]
        gs += got[1]
        bases += got[2]
        ids += got[3]
    first: dict = {}
    key = (ukey, plan_key(cmd), tuple(gs), tuple([first.setdefault(x, i) for i, x in enumerate(ids)]))
    tpl = templates.get(key)
    if tpl is None:
        tpl = templates[key] = _build(cmd, stages, hs, bases, units, planner, space_ids)
    return tpl, bases


def _columns(pe, plan, planner, templates, space_ids):
    per_op: dict = {}  # id(op) -> _op_slots(op)
    units = pe.by_role
    ukey = plan_units_key(pe.by_role)
    ran, expected = [], []  # the stages that ran, and (id(unit), op_kind, tile) of their plans
    used: dict = {}  # template -> [(first stage's index, first key space, slot bases)] of this PE
    n_keys = 0
    for cmd, stages in plan:
        tpl, bases = _template(cmd, stages, units, ukey, per_op, planner, templates, space_ids)
        got = used.get(tpl)
        if got is None:
            got = used[tpl] = []
        got.append((len(ran), _LOCAL + n_keys, bases))
        n_keys += tpl.n_local
        expected += tpl.sig_on(pe)
        ran += stages
    # the stages that ran are the plans' (a unit by identity), all compared at once
    if [(id(st.unit), st.op_kind, st.tile) for st in ran] != expected:
        return None
    t_data, t_start = np.array([st.t_data for st in ran]), np.array([st.t_start for st in ran])
    if t_data.dtype.kind != "i" or t_start.dtype.kind != "i":
        return None  # not integer ps: the walk says what it makes of it
    t0 = np.where(t_data >= 0, t_data, t_start)  # a DMA touches memory in its data phase
    t_end = np.array([st.t_end for st in ran])
    if _LOCAL + n_keys >= 1 << 22:
        return None
    parts = [_instances(tpl, inst) for tpl, inst in used.items() if len(tpl.n)]
    if not parts:
        return 0, []
    stage, write, sid, lo, width, n, stride = (np.concatenate(c) for c in zip(*parts))
    order = np.argsort(stage, kind="stable")  # program order: stage, then its sources in plan order
    stage, write, sid, lo, width, n, stride = (a[order] for a in (stage, write, sid, lo, width, n, stride))
    accesses = int(n.sum())
    hi = lo + (n - 1) * stride + width  # each source's bounds
    if lo.min() < 0 or hi.max() >= _ADDR_LIMIT:
        return None  # what a run never makes: the sanitizer's walk says what it makes of it
    # every write's intervals, and the reads that overlap one of them (a read no write
    # overlaps can be part of no hazard, as kbframe.sim.footprint.WriteUnion decides)
    w_idx = np.flatnonzero(write)
    w_rep, w_lo, w_hi = _rows(w_idx, lo, width, n, stride)
    kept = np.zeros(0, dtype=np.int64)
    live = w_hi > w_lo
    if live.any():
        w_key_lo = sid[w_rep][live] * _ADDR_LIMIT + w_lo[live]
        o = np.argsort(w_key_lo, kind="stable")
        starts = w_key_lo[o]
        reach = np.maximum.accumulate((sid[w_rep][live] * _ADDR_LIMIT + w_hi[live])[o])
        r_idx = np.flatnonzero(~write & (hi > lo))
        q_lo, q_hi = sid[r_idx] * _ADDR_LIMIT + lo[r_idx], sid[r_idx] * _ADDR_LIMIT + hi[r_idx]
        j = np.searchsorted(starts, q_hi, side="left") - 1  # the last write starting below the read's end
        hit = j >= 0
        hit[hit] = reach[j[hit]] > q_lo[hit]
        kept = r_idx[hit]
    r_rep, r_lo, r_hi = _rows(kept, lo, width, n, stride)
    rep = np.concatenate([w_rep, r_rep])
    a_lo, a_hi = np.concatenate([w_lo, r_lo]), np.concatenate([w_hi, r_hi])
    o = np.argsort(rep, kind="stable")  # back in program order
    rep, a_lo, a_hi = rep[o], a_lo[o], a_hi[o]
    if not hazard_free_columns(sid[rep], a_lo, a_hi, write[rep], stage[rep], t0, t_end):
        return None
    hbm = space_ids.get("hbm")
    out = np.flatnonzero(sid[w_rep] == hbm) if hbm is not None else np.zeros(0, dtype=np.int64)
    hbm_writes = [(a, b, pe.index, ran[k]) for a, b, k in
                  zip(w_lo[out].tolist(), w_hi[out].tolist(), stage[w_rep[out]].tolist())]
    return accesses, hbm_writes


def _rows(idx, lo, width, n, stride) -> tuple:
    """The sources ``idx`` as intervals, each source's ``n`` rows in order: the source of
    each row, its lo and hi."""
    counts = n[idx]
    rep = np.repeat(idx, counts)
    row = np.arange(len(rep)) - np.repeat(np.cumsum(counts) - counts, counts)
    r_lo = lo[rep] + row * stride[rep]
    return rep, r_lo, r_lo + width[rep]


def _instances(tpl: Template, inst: list) -> tuple:
    """The sources of the commands ``inst`` of ``tpl``, flat: stage index in program order,
    write, space id, lo, width, n, stride."""
    first = np.array([s for s, _, _ in inst], dtype=np.int64)[:, None]
    keys = np.array([k for _, k, _ in inst], dtype=np.int64)[:, None]
    shape = (len(inst), len(tpl.n))
    if len(tpl.slot_space):
        bases = np.array([b for _, _, b in inst], dtype=np.int64)
        base = np.where(tpl.is_slot, bases[:, tpl.slot], 0)
        sid = np.where(tpl.is_slot, tpl.slot_space[tpl.slot], keys + tpl.key)
    else:
        base = np.zeros(shape, dtype=np.int64)
        sid = keys + tpl.key
    return ((first + tpl.stage).ravel(), np.broadcast_to(tpl.write, shape).ravel(), sid.ravel(),
            (base + tpl.lo).ravel(), np.broadcast_to(tpl.width, shape).ravel(),
            np.broadcast_to(tpl.n, shape).ravel(), np.broadcast_to(tpl.stride, shape).ravel())
