"""What each op_log record waited for: the input of the critical path.

The op_log says when each stage, dispatch and command ran; this log says, per record and
in the same order, *why it started when it did*. It is kept in memory (the ``why`` and ``ref``
of each record of the run's table, kbframe.records) and never written into
``op_log.jsonl``, whose bytes stay as they were.
:meth:`WaitLog.rows` hands it to :mod:`kbframe.report.critical_path`.

Every wait is decided where it happens (PE_CPU, PE_SCHEDULER, the units) and recorded
in one place, as the op_log records the event (:class:`~kbframe.sim.oplog.OpLog`
appends to its table). Wait kinds, with what ``ref`` names:

==========  ==========================  =============================================
record      kind                        ref
==========  ==========================  =============================================
dispatch    ``start``                   -1: the kernel's first command
            ``cpu``                     the previous dispatch's record: PE_CPU was busy
            ``room``                    command whose admission made room in the queue
            ``wait``                    command a ``tl.wait`` waited for
admission   ``dispatch``                the command itself: admitted when dispatched
(command)   ``hazard``                  command whose completion cleared a RAW/WAR/WAW
            ``fifo``                    command admitted just before it (strict order)
stage       ``dep``                     record of the predecessor stage that ended last
            ``admit``                   its command (no predecessor: ready at admission)
            ``unit``                    record of the unit's stage that ended at its
                                        start (unit busy; on DMA, no free slot)
            ``link``                    (an IPCQ receive) the send whose message it
                                        waited for; the gap is the link's latency
==========  ==========================  =============================================

``end_ref`` is a second wait: for a DMA stage, the record of the transfer whose data
phase ended when this one's began (the channel was busy), or -1 when the data waited
only for the stage's own setup; for a command, the record of the stage whose end
completed it (-1: a command with no stages). Command refs are PE-local ids; record refs
are op_log record indices (0-based lines).
"""
from __future__ import annotations

import numpy as np

from ..records import Labels, RecordTable
from ..sorting import stable_order

#: wait kind names, by the code stored per record
KINDS = ("start", "cpu", "room", "wait", "dispatch", "hazard", "fifo", "dep", "admit", "unit", "link")
#: wait kind name → its code (what OpLog stores)
WAIT_CODE = {k: i for i, k in enumerate(KINDS)}
_RAW_STAGE = -1  # kind of a stage record until rows() classifies it
_LINK_STAGE = -2  # kind of an IPCQ receive readied by its message (ref: the send's record)


