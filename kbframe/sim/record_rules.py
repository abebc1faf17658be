"""The sanitizer's rules that read the run's records (kbframe.sim.sanitizer lists them all):
1 ``commands_once``, 2 ``cpu_dispatch_serial``, 3 ``unit_capacity`` per PE, and 7–9
``ipcq_matched``, ``ipcq_arrival``, ``ipcq_credits`` per link, on the columns of the run's
:class:`~kbframe.records.RecordTable` (times in integer ps).

Each rule is decided column by column (a few numpy operations per PE, not a Python step
per record); a rule that does not hold names its first violation, in the order the rule
states, from the same columns.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..errors import SanitizerError
from ..records import RecordTable
from ..sorting import groups


def _ns(ps: int) -> str:
    return f"{ps / 1000:g} ns"


def _fail(rule: str, msg: str):
    raise SanitizerError(f"sanitizer: rule {rule} violated: {msg}", rule)


class PeRecords:
    """One PE's records in record order, as int64 columns (``unit`` a code into
    ``units``, sorted by name; ``td`` -1: no data phase)."""

    def __init__(self, units: list, unit, cmd, tile, t0, t1, td):
        self.units, self.unit, self.cmd, self.tile, self.t0, self.t1, self.td = units, unit, cmd, tile, t0, t1, td

    def code(self, unit: str) -> int:
        return self.units.index(unit) if unit in self.units else -1


def by_pe(table: RecordTable) -> dict:
    """``{pe: PeRecords}`` of every PE with records, and ``None: PeRecords`` with none."""
    c = table.cols()
    units = sorted(set(table.name_col(1)))
    pe_of = np.array(table.name_col(0), dtype=np.int64)[c["name"]]
    unit_of = np.array([units.index(u) for u in table.name_col(1)], dtype=np.int64)[c["name"]]
    order, pes, start = groups(pe_of)  # each PE's records, in record order
    bounds = list(start.tolist()) + [len(order)]
    out = {}
    for i, pe in enumerate(pes.tolist()):
        rows = order[bounds[i]:bounds[i + 1]]
        out[pe] = PeRecords(units, unit_of[rows], *(c[f][rows] for f in ("cmd", "tile", "t0", "t1", "td")))
    empty = np.zeros(0, dtype=np.int64)
    out[None] = PeRecords(units, empty, empty, empty, empty, empty, empty)
    return out


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


def rules_1_to_3(pe, r: PeRecords, plan) -> tuple[dict, list]:
    """Rules ``commands_once``, ``cpu_dispatch_serial`` and ``unit_capacity`` on one PE's
    records; ``plan`` its ``(cmd, stages)`` by command id. Returns ``(spans, dispatches)``:
    ``{cmd: (t_admit, t_done)}`` and the sorted ``(t_start, cmd)`` of its dispatches."""
    cpu, sched = r.unit == r.code("cpu"), r.unit == r.code("scheduler")
    spans = _commands_once(pe, r, cpu, sched, plan)
    dispatches = _cpu_dispatch_serial(pe.index, r.cmd[cpu], r.t0[cpu], r.t1[cpu])
    _unit_capacity(pe, r, ~cpu & ~sched)
    return spans, dispatches


def _commands_once(pe, r: PeRecords, cpu, sched, plan) -> dict:
    """Rule ``commands_once``: every dispatched command admitted and completed once, after
    its dispatch ended, its planned stages run once each, inside its span."""
    rule, p = "commands_once", pe.index
    d_cmd, d_t1 = r.cmd[cpu], r.t1[cpu]
    d_ids, d_n = np.unique(d_cmd, return_counts=True)
    bad = np.nonzero(d_n != 1)[0]
    if len(bad):
        _fail(rule, f"PE{p} command {int(d_ids[bad[0]])} was dispatched {int(d_n[bad[0]])} times")
    t_disp = d_t1[np.argsort(d_cmd)]  # each dispatch's end, by command id (each dispatched once)
    s_cmd, s_t0, s_t1 = r.cmd[sched], r.t0[sched], r.t1[sched]
    s_ids, s_n = np.unique(s_cmd, return_counts=True)
    ids = np.union1d(d_ids, s_ids)
    dispatched = np.isin(ids, d_ids)
    done = np.zeros(len(ids), dtype=np.int64)
    done[np.searchsorted(ids, s_ids)] = s_n
    bad = np.nonzero(~dispatched | (done != 1))[0]
    if len(bad):
        i = bad[0]
        c = int(ids[i])
        if not dispatched[i]:
            _fail(rule, f"PE{p} command {c} completed but was never dispatched")
        times = [_ns(t) for t in s_t1[s_cmd == c].tolist()]
        _fail(rule, f"PE{p} command {c} completed {int(done[i])} times"
                    + (f" (at {', '.join(times)})" if times else " (never; dispatched at "
                       f"{_ns(int(t_disp[np.searchsorted(d_ids, c)]))})"))
    s_disp = t_disp[np.searchsorted(d_ids, s_cmd)]
    bad = np.nonzero(s_t0 < s_disp)[0]  # in record order
    if len(bad):
        j = bad[0]
        _fail(rule, f"PE{p} command {int(s_cmd[j])} was admitted at {_ns(int(s_t0[j]))}, before its "
                    f"dispatch ended at {_ns(int(s_disp[j]))}")
    if pe.cpu.n_commands != len(d_ids):
        _fail(rule, f"PE{p} PE_CPU counted {pe.cpu.n_commands} dispatches, the op_log has {len(d_ids)}")
    spans = dict(zip(s_cmd.tolist(), zip(s_t0.tolist(), s_t1.tolist())))
    planned = {cmd.id: (cmd, stages) for cmd, stages in plan}
    stage = ~cpu & ~sched
    ran = dict(zip(*(x.tolist() for x in np.unique(r.cmd[stage], return_counts=True))))
    for c in sorted(set(d_ids.tolist()) | set(planned)):
        if c not in planned:
            _fail(rule, f"PE{p} command {c} was dispatched but PE_SCHEDULER never admitted it")
        cmd, stages = planned[c]
        if not cmd.completion.done or cmd.completion.t_done_ps != spans[c][1]:
            _fail(rule, f"PE{p} command {c}: its completion is done={cmd.completion.done} at "
                        f"{cmd.completion.t_done_ps} ps, the op_log says {_ns(spans[c][1])}")
        if ran.get(c, 0) != len(stages):
            _fail(rule, f"PE{p} command {c} planned {len(stages)} stages but {ran.get(c, 0)} ran")
        t0, t1 = spans[c]
        for st in stages:
            if st.t_start < t0 or st.t_end > t1:
                _fail(rule, f"PE{p} command {c}: stage {stage_desc(st)} ran "
                            f"{_ns(st.t_start)}–{_ns(st.t_end)}, outside the command's span "
                            f"{_ns(t0)}–{_ns(t1)}")
    return spans


def _cpu_dispatch_serial(p: int, cmd, t0, t1) -> list:
    """Rule ``cpu_dispatch_serial``: in order of start (then command), each dispatch starts
    after the one before ended, command ids increasing. Returns ``[(t_start, cmd)]`` in
    that order."""
    order = np.lexsort((cmd, t0))
    a0, a1, ac = t0[order], t1[order], cmd[order]
    over, back = a0[1:] < a1[:-1], ac[1:] < ac[:-1]
    bad = np.nonzero(over | back)[0]
    if len(bad):
        k = int(bad[0])
        c, c0, prev = int(ac[k + 1]), _ns(int(a0[k + 1])), int(ac[k])
        if over[k]:
            _fail("cpu_dispatch_serial", f"PE{p} PE_CPU dispatched command {c} from {c0} while command {prev} "
                                         f"was still dispatching ({_ns(int(a0[k]))}–{_ns(int(a1[k]))})")
        _fail("cpu_dispatch_serial", f"PE{p} PE_CPU dispatched command {c} at {c0}, after command {prev} "
                                     f"(out of program order)")
    return list(zip(a0.tolist(), ac.tolist()))


def _unit_capacity(pe, r: PeRecords, stage) -> None:
    """Rule ``unit_capacity``: per unit (by name), no more stages in flight than its
    ``channels``, and DMA data phases one at a time."""
    for u in np.unique(r.unit[stage]).tolist():
        name = r.units[u]
        unit = pe.stage_units.get(name)
        if unit is None:
            _fail("unit_capacity", f"PE{pe.index} op_log names unit '{name}', which the PE does not have")
        limit = int(getattr(unit, "channels", 1))
        on = np.nonzero(r.unit == u)[0]
        if _most_at_once(r.t0[on], r.t1[on]) > limit:
            _name_overlap(pe.index, name, r.t0[on], r.t1[on], r.cmd[on], r.tile[on], limit, "stages in flight")
        data = on[r.td[on] >= 0]
        if _most_at_once(r.td[data], r.t1[data]) > 1:
            _name_overlap(pe.index, name, r.td[data], r.t1[data], r.cmd[data], r.tile[data], 1, "DMA data phases")


def _name_overlap(p, unit, t0, t1, cmd, tile, limit, what):
    """Name where more than ``limit`` intervals ``[t0, t1)`` are open at once (the sweep
    of :func:`_most_at_once`, interval by interval): the instant and the intervals open."""
    events = []
    for iv in zip(t0.tolist(), t1.tolist(), cmd.tolist(), tile.tolist()):
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
            _fail("unit_capacity", f"PE{p} {unit}: {len(active)} {what} at once at {_ns(t)}, limit {limit} ({desc})")


def stage_desc(st) -> str:
    tile = f" tile {st.tile}" if st.tile >= 0 else ""
    on = "" if st.op_kind == st.unit.name else f" on {st.unit.name}"
    return f"{st.op_kind}{on} of command {st.cmd.id}{tile}"


def check_ipcq(engine, table: RecordTable) -> None:
    """Rules ``ipcq_matched``, ``ipcq_arrival`` and ``ipcq_credits`` from the send and
    receive records (each names its ``peer``)."""
    c = table.cols()
    at = np.nonzero(c["peer"] >= 0)[0]
    sends, recvs = defaultdict(list), defaultdict(list)
    for code, peer, cmd, t0, t1, nbytes in zip(*(c[f][at].tolist() for f in ("name", "peer", "cmd", "t0", "t1",
                                                                                "bytes"))):
        pe, unit, _ = table.names[code]
        role = engine.pes[pe].units[unit].roles
        if "ipcq_send" in role:
            sends[(pe, peer)].append((t0, t1, cmd, nbytes))
        elif "ipcq_recv" in role:
            recvs[(peer, pe)].append((t0, t1, cmd, nbytes))
    for (src, dst), link in sorted(engine.fabric.links.items()):
        s = sorted(sends[(src, dst)], key=lambda r: (r[0], r[2]))
        v = sorted(recvs[(src, dst)], key=lambda r: (r[1], r[2]))
        if len(s) != len(v):
            _fail("ipcq_matched", f"link PE{src}→PE{dst}: {len(s)} send(s) but {len(v)} receive(s)")
        events = []
        for k, (a, b) in enumerate(zip(s, v)):
            if a[3] != b[3]:
                _fail("ipcq_matched", f"link PE{src}→PE{dst} message {k}: PE{src} command {a[2]} sent "
                                      f"{a[3]} B, PE{dst} command {b[2]} received {b[3]} B")
            arrive = a[1] + link.latency_ps
            if b[1] < arrive:
                _fail("ipcq_arrival", f"link PE{src}→PE{dst} message {k}: PE{dst} command {b[2]} received it at "
                                      f"{_ns(b[1])}, before it arrived at {_ns(arrive)}")
            events += [(a[0], 1), (b[1], -1)]
        held = 0
        for t, d in sorted(events, key=lambda e: (e[0], e[1])):  # a receive frees its credit first
            held += d
            if held > link.credits:
                _fail("ipcq_credits", f"link PE{src}→PE{dst} held {held} messages at {_ns(t)}, "
                                      f"more than its {link.credits} credits")
