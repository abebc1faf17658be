"""The simulation sanitizer (``run.check=true``): after a run, check that the schedule the
simulator produced is one real hardware could have run, from ``op_log.jsonl`` and the
engine state. A violation raises :class:`~kbframe.errors.SanitizerError` naming the rule,
the commands and the simulated times.

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
afterwards re-plans every command with :class:`FootprintNumerics`, which returns, in
place of numeric effects, the byte ranges each stage reads and writes. Each PE is checked
in its own program order; across PEs, data moves only through IPCQ (rules 7–9) and HBM
writes never share bytes (rule 10).
"""
from __future__ import annotations

import heapq
import json
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from ..errors import SanitizerError
from .footprint import FootprintNumerics, Space, WriteUnion, bounds, footprint, hazard_free
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


def read_oplog(path) -> list[dict]:
    """The records of an ``op_log.jsonl`` file, or of a text stream holding one
    (``io.StringIO``)."""
    if hasattr(path, "getvalue"):
        return parse_oplog(path.getvalue())
    with open(path) as f:
        return parse_oplog(f.read())


def parse_oplog(text: str) -> list[dict]:
    """The records of op_log text (one JSON parse of the whole text: half the time of one
    a line)."""
    lines = [line for line in text.split("\n") if line.strip()]
    return json.loads("[" + ",".join(lines) + "]") if lines else []


def check(engine, records) -> dict:
    """Check a finished run against every rule in :data:`RULES`, PE by PE in order (rules
    1–6 of each PE), then rules 7–9 and 10 where they apply.

    Args:
        engine: the :class:`~kbframe.sim.engine.Engine` after ``run`` (with :func:`enable`
            called before the run; without it the stage-level rules 1 (stage counts),
            5 and 6 cannot run and raise).
        records: the op_log records (dicts), a path to ``op_log.jsonl`` or a text stream
            holding its text.
    Returns:
        ``{"rules_checked", "rules", "commands", "stages", "accesses"}``.
    Raises:
        SanitizerError: the first violation, naming the rule, commands and times.
    """
    if isinstance(records, (str, Path)) or hasattr(records, "getvalue"):
        records = read_oplog(records)
    cols = _Columns.of(records)
    by_pe = defaultdict(list)
    if cols is None:  # a record with a missing or odd field: the record-by-record rules only
        for r in records:
            by_pe[r["pe"]].append(r)
    n_cmds = n_stages = n_acc = 0
    hbm_writes: list = []
    for pe, plan in _plans(engine):
        held = _rules_1_to_3_hold(pe, cols.of_pe(pe.index), plan) if cols is not None else None
        if held is None:  # a violation (or no columns): the rules below name it
            recs = by_pe.get(pe.index, []) if cols is None else [records[i] for i in cols.rows_of(pe.index)]
            spans = check_commands_once(pe, recs, plan)
            check_cpu_dispatch_serial(pe.index, recs)
            check_unit_capacity(pe, recs)
            dispatches = sorted((_ps(r["t_start_ns"]), r["cmd"]) for r in recs if r["unit"] == "cpu")
        else:
            spans, dispatches = held
        check_tcm_no_overlap(pe.index, pe.tcm.allocations, pe.tcm.capacity_bytes, dispatches)
        check_rw_no_interleave(pe.index, plan, spans)
        n_acc += check_data_dependencies(pe, plan, hbm_writes)
        n_cmds += len(plan)
        n_stages += sum(len(st) for _, st in plan)
    rules = list(RULES)
    if engine.fabric.links:
        check_ipcq(engine, records)
        rules += IPCQ_RULES
    if sum(bool(pe.scheduler.record) for pe in engine.pes.built()) > 1:  # more than one PE kept stage records
        check_hbm_writes_disjoint(hbm_writes)
        rules += MULTI_PE_RULES
    return {"rules_checked": len(rules), "rules": rules, "commands": n_cmds,
            "stages": n_stages, "accesses": n_acc}


def _plans(engine):
    """``(pe, plan)`` per built PE in order, the plan sorted by command id (raises
    SanitizerError at the first PE that kept no stage record)."""
    for pe in engine.pes.built():
        if pe.scheduler.record is None:
            raise SanitizerError("sanitizer: PE_SCHEDULER kept no stage record; call "
                                 "kbframe.sim.sanitizer.enable(engine) before the run")
        yield pe, sorted(pe.scheduler.record, key=lambda cs: cs[0].id)


