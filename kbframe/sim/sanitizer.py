"""The simulation sanitizer (``run.check=true``): after a run, check that the schedule the
simulator produced is one real hardware could have run, from the run's record table
(kbframe.records: what ``op_log.jsonl`` is written from) and the engine state. A violation
raises :class:`~kbframe.errors.SanitizerError` naming the rule, the commands and the
simulated times.

Rules (checked in this order; ``RULES`` lists their names):

1. ``commands_once`` — every dispatched command was admitted and completed exactly once,
   each of its planned stages ran exactly once, and the stages lie inside the command's
   admit→complete span, which starts after its dispatch ended.
2. ``cpu_dispatch_serial`` — PE_CPU dispatch intervals never overlap and follow program
   order (command ids increase).
3. ``unit_capacity`` — no unit ran more stages at once than its ``channels``; on a DMA
   channel the data phases ``[t_data, t_end)`` never overlap and at most
   ``max_outstanding`` transfers are in flight.
4. ``tcm_no_overlap`` — no two TCM allocations alive at once overlap, and every
   allocation lies inside the capacity.
5. ``rw_no_interleave`` — composites whose ``rw_handles`` share bytes did not interleave:
   the later one was admitted after the earlier one completed (ADR-0065 D6.3).
6. ``data_dependencies`` — per stage, from the bytes it reads and writes: no stage started
   before the stages producing its inputs ended (RAW), and no write started before an
   earlier read (WAR) or write (WAW) of the same bytes ended. A DMA stage touches memory
   from the start of its data phase (its setup may overlap). Program order is dispatch
   order, then each command's plan order. TCM and HBM are compared by byte address (TCM
   freed by a ``scratch_scope`` and reused counts as the same memory), DMA staging
   buffers and GEMM accumulators by their key.

With more than one PE (checked only when they apply, so ``rules_checked`` counts them then):

7. ``ipcq_matched`` — on every PE→PE link, the k-th receive took the k-th send, of the same
   bytes, and every send was received;
8. ``ipcq_arrival`` — no receive completed before its message's transfer ended plus the
   link latency (so no stage read received data before it arrived);
9. ``ipcq_credits`` — a link never held more messages (sent, not yet received) than its credits;
10. ``hbm_writes_disjoint`` — HBM writes of different PEs never touch the same bytes.

Cost: nothing while the simulation runs when ``run.check=false``. When it is on,
PE_SCHEDULER keeps each command's stage list (``PeScheduler.record``) and the check
afterwards re-plans the commands with :class:`FootprintNumerics`, which returns, in
place of numeric effects, the byte ranges each stage reads and writes: each command shape
once, its accesses shifted to every command of that shape (kbframe.sim.access_templates),
and every command of a PE where that does not show rule 6 holds. Each PE is checked
in its own program order; across PEs, data moves only through IPCQ (rules 7–9) and HBM
writes never share bytes (rule 10).
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import defaultdict
from pathlib import Path

from ..errors import SanitizerError
from ..records import RecordTable
from . import access_templates, record_rules
from .footprint import FootprintNumerics, Space, WriteUnion, bounds, footprint, hazard_free
from .record_rules import stage_desc
from ..hw.tiling import plan_stages

RULES = ("commands_once", "cpu_dispatch_serial", "unit_capacity", "tcm_no_overlap",
         "rw_no_interleave", "data_dependencies")
#: rules of runs with IPCQ traffic, and of runs on more than one PE
IPCQ_RULES = ("ipcq_matched", "ipcq_arrival", "ipcq_credits")
MULTI_PE_RULES = ("hbm_writes_disjoint",)


def enable(engine) -> None:
    """Make every PE_SCHEDULER of ``engine`` keep its ``(cmd, stages)`` (call before run;
    PEs the engine builds later keep them too)."""
    engine.keep_stage_records = True
    for pe in engine.pes.built():
        pe.scheduler.record = []


def check(engine, records) -> dict:
    """Check a finished run against every rule in :data:`RULES`, PE by PE in order (rules
    1–6 of each PE), then rules 7–9 and 10 where they apply.

    Args:
        engine: the :class:`~kbframe.sim.engine.Engine` after ``run`` (with :func:`enable`
            called before the run; without it the stage-level rules 1 (stage counts),
            5 and 6 cannot run and raise).
        records: the run's :class:`~kbframe.records.RecordTable` (``OpLog.table``), or
            an op_log to read one from: a path to ``op_log.jsonl``, a text stream holding
            its text, or its records as dicts.
    Returns:
        ``{"rules_checked", "rules", "commands", "stages", "accesses"}``.
    Raises:
        SanitizerError: the first violation, naming the rule, commands and times.
    """
    table = _table(records)
    per_pe = record_rules.by_pe(table)
    n_cmds = n_stages = n_acc = 0
    hbm_writes: list = []
    templates = access_templates.Templates()  # rule 6: each command shape re-planned once
    for pe, plan in plans(engine):
        spans, dispatches = record_rules.rules_1_to_3(pe, per_pe.get(pe.index, per_pe[None]), plan)
        check_tcm_no_overlap(pe.index, pe.tcm.allocations, pe.tcm.capacity_bytes, dispatches)
        check_rw_no_interleave(pe.index, plan, spans)
        n_acc += check_data_dependencies(pe, plan, hbm_writes, templates)
        n_cmds += len(plan)
        n_stages += sum(len(st) for _, st in plan)
    rules = list(RULES)
    if engine.fabric.links:
        record_rules.check_ipcq(engine, table)
        rules += IPCQ_RULES
    if sum(bool(pe.scheduler.record) for pe in engine.pes.built()) > 1:  # more than one PE kept stage records
        check_hbm_writes_disjoint(hbm_writes)
        rules += MULTI_PE_RULES
    return {"rules_checked": len(rules), "rules": rules, "commands": n_cmds,
            "stages": n_stages, "accesses": n_acc}


def release(engine) -> None:
    """Drop the stage records of every PE of ``engine`` once its verdict is taken: a long
    run's millions of Stage objects are not held through its report (:func:`plans` then
    raises, as before :func:`enable`)."""
    engine.keep_stage_records = False
    for pe in engine.pes.built():
        pe.scheduler.record = None


def plans(engine):
    """``(pe, plan)`` per built PE in order, the plan sorted by command id (raises
    SanitizerError at the first PE that kept no stage record)."""
    for pe in engine.pes.built():
        if pe.scheduler.record is None:
            raise SanitizerError("sanitizer: PE_SCHEDULER kept no stage record; call "
                                 "kbframe.sim.sanitizer.enable(engine) before the run")
        yield pe, sorted(pe.scheduler.record, key=lambda cs: cs[0].id)


def _table(records) -> RecordTable:
    """The run's record table as given, or read from an op_log (a path, a text stream) or
    from its records as dicts (a test's edited records)."""
    if isinstance(records, RecordTable):
        return records
    if isinstance(records, (str, Path)):
        return RecordTable.parse(Path(records))
    if hasattr(records, "getvalue"):
        return RecordTable.parse(records)
    return RecordTable.of_dicts(records)


def _ns(ps: int) -> str:
    return f"{ps / 1000:g} ns"


def _fail(rule: str, msg: str):
    raise SanitizerError(f"sanitizer: rule {rule} violated: {msg}", rule)


# ---- rule 4 --------------------------------------------------------------------------
def check_tcm_no_overlap(p: int, allocations, capacity: int | None = None, dispatches=()) -> None:
    """Rule ``tcm_no_overlap`` on ``[name, addr, size, t_alloc_ps, t_free_ps|None]`` in
    allocation order. An allocation freed at the instant another is made is not live.
    ``dispatches`` (sorted ``(t_start_ps, cmd)``) lets the message name the command each
    allocation was made for (the next one PE_CPU dispatched)."""
    rule = "tcm_no_overlap"

    def for_cmd(t):
        i = bisect_left(dispatches, (t, -1))
        return f" for command {dispatches[i][1]}" if i < len(dispatches) else ""
    live_addr: list = []  # sorted addresses of live allocations
    live: dict = {}  # addr -> index
    frees: list = []  # heap of (t_free, index)
    for j, (name, addr, size, t_alloc, t_free) in enumerate(allocations):
        if addr < 0 or size < 0 or (capacity is not None and addr + size > capacity):
            _fail(rule, f"PE{p} allocation '{name}' [{addr}, {addr + size}) lies outside the TCM "
                        f"(capacity {capacity} B)")
        while frees and frees[0][0] <= t_alloc:
            _, i = heapq.heappop(frees)
            a = allocations[i][1]
            if live.get(a) == i:
                del live[a]
                live_addr.pop(bisect_left(live_addr, a))
        k = bisect_right(live_addr, addr)
        for i in ([live[live_addr[k - 1]]] if k > 0 else []) + ([live[live_addr[k]]] if k < len(live_addr) else []):
            n2, a2, s2, ta2, tf2 = allocations[i]
            if a2 < addr + size and addr < a2 + s2:
                _fail(rule, f"PE{p} TCM allocation '{name}' [{addr}, {addr + size}) made at {_ns(t_alloc)}"
                            f"{for_cmd(t_alloc)} overlaps live allocation '{n2}' [{a2}, {a2 + s2}) made at "
                            f"{_ns(ta2)}{for_cmd(ta2)}, "
                            f"{'never freed' if tf2 is None else 'freed at ' + _ns(tf2)}")
        if size == 0:
            continue
        if addr in live:  # cannot happen without an overlap above; keep the map consistent
            _fail(rule, f"PE{p} TCM allocation '{name}' reuses live address {addr}")
        live[addr] = j
        live_addr.insert(k, addr)
        if t_free is not None:
            heapq.heappush(frees, (t_free, j))


# ---- rule 5 --------------------------------------------------------------------------
def _ranges(handles):
    return [(h.space, *h.byte_range) for h in handles]


def _overlaps(xs, ys) -> bool:
    return any(s1 == s2 and lo1 < hi2 and lo2 < hi1 for s1, lo1, hi1 in xs for s2, lo2, hi2 in ys)


def check_rw_no_interleave(p: int, plan, spans: dict) -> None:
    """Rule ``rw_no_interleave``: composites sharing ``rw_handles`` bytes run one after
    the other in dispatch order."""
    recent = []  # (ranges, cmd_id) of composites a later one may still conflict with
    for cmd, _stages in plan:
        rw = getattr(cmd, "rw_handles", ())
        if not rw:
            continue
        mine = _ranges(rw)
        t_admit, t_done = spans[cmd.id]
        keep = []
        for ranges, cid in recent:
            if _overlaps(mine, ranges):
                ta, td = spans[cid]
                if t_admit < td:
                    shared = sorted({h.name for h in rw if _overlaps(_ranges([h]), ranges)})
                    _fail("rw_no_interleave",
                          f"PE{p} composite command {cmd.id} (admitted {_ns(t_admit)}, done {_ns(t_done)}) "
                          f"interleaved with composite command {cid} ({_ns(ta)}–{_ns(td)}); they share "
                          f"rw_handles {shared}")
            covered = all(any(s == s2 and lo2 <= lo and hi <= hi2 for s2, lo2, hi2 in mine)
                          for s, lo, hi in ranges)
            if not covered:
                keep.append((ranges, cid))
        keep.append((mine, cmd.id))
        recent = keep


# ---- rule 6 --------------------------------------------------------------------------
def _hazard(kind, later, earlier, label, lo, hi, space, t_later, t_earlier):
    if space in ("tcm", "hbm"):
        where = f"'{label}' {space}[{lo}, {hi})"
    else:
        where = ("DMA staging buffer " if space.startswith("stage:") else "GEMM accumulator ") + label
    verb = {"RAW": "reads what", "WAR": "overwrites what", "WAW": "overwrites what"}[kind]
    did = {"RAW": "writes", "WAR": "reads", "WAW": "writes"}[kind]
    began = "began its data phase" if later.t_data >= 0 else "started"
    _fail("data_dependencies",
          f"{kind}: stage {stage_desc(later)} {began} at {_ns(t_later)}, but it {verb} earlier stage "
          f"{stage_desc(earlier)} {did} ({where}), and that stage ended only at {_ns(t_earlier)}")


def check_data_dependencies(pe, plan, hbm_writes: list | None = None, templates=None) -> int:
    """Rule ``data_dependencies``. Returns the number of byte-range accesses checked; HBM
    writes are appended to ``hbm_writes`` as ``(lo, hi, pe, stage)`` for rule 10.
    ``templates``: the check's :class:`~kbframe.sim.access_templates.Templates`, shared by
    its PEs (a new one if None).

    Every access is first checked at once (kbframe.sim.footprint.hazard_free, numpy);
    only when that cannot show the rule holds are they walked one by one, which names
    the first hazard in program order. A read whose bytes no write of the PE touches (a
    weight streamed from HBM) can be part of no hazard, and is counted but not checked.

    Each command shape is re-planned once and its accesses shifted to every command of
    that shape (kbframe.sim.access_templates); only a PE where that does not show the rule
    holds is re-planned command by command here."""
    shown = (templates or access_templates.Templates()).columns(pe, plan, plan_stages)
    if shown is not None:
        n, writes = shown
        if hbm_writes is not None:
            hbm_writes += writes
        return n
    return _walk_data_dependencies(pe, plan, hbm_writes)


def count_data_dependencies(pe, plan, templates=None) -> int:
    """The accesses rule ``data_dependencies`` counts for ``plan``, commands already checked
    (a period a fast-forwarded run put back: kbframe.run.skipped.sanitized): from each
    command shape's template alone (:meth:`~kbframe.sim.access_templates.Templates.count`),
    else by :func:`check_data_dependencies`."""
    templates = templates or access_templates.Templates()
    n = templates.count(pe, plan, plan_stages)
    return check_data_dependencies(pe, plan, None, templates) if n is None else n


def _walk_data_dependencies(pe, plan, hbm_writes: list | None = None) -> int:
    """:func:`check_data_dependencies` re-planning every command: its accesses checked at
    once, and walked one by one when that does not show the rule holds."""
    nx = FootprintNumerics()
    ran = []  # per stage that ran, in program order: (stage, t0, read sources, write intervals)
    n = 0
    stopped = None  # what stopped the re-planning (a plan mismatch, a bug): after an earlier hazard
    try:
        for cmd, stages in plan:
            replanned = plan_stages(cmd, pe.by_role, nx)
            if len(replanned) != len(stages) or any(
                    a.unit is not b.unit or a.op_kind != b.op_kind or a.tile != b.tile
                    for a, b in zip(replanned, stages)):
                _fail("data_dependencies", f"PE{pe.index} command {cmd.id}: the stages that ran do not "
                                           f"match its plan ({len(stages)} ran, {len(replanned)} planned)")
            for rst, st in zip(replanned, stages):
                reads, writes = nx.accesses(rst)
                w_iv = [iv for s in writes for iv in footprint(s)]
                n += len(w_iv)
                t0 = st.t_data if st.t_data >= 0 else st.t_start  # a DMA touches memory in its data phase
                ran.append((st, t0, reads, w_iv))
                if hbm_writes is not None:
                    hbm_writes += [(lo, hi, pe.index, st) for space, lo, hi, _ in w_iv if space == "hbm"]
    except Exception as e:  # noqa: BLE001 — raised below, once the commands before it are checked
        stopped = e
    written = WriteUnion(w for _, _, _, w_iv in ran for w in w_iv)
    touched = []  # (stage, t0, reads, writes) as intervals, the reads no write overlaps left out
    for st, t0, reads, w_iv in ran:
        r_iv = []
        for src in reads:
            space, lo, hi, k = bounds(src)
            n += k
            if k and written.overlaps(space, lo, hi):
                r_iv += footprint(src)
        touched.append((st, t0, r_iv, w_iv))
    if not hazard_free(touched):
        _first_hazard(touched)
    if stopped is not None:
        raise stopped
    return n


def _first_hazard(touched) -> None:
    """Rule 6 access by access over ``touched`` (check_data_dependencies): the first
    hazard in program order is raised (SanitizerError)."""
    spaces: dict = defaultdict(Space)
    for st, t0, r_iv, w_iv in touched:
        for space, lo, hi, label in r_iv:
            for seg in spaces[space].cover(lo, hi):
                w = seg[2]
                if w is not None and w is not st and t0 < w.t_end:
                    _hazard("RAW", st, w, label, seg[0], seg[1], space, t0, w.t_end)
        for space, lo, hi, label in w_iv:
            for seg in spaces[space].cover(lo, hi):
                w = seg[2]
                if w is not None and w is not st and t0 < w.t_end:
                    _hazard("WAW", st, w, label, seg[0], seg[1], space, t0, w.t_end)
                for r in seg[3]:
                    if r is not st and t0 < r.t_end:
                        _hazard("WAR", st, r, label, seg[0], seg[1], space, t0, r.t_end)
        for space, lo, hi, _ in r_iv:
            for seg in spaces[space].cover(lo, hi):
                if not seg[3] or seg[3][-1] is not st:
                    seg[3].append(st)
        for space, lo, hi, _ in w_iv:
            for seg in spaces[space].cover(lo, hi):
                seg[2] = st
                seg[3] = []


# ---- rule 10 --------------------------------------------------------------------------------
def check_hbm_writes_disjoint(writes: list) -> None:
    """Rule ``hbm_writes_disjoint`` on ``(lo, hi, pe, stage)`` HBM writes of every PE."""
    writes.sort(key=lambda w: (w[0], w[1]))
    reach = None  # the write reaching furthest so far: (hi, pe, stage)
    for lo, hi, p, st in writes:
        if reach is not None and lo < reach[0] and p != reach[1]:
            _fail("hbm_writes_disjoint", f"PE{p} {stage_desc(st)} writes HBM bytes [{lo}, {hi}) that PE{reach[1]} "
                                         f"{stage_desc(reach[2])} also writes")
        if reach is None or hi > reach[0]:
            reach = (hi, p, st)