class WaitLog:
    """Per record of a :class:`~kbframe.records.RecordTable` (``OpLog.table``), what it
    waited for (module doc), worked out from the table's columns. Times in ps.

    :class:`~kbframe.sim.oplog.OpLog` stores each record's ``why`` and ``ref`` in the
    table. A stage stores only its times and the record of the predecessor that readied
    it (``Stage.ready_by``, -1: none): whether it then waited for its unit, and for which
    transfer a DMA data phase waited, follows from the times of the records before it on
    the same unit, and :meth:`rows` works it out after the run, as it does a dispatch's
    previous dispatch and the stage that completed a command (the record just before the
    command's: PE_SCHEDULER logs the command as its last stage ends).
    """

    def __init__(self, table: RecordTable | None = None):
        self.table = RecordTable() if table is None else table

    def code(self, pe: int, unit: str, op_kind: str) -> int:
        """The code of a record name ``(pe, unit, op_kind)``; callers cache it."""
        return self.table.code(pe, unit, op_kind)

    def names(self) -> list:
        """``(pe, unit, op_kind)`` of each code, by code."""
        return list(self.table.names)

    def __len__(self) -> int:
        return len(self.table)

    def rows(self) -> list[tuple]:
        """Every record as ``(pe, unit, op_kind, cmd, t_start, t_end, t_data, kind, ref,
        end_ref)`` (:meth:`columns`, record by record)."""
        return list(zip(*(list(c) if isinstance(c, Labels) else c.tolist() for c in self.columns())))

    def columns(self, waits: bool = True) -> tuple:
        """The records' fields as ten columns, one per field, in record order: ``(pe, unit,
        op_kind, cmd, t_start, t_end, t_data, kind, ref, end_ref)``, times in ps (``t_data``
        -1: none), ``kind`` a name from :data:`KINDS`; the integers as int64 arrays, the
        names as :class:`~kbframe.records.Labels`.

        Worked out here: a stage was ready at its predecessor's end (``dep``) or at its
        command's admission (``admit``), and if it started later, the unit's stage that
        ended at its start held it (``unit``: the latest such record before it); a DMA
        data phase that began as the channel's previous transfer ended waited for that
        one (``end_ref``); a dispatch that waited for ``cpu`` waited for the PE's previous
        dispatch; a command's ``end_ref`` is the stage just before its record, if that
        stage is its own. Column by column (numpy): one Python step per record would be
        most of the critical path's cost on a long run. ``waits`` False: the records alone
        (``kind``, ``ref`` and ``end_ref`` None)."""
        names = self.table.names
        c = self.table.cols()
        n = len(c["name"])
        if n == 0:
            none = np.zeros(0, dtype=np.int64)
            return (none, Labels(none, ()), Labels(none, ()), none, none, none, none, Labels(none, KINDS), none, none)
        code, cmd, t0, t1, t_data, kind, ref = (c[f] for f in ("name", "cmd", "t0", "t1", "td", "why", "ref"))
        units = sorted({u for _, u, _ in names})
        pe_of = np.array([pe for pe, _, _ in names], dtype=np.int64)[code]
        unit_of = np.array([units.index(u) for _, u, _ in names], dtype=np.int64)[code]
        kinds = sorted({k for _, _, k in names})
        kind_of = np.array([kinds.index(k) for _, _, k in names], dtype=np.int64)[code]
        if not waits:  # the records alone
            return (pe_of, Labels(unit_of, units), Labels(kind_of, kinds), cmd, t0, t1, t_data, None, None, None)
        cpu_u = units.index("cpu") if "cpu" in units else -1
        sched_u = units.index("scheduler") if "scheduler" in units else -1
        stage = kind <= _RAW_STAGE
        why = np.where(stage, 0, kind)  # a code into KINDS
        ref = ref.copy()
        end_ref = np.full(n, -1, dtype=np.int64)
        cmd_key = (pe_of << 40) | cmd  # (pe, command): commands below 2^40

        # stages: ready at the predecessor's end, else at the command's admission (the
        # latest admission record of the command anywhere in the log), else at their start
        st = np.nonzero(stage)[0]
        s_ref, s_t0 = ref[st], t0[st]
        link = kind[st] == _LINK_STAGE  # a receive readied by its message: ref is the send's record
        dep = s_ref >= 0
        ready = np.where(dep, t1[np.where(dep, s_ref, 0)], s_t0)
        adm = np.nonzero(~stage & (unit_of == sched_u))[0]
        a_keys = cmd_key[adm]
        order = np.argsort(a_keys, kind="stable")
        a_keys, a_t0 = a_keys[order], t0[adm][order]
        q = st[~dep]
        pos = np.searchsorted(a_keys, cmd_key[q], side="right") - 1
        found = (pos >= 0) & (a_keys[np.maximum(pos, 0)] == cmd_key[q])
        ready[~dep] = np.where(found, a_t0[np.maximum(pos, 0)], s_t0[~dep])
        s_why = np.where(dep, WAIT_CODE["dep"], WAIT_CODE["admit"])
        s_ref = np.where(dep, s_ref, cmd[st])
        # held by its unit: the latest stage of the same (pe, unit) before it that ended
        # at its start (-1: none)
        stream = pe_of[st] * len(units) + unit_of[st]
        s_why[link] = WAIT_CODE["link"]
        late = np.nonzero((s_t0 != ready) & ~link)[0]
        if len(late):
            s_why[late] = WAIT_CODE["unit"]
            s_ref[late] = _latest_before(stream, t1[st], st, stream[late], s_t0[late], st[late])
        # a data phase that began as the previous transfer of its stream ended
        prev = _previous_in_group(stream, st)
        td = t_data[st]
        chained = (td >= 0) & (prev >= 0) & (t1[np.maximum(prev, 0)] == td)
        end_ref[st[chained]] = prev[chained]
        why[st], ref[st] = s_why, s_ref

        # dispatches that waited for PE_CPU: the PE's previous dispatch (none: the start)
        cpu = np.nonzero(~stage & (unit_of == cpu_u))[0]
        if len(cpu):
            prev = _previous_in_group(pe_of[cpu], cpu)
            waited = kind[cpu] == WAIT_CODE["cpu"]
            ref[cpu[waited]] = prev[waited]
            why[cpu[waited & (prev < 0)]] = WAIT_CODE["start"]
        # a command: completed by the stage just before its record, if that stage is its own
        other = np.nonzero(~stage & (unit_of != cpu_u))[0]
        other = other[other > 0]
        b = other - 1
        own = ((pe_of[b] == pe_of[other]) & (cmd[b] == cmd[other]) & (unit_of[b] != cpu_u)
               & (unit_of[b] != sched_u))
        end_ref[other[own]] = b[own]

        cmd, t0, t1, t_data = (np.ascontiguousarray(x) for x in (cmd, t0, t1, t_data))  # not views of the whole table
        return (pe_of, Labels(unit_of, units), Labels(kind_of, kinds), cmd, t0, t1, t_data, Labels(why, KINDS), ref,
                end_ref)