# ---- rules 1-3 on op_log columns ------------------------------------------------------------
class _Columns:
    """The op_log's records as numpy columns (times in integer ps, ``td`` -1: no data
    phase; ``unit`` a code into ``units``), so rules 1-3 cost a few array operations per
    PE rather than Python steps per record."""

    def __init__(self, pe, unit, units, cmd, t0, t1, td):
        self.pe, self.unit, self.units, self.cmd, self.t0, self.t1, self.td = pe, unit, units, cmd, t0, t1, td

    @classmethod
    def of(cls, records: list) -> "_Columns | None":
        """None unless every record has integer ``pe`` and ``cmd``, a string ``unit`` and
        times that are whole ps at or after 0 (``t_data_ns`` may be absent): anything else
        goes to the record-by-record rules, as every log did before."""
        try:
            pe, cmd = (np.array([r[k] for r in records]) for k in ("pe", "cmd"))
            unit = [r["unit"] for r in records]
            has_data = np.array(["t_data_ns" in r for r in records], dtype=bool)
            ns = np.array([[r["t_start_ns"], r["t_end_ns"], r.get("t_data_ns", 0.0)] for r in records],
                          dtype=np.float64).reshape(-1, 3)  # (None would read as NaN: refused below)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        if not records:
            pe = cmd = np.zeros(0, dtype=np.int64)
        ps = np.rint(ns * 1000)
        if pe.dtype.kind != "i" or cmd.dtype.kind != "i" or not all(type(u) is str for u in unit) \
                or not np.isfinite(ns).all() or (ns < 0).any() or (ns >= 2.0 ** 52 / 1000).any() \
                or (np.abs(ns * 1000 - ps) > 1e-6).any():  # not whole ps: the record rules compare floats
            return None
        units, unit = np.unique(np.array(unit, dtype=object).astype(str), return_inverse=True)
        t0, t1, td = (ps[:, j].astype(np.int64) for j in range(3))
        td[~has_data] = -1
        return cls(pe.astype(np.int64), unit.reshape(-1).astype(np.int64), [str(u) for u in units],
                   cmd.astype(np.int64), t0, t1, td)

    def rows_of(self, p: int) -> np.ndarray:
        return np.nonzero(self.pe == p)[0]

    def of_pe(self, p: int) -> "_Columns":
        i = self.rows_of(p)
        return _Columns(self.pe[i], self.unit[i], self.units, self.cmd[i], self.t0[i], self.t1[i], self.td[i])

    def code(self, unit: str) -> int:
        return self.units.index(unit) if unit in self.units else -1


def _most_at_once(t0, t1) -> int:
    """The most intervals ``[t0, t1)`` open at one instant (one ending as another starts:
    not at once; zero-length intervals occupy nothing)."""
    keep = t1 > t0
    t0, t1 = t0[keep], t1[keep]
    if not len(t0):
        return 0
    t = np.concatenate([t1, t0])
    step = np.concatenate([np.full(len(t1), -1), np.ones(len(t0), dtype=np.int64)])
    order = np.lexsort((step, t))  # at one time, ends before starts
    return int(np.cumsum(step[order]).max())


