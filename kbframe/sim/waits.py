"""What each op_log record waited for: the input of the critical path (issue 13).

The op_log says when each stage, dispatch and command ran; this log says, per record and
in the same order, *why it started when it did*. It is kept in memory (seven integers a
record) and never written into ``op_log.jsonl``, whose bytes stay as they were.
:meth:`WaitLog.rows` hands it to :mod:`kbframe.report.critical_path`.

Every wait is decided where it happens (PE_CPU, PE_SCHEDULER, the units) and recorded
in one place, as the op_log records the event (:class:`~kbframe.sim.oplog.OpLog`
appends to :attr:`WaitLog.data`). Wait kinds, with what ``ref`` names:

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
==========  ==========================  =============================================

``end_ref`` is a second wait: for a DMA stage, the record of the transfer whose data
phase ended when this one's began (the channel was busy), or -1 when the data waited
only for the stage's own setup; for a command, the record of the stage whose end
completed it (-1: a command with no stages). Command refs are PE-local ids; record refs
are op_log record indices (0-based lines).
"""
from __future__ import annotations

from array import array

#: wait kind names, by the code stored per record
KINDS = ("start", "cpu", "room", "wait", "dispatch", "hazard", "fifo", "dep", "admit", "unit")
#: wait kind name → its code (what OpLog stores)
WAIT_CODE = {k: i for i, k in enumerate(KINDS)}
_RAW_STAGE = -1  # kind of a stage record until rows() classifies it
_FIELDS = 7  # per record: name code, cmd, t_start, t_end, t_data (-1: none), kind, ref


class WaitLog:
    """Per op_log record, its times and what it waited for (module doc). Times in ps.

    :class:`~kbframe.sim.oplog.OpLog` appends each record's :data:`_FIELDS` integers to
    :attr:`data` (inline: it is once per record). A stage stores only its times and the
    record of the predecessor that readied it (``Stage.ready_by``, -1: none): whether it
    then waited for its unit, and for which transfer a DMA data phase waited, follows
    from the times of the records before it on the same unit, and :meth:`rows` works it
    out after the run, as it does a dispatch's previous dispatch and the stage that
    completed a command (the record just before the command's: PE_SCHEDULER logs the
    command as its last stage ends).
    """

    def __init__(self):
        self.data = array("q")
        self._names: dict = {}           # (pe, unit, op_kind) -> code
        self._name_list: list = []       # code -> (pe, unit, op_kind)

    def code(self, pe: int, unit: str, op_kind: str) -> int:
        """The code of a record name ``(pe, unit, op_kind)``; callers cache it."""
        key = (pe, unit, op_kind)
        c = self._names.get(key)
        if c is None:
            c = self._names[key] = len(self._name_list)
            self._name_list.append(key)
        return c

    def names(self) -> list:
        """``(pe, unit, op_kind)`` of each code, by code."""
        return list(self._name_list)

    def __len__(self) -> int:
        return len(self.data) // _FIELDS

    def rows(self) -> list[tuple]:
        """Every record as ``(pe, unit, op_kind, cmd, t_start, t_end, t_data, kind, ref,
        end_ref)``, times in ps (``t_data`` -1: none), ``kind`` a name from :data:`KINDS`.

        Worked out here: a stage was ready at its predecessor's end (``dep``) or at its
        command's admission (``admit``), and if it started later, the unit's stage that
        ended at its start held it (``unit``); a DMA data phase that began as the
        channel's previous transfer ended waited for that one (``end_ref``); a dispatch
        that waited for ``cpu`` waited for the PE's previous dispatch; a command's
        ``end_ref`` is the stage just before its record, if that stage is its own."""
        d, names = self.data, self._name_list
        n = len(d) // _FIELDS
        admit_ps = {}
        for b in range(0, n * _FIELDS, _FIELDS):
            if d[b + 5] != _RAW_STAGE:
                pe, unit, _ = names[d[b]]
                if unit == "scheduler":
                    admit_ps[(pe, d[b + 1])] = d[b + 2]
        ended_at: dict = {}        # (pe, unit) -> {t_end: record}, records so far
        last: dict = {}            # (pe, unit) -> (t_end, record) of its latest
        last_dispatch: dict = {}   # pe -> record of its latest dispatch
        kinds, cpu_code = KINDS, WAIT_CODE["cpu"]
        out = []
        for i in range(n):
            b = i * _FIELDS
            code, cmd, t0, t1, t_data, kind, ref = d[b:b + _FIELDS]
            pe, unit, op_kind = names[code]
            end_ref = -1
            if kind == _RAW_STAGE:
                key = (pe, unit)
                if ref >= 0:
                    ready, why = d[ref * _FIELDS + 3], "dep"
                else:
                    ready, why, ref = admit_ps.get((pe, cmd), t0), "admit", cmd
                ends = ended_at.get(key)
                if ends is None:
                    ends = ended_at[key] = {}
                if t0 != ready:
                    why, ref = "unit", ends.get(t0, -1)
                prev = last.get(key)
                if t_data >= 0 and prev is not None and prev[0] == t_data:
                    end_ref = prev[1]
                ends[t1] = i
                last[key] = (t1, i)
            elif unit == "cpu":
                why = kinds[kind]
                if kind == cpu_code:
                    ref = last_dispatch.get(pe, -1)
                    if ref < 0:
                        why = "start"
                last_dispatch[pe] = i
            else:
                why = kinds[kind]
                if i > 0:
                    p = out[i - 1]
                    if p[0] == pe and p[3] == cmd and p[1] not in ("cpu", "scheduler"):
                        end_ref = i - 1
            out.append((pe, unit, op_kind, cmd, t0, t1, t_data, why, ref, end_ref))
        return out