def _by_key(key: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``np.lexsort((at, key))``: by key, then ``at``; one stable sort when ``at`` ascends
    (record indices in order: kbframe.sorting)."""
    if len(at) > 1 and not (at[1:] > at[:-1]).all():
        return np.lexsort((at, key))
    return stable_order(key)


def _previous_in_group(group, at) -> np.ndarray:
    """For each record ``at[i]`` (indices), the index of the latest record before it in
    the same ``group[i]`` (-1: none)."""
    order = _by_key(group, at)
    prev = np.full(len(at), -1, dtype=np.int64)
    same = group[order][1:] == group[order][:-1]
    prev[order[1:][same]] = at[order[:-1][same]]
    return prev


def _latest_before(keys, times, at, q_keys, q_times, q_at) -> np.ndarray:
    """For each query ``(q_keys, q_times, q_at)``: the largest ``at`` of an entry with the
    same key and time and ``at < q_at`` (-1: none). Entries ``(keys, times, at)``; keys
    below 2^13 and times below 2^50 (MAX_PS), ``at`` ≥ 0. One sort of the entries by
    (key and time, then ``at``); the queries are looked up in it."""
    if not len(keys):
        return np.full(len(q_keys), -1, dtype=np.int64)
    if max(keys.max(), q_keys.max(initial=0)) >= 1 << 13:  # numbered densely first
        _, dense = np.unique(np.concatenate([keys, q_keys]), return_inverse=True)
        keys, q_keys = dense[:len(keys)], dense[len(keys):]
    e = (keys.astype(np.int64) << 50) | times
    q = (q_keys.astype(np.int64) << 50) | q_times
    order = _by_key(e, at)
    e, a = e[order], at[order]
    rank = np.concatenate(([0], np.cumsum(e[1:] != e[:-1])))  # of each entry's (key, time)
    span = int(max(a.max(initial=0), q_at.max(initial=0))) + 1
    ranked = rank * span + a  # ascending
    i = np.minimum(np.searchsorted(e, q), len(e) - 1)
    known = e[i] == q
    pos = np.searchsorted(ranked, rank[i] * span + q_at, side="left") - 1
    hit = known & (pos >= 0) & (ranked[np.maximum(pos, 0)] // span == rank[i])
    return np.where(hit, a[np.maximum(pos, 0)], -1)