def _rules_1_to_3_hold(pe, c: _Columns, plan):
    """Rules ``commands_once``, ``cpu_dispatch_serial`` and ``unit_capacity`` on one PE's
    columns: ``(spans, dispatches)`` as :func:`check_commands_once` and :func:`check` make
    them when every rule holds, else None (the record-by-record rules then name the
    first violation)."""
    cpu, sched = c.unit == c.code("cpu"), c.unit == c.code("scheduler")
    d_cmd, s_cmd = c.cmd[cpu], c.cmd[sched]
    d_ids, d_n = np.unique(d_cmd, return_counts=True)
    s_ids, s_n = np.unique(s_cmd, return_counts=True)
    planned = [cmd.id for cmd, _ in plan]
    if (d_n != 1).any() or (s_n != 1).any() or not np.array_equal(d_ids, s_ids) \
            or pe.cpu.n_commands != len(d_ids) or planned != d_ids.tolist():
        return None
    d_end = c.t1[cpu][np.argsort(d_cmd)]
    s_order = np.argsort(s_cmd)
    s_t0, s_t1 = c.t0[sched][s_order], c.t1[sched][s_order]
    if (s_t0 < d_end).any():
        return None
    stage = ~cpu & ~sched
    ran = dict(zip(*(x.tolist() for x in np.unique(c.cmd[stage], return_counts=True))))
    spans = dict(zip(d_ids.tolist(), zip(s_t0.tolist(), s_t1.tolist())))
    for cmd, stages in plan:
        t0, t1 = spans[cmd.id]
        if not cmd.completion.done or cmd.completion.t_done_ps != t1 or ran.get(cmd.id, 0) != len(stages) \
                or any(st.t_start < t0 or st.t_end > t1 for st in stages):
            return None
    # rule 2: in dispatch order, each dispatch starts after the last ended, ids increasing
    order = np.lexsort((d_cmd, c.t0[cpu]))
    a0, a1, ac = c.t0[cpu][order], c.t1[cpu][order], d_cmd[order]
    if (a0[1:] < a1[:-1]).any() or (ac[1:] < ac[:-1]).any():
        return None
    # rule 3: per unit, stages in flight within its channels, DMA data phases one at a time
    for u in np.unique(c.unit[stage]).tolist():
        unit = pe.stage_units.get(c.units[u])
        on = c.unit == u
        if unit is None or _most_at_once(c.t0[on], c.t1[on]) > int(getattr(unit, "channels", 1)):
            return None
        data = on & (c.td >= 0)
        if _most_at_once(c.td[data], c.t1[data]) > 1:
            return None
    return spans, list(zip(a0.tolist(), ac.tolist()))


# ---- helpers ----------------------------------------------------------------------------
def _ps(ns: float) -> int:
    return int(round(ns * 1000))


def _ns(ps: int) -> str:
    return f"{ps / 1000:g} ns"


def _fail(rule: str, msg: str):
    raise SanitizerError(f"sanitizer: rule {rule} violated: {msg}", rule)


# ---- rule 1 --------------------------------------------------------------------------
def check_commands_once(pe, recs, plan) -> dict:
    """Rule ``commands_once``. Returns ``{cmd_id: (t_admit_ps, t_done_ps)}``."""
    rule, p = "commands_once", pe.index
    dispatched = Counter(r["cmd"] for r in recs if r["unit"] == "cpu")
    spans, t_disp = {}, {}
    for r in recs:
        if r["unit"] == "cpu":
            t_disp[r["cmd"]] = _ps(r["t_end_ns"])
    done = Counter(r["cmd"] for r in recs if r["unit"] == "scheduler")
    for c, n in sorted(dispatched.items()):
        if n != 1:
            _fail(rule, f"PE{p} command {c} was dispatched {n} times")
    for c in sorted(set(dispatched) | set(done)):
        if c not in dispatched:
            _fail(rule, f"PE{p} command {c} completed but was never dispatched")
        if done[c] != 1:
            times = [_ns(_ps(r["t_end_ns"])) for r in recs if r["unit"] == "scheduler" and r["cmd"] == c]
            _fail(rule, f"PE{p} command {c} completed {done[c]} times"
                        + (f" (at {', '.join(times)})" if times else " (never; dispatched at "
                           f"{_ns(t_disp[c])})"))
    for r in recs:
        if r["unit"] == "scheduler":
            c = r["cmd"]
            spans[c] = (_ps(r["t_start_ns"]), _ps(r["t_end_ns"]))
            if spans[c][0] < t_disp[c]:
                _fail(rule, f"PE{p} command {c} was admitted at {_ns(spans[c][0])}, before its "
                            f"dispatch ended at {_ns(t_disp[c])}")
    if pe.cpu.n_commands != len(dispatched):
        _fail(rule, f"PE{p} PE_CPU counted {pe.cpu.n_commands} dispatches, the op_log has {len(dispatched)}")
    planned = {cmd.id: (cmd, stages) for cmd, stages in plan}
    ran = Counter(r["cmd"] for r in recs if r["unit"] not in ("cpu", "scheduler"))
    for c in sorted(set(dispatched) | set(planned)):
        if c not in planned:
            _fail(rule, f"PE{p} command {c} was dispatched but PE_SCHEDULER never admitted it")
        cmd, stages = planned[c]
        if not cmd.completion.done or cmd.completion.t_done_ps != spans[c][1]:
            _fail(rule, f"PE{p} command {c}: its completion is done={cmd.completion.done} at "
                        f"{cmd.completion.t_done_ps} ps, the op_log says {_ns(spans[c][1])}")
        if ran[c] != len(stages):
            _fail(rule, f"PE{p} command {c} planned {len(stages)} stages but {ran[c]} ran")
        t0, t1 = spans[c]
        for st in stages:
            if st.t_start < t0 or st.t_end > t1:
                _fail(rule, f"PE{p} command {c}: stage {_stage_desc(st)} ran "
                            f"{_ns(st.t_start)}–{_ns(st.t_end)}, outside the command's span "
                            f"{_ns(t0)}–{_ns(t1)}")
    return spans


# ---- rule 2 --------------------------------------------------------------------------
def check_cpu_dispatch_serial(p: int, recs) -> None:
    """Rule ``cpu_dispatch_serial``."""
    prev = None
    for r in sorted((r for r in recs if r["unit"] == "cpu"), key=lambda r: (r["t_start_ns"], r["cmd"])):
        if prev is not None:
            if _ps(r["t_start_ns"]) < _ps(prev["t_end_ns"]):
                _fail("cpu_dispatch_serial",
                      f"PE{p} PE_CPU dispatched command {r['cmd']} from {_ns(_ps(r['t_start_ns']))} while "
                      f"command {prev['cmd']} was still dispatching ({_ns(_ps(prev['t_start_ns']))}–"
                      f"{_ns(_ps(prev['t_end_ns']))})")
            if r["cmd"] < prev["cmd"]:
                _fail("cpu_dispatch_serial", f"PE{p} PE_CPU dispatched command {r['cmd']} at "
                      f"{_ns(_ps(r['t_start_ns']))}, after command {prev['cmd']} (out of program order)")
        prev = r


# ---- rule 3 --------------------------------------------------------------------------
def _max_concurrency(rule, p, unit, intervals, limit, what):
    """Sweep ``[(t0, t1, cmd, tile)]``; fail when more than ``limit`` overlap."""
    events = []
    for iv in intervals:
        if iv[1] <= iv[0]:
            continue  # a zero-length stage (an infinitely fast unit) occupies no channel
        events.append((iv[0], 1, iv))
        events.append((iv[1], 0, iv))  # ends sort before starts at the same time
    active = []
    for t, kind, iv in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 0:
            active.remove(iv)
            continue
        active.append(iv)
        if len(active) > limit:
            desc = "; ".join(f"command {c} tile {tl} {_ns(a)}–{_ns(b)}" for a, b, c, tl in active)
            _fail(rule, f"PE{p} {unit}: {len(active)} {what} at once at {_ns(t)}, limit {limit} ({desc})")


def check_unit_capacity(pe, recs) -> None:
    """Rule ``unit_capacity``."""
    per_unit = defaultdict(list)
    for r in recs:
        if r["unit"] not in ("cpu", "scheduler"):
            per_unit[r["unit"]].append(r)
    for name, rs in sorted(per_unit.items()):
        unit = pe.stage_units.get(name)
        if unit is None:
            _fail("unit_capacity", f"PE{pe.index} op_log names unit '{name}', which the PE does not have")
        limit = int(getattr(unit, "channels", 1))
        ivs = [(_ps(r["t_start_ns"]), _ps(r["t_end_ns"]), r["cmd"], r["tile"]) for r in rs]
        _max_concurrency("unit_capacity", pe.index, name, ivs, limit, "stages in flight")
        data = [(_ps(r["t_data_ns"]), _ps(r["t_end_ns"]), r["cmd"], r["tile"]) for r in rs if "t_data_ns" in r]
        if data:
            _max_concurrency("unit_capacity", pe.index, name, data, 1, "DMA data phases")


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
def _stage_desc(st) -> str:
    tile = f" tile {st.tile}" if st.tile >= 0 else ""
    on = "" if st.op_kind == st.unit.name else f" on {st.unit.name}"
    return f"{st.op_kind}{on} of command {st.cmd.id}{tile}"


def _hazard(kind, later, earlier, label, lo, hi, space, t_later, t_earlier):
    if space in ("tcm", "hbm"):
        where = f"'{label}' {space}[{lo}, {hi})"
    else:
        where = ("DMA staging buffer " if space.startswith("stage:") else "GEMM accumulator ") + label
    verb = {"RAW": "reads what", "WAR": "overwrites what", "WAW": "overwrites what"}[kind]
    did = {"RAW": "writes", "WAR": "reads", "WAW": "writes"}[kind]
    began = "began its data phase" if later.t_data >= 0 else "started"
    _fail("data_dependencies",
          f"{kind}: stage {_stage_desc(later)} {began} at {_ns(t_later)}, but it {verb} earlier stage "
          f"{_stage_desc(earlier)} {did} ({where}), and that stage ended only at {_ns(t_earlier)}")


def check_data_dependencies(pe, plan, hbm_writes: list | None = None) -> int:
    """Rule ``data_dependencies``. Returns the number of byte-range accesses checked; HBM
    writes are appended to ``hbm_writes`` as ``(lo, hi, pe, stage)`` for rule 10.

    Every access is first checked at once (kbframe.sim.footprint.hazard_free, numpy);
    only when that cannot show the rule holds are they walked one by one, which names
    the first hazard in program order. A read whose bytes no write of the PE touches (a
    weight streamed from HBM) can be part of no hazard, and is counted but not checked."""
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


# ---- rules 7–9: IPCQ -------------------------------------------------------------------------
def check_ipcq(engine, records) -> None:
    """Rules ``ipcq_matched``, ``ipcq_arrival`` and ``ipcq_credits`` from the op_log's send
    and receive records (each names its ``peer``)."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for r in records:
        if "peer" not in r:
            continue
        role = engine.pes[r["pe"]].units[r["unit"]].roles
        if "ipcq_send" in role:
            sends[(r["pe"], r["peer"])].append(r)
        elif "ipcq_recv" in role:
            recvs[(r["peer"], r["pe"])].append(r)
    for (src, dst), link in sorted(engine.fabric.links.items()):
        s = sorted(sends[(src, dst)], key=lambda r: (_ps(r["t_start_ns"]), r["cmd"]))
        v = sorted(recvs[(src, dst)], key=lambda r: (_ps(r["t_end_ns"]), r["cmd"]))
        if len(s) != len(v):
            _fail("ipcq_matched", f"link PE{src}→PE{dst}: {len(s)} send(s) but {len(v)} receive(s)")
        events = []
        for k, (a, b) in enumerate(zip(s, v)):
            if a["bytes"] != b["bytes"]:
                _fail("ipcq_matched", f"link PE{src}→PE{dst} message {k}: PE{src} command {a['cmd']} sent "
                                      f"{a['bytes']} B, PE{dst} command {b['cmd']} received {b['bytes']} B")
            arrive = _ps(a["t_end_ns"]) + link.latency_ps
            if _ps(b["t_end_ns"]) < arrive:
                _fail("ipcq_arrival", f"link PE{src}→PE{dst} message {k}: PE{dst} command {b['cmd']} received it at "
                                      f"{_ns(_ps(b['t_end_ns']))}, before it arrived at {_ns(arrive)}")
            events += [(_ps(a["t_start_ns"]), 1), (_ps(b["t_end_ns"]), -1)]
        held = 0
        for t, d in sorted(events, key=lambda e: (e[0], e[1])):  # a receive frees its credit first
            held += d
            if held > link.credits:
                _fail("ipcq_credits", f"link PE{src}→PE{dst} held {held} messages at {_ns(t)}, "
                                      f"more than its {link.credits} credits")


# ---- rule 10 --------------------------------------------------------------------------------
def check_hbm_writes_disjoint(writes: list) -> None:
    """Rule ``hbm_writes_disjoint`` on ``(lo, hi, pe, stage)`` HBM writes of every PE."""
    writes.sort(key=lambda w: (w[0], w[1]))
    reach = None  # the write reaching furthest so far: (hi, pe, stage)
    for lo, hi, p, st in writes:
        if reach is not None and lo < reach[0] and p != reach[1]:
            _fail("hbm_writes_disjoint", f"PE{p} {_stage_desc(st)} writes HBM bytes [{lo}, {hi}) that PE{reach[1]} "
                                         f"{_stage_desc(reach[2])} also writes")
        if reach is None or hi > reach[0]:
            reach = (hi, p, st)
