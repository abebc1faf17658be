"""PE_SCHEDULER: admits commands in dispatch order, plans their stages from the flat ops
and feeds them to the PE's units; completes each command's handle when its last stage
ends (ADR-0065 D3/D6, DDD-0065 §7–§8).

A command that reads what an in-flight command writes (RAW), or writes what one reads
or writes (WAR/WAW), waits until that command completes. Hazards compare the byte ranges
that a command's op inputs, outputs and ``rw_handles`` name, per memory space. What
happens to the commands behind a blocked one is the ``policy``:

- ``strict_fifo`` (the default; DDD-0065 §8, ADR-0065 D6.3): every later command waits
  behind it; commands are admitted in dispatch order.
- ``rw_aware`` (ADR-0065 A4, deferred there): a later command whose byte
  ranges have no hazard with any in-flight command **and** none with any older command
  still queued is admitted ahead of the blocked one. A command never passes one it has
  a RAW, WAR or WAW hazard with, nor an IPCQ send or receive one on the same link (a
  receive takes the link's next message), so program order holds wherever it matters (the
  sanitizer checks it: rules ``rw_no_interleave``, ``data_dependencies``). Two readers
  of the same bytes are no hazard, as in ``strict_fifo``. Each completion re-scans the
  queue (≤ ``max_queued_commands``) in order.

This module imports nothing recipe-related (ADR-0065 D6.5).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..ir.commands import hazard_ranges
from ..ir.handles import Completion
from ..params import Choice, param
from .tiling import PlanCache, plan_stages
from .unit import PeUnit


def _link(cmd):
    """``(kind, peer)`` of an IPCQ send or receive, else None: under ``rw_aware`` such a
    command never passes an older queued one on the same link (a receive takes the link's
    next message, so two receives admitted out of order would swap their messages)."""
    op = getattr(cmd, "op", None)
    return (op.kind, op.extra["peer"]) if op is not None and op.kind in ("send", "recv") else None


def _overlap(xs, ys) -> bool:
    for s1, lo1, hi1 in xs:
        for s2, lo2, hi2 in ys:
            if s1 == s2 and lo1 < hi2 and lo2 < hi1:
                return True
    return False


class _InFlight:
    __slots__ = ("cmd", "remaining", "reads", "writes", "touched", "t_admit", "why", "ref")

    def __init__(self, cmd, remaining, reads, writes, t_admit, why, ref):
        self.cmd, self.remaining, self.reads, self.writes, self.t_admit = cmd, remaining, reads, writes, t_admit
        self.touched = reads + writes  # what a later writer must not overlap (WAR and WAW)
        self.why, self.ref = why, ref  # what its admission waited for (kbframe.sim.waits)


class Policy(Choice):
    """Admission policies (module doc)."""

    strict_fifo = "strict_fifo"  # every later command waits behind a blocked one (ADR-0065 D6.3)
    rw_aware = "rw_aware"  # hazard-free commands overtake a blocked one (ADR-0065 A4)


@dataclass
class SchedulerParams:
    """PE_SCHEDULER's parameters."""

    max_queued_commands: int = param(64, doc="commands that may wait for admission; PE_CPU blocks beyond", lo=1)
    policy: str = param("strict_fifo", choices=Policy, doc="strict_fifo (ADR-0065 D6.3) or rw_aware (A4: "
                                                           "hazard-free commands overtake a blocked one)")


class PeScheduler(PeUnit):
    """PE_SCHEDULER of one PE; its parameters: :class:`SchedulerParams` (kbframe.hw.unit.PeUnit)."""

    Params = SchedulerParams

    roles = ("admission",)
    label = "PE_SCHEDULER"
    energy_keys = ("pj_per_admission",)

    def energy_actions(self, work) -> list:
        """One admission per command (its hazard check and stage plan)."""
        return [("admissions", "pj_per_admission", work.count)]

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._rw_aware = self.policy == "rw_aware"
        self._ranges: dict = {}  # rw_aware: cmd id -> [reads, writes, touched, what held it, cmd] while queued
        self._scanning, self._rescan = False, None
        self.max_queued = self.max_queued_commands
        self.queue: deque = deque()
        self.inflight: dict[int, _InFlight] = {}
        self.blocked_on = None
        self._head = None  # (cmd, reads, writes) of a blocked queue head, kept for its retry
        self.room_waiters: list = []
        self.pe = None
        self.n_commands = 0
        #: ``[(cmd, stages)]`` in admission order when the sanitizer is on (run.check), else None
        self.record = None

    def bind(self, pe) -> None:
        self.pe = pe
        self.env = pe.env
        # timing-only: one plan per command shape; data mode: effects are per command
        self._plans = None if pe.numerics.enabled else PlanCache(plan_stages)
        for unit in pe.stage_units.values():
            unit.bind(pe, unit.name or "", self._stage_done)

    def share_plans(self, shared: dict) -> None:
        """Plan each command shape once for all the PEs that pass the same ``shared`` dict
        (timing only: kbframe.hw.tiling.PlanCache)."""
        if self._plans is not None:
            self._plans.share(shared)

    def has_room(self) -> bool:
        return len(self.queue) < self.max_queued

    def submit(self, cmd) -> None:
        """Take a command from PE_CPU (at the end of its dispatch)."""
        self.queue.append(cmd)
        if self._rw_aware:
            if len(self.queue) == 1:
                self._scan("dispatch", cmd.id)
            else:  # the older queued commands are as blocked as they were: try the new one
                self._scan("dispatch", cmd.id, new_only=True)
        elif self.blocked_on is None:
            self._admit()

    def _blocker(self, reads, writes):
        for rec in self.inflight.values():  # dispatch order: the oldest conflict first
            if _overlap(writes, rec.touched) or _overlap(reads, rec.writes):  # WAR/WAW, RAW
                return rec.cmd.completion
        return None

    def _admit(self, why: str = "dispatch", ref: int = -1) -> None:
        """Admit queued commands in order while none is blocked. ``why``/``ref``: what the
        first admitted command waited for (kbframe.sim.waits): its own ``dispatch`` (called
        from :meth:`submit`) or, after a blocker completed, the ``hazard`` on command
        ``ref``; the commands admitted behind it in the same call waited in ``fifo`` order
        behind the one before them. A PE_CPU waiting for room learns which admission made
        it (the event's value: that command's id)."""
        first = -1
        while self.queue:
            cmd = self.queue[0]
            head = self._head
            if head is not None and head[0] is cmd:
                _, reads, writes = head
            else:
                reads, writes = hazard_ranges(cmd)
            blocker = self._blocker(reads, writes)
            if blocker is not None:
                self.blocked_on = (cmd, blocker)
                self._head = (cmd, reads, writes)
                blocker.on_done(self._unblock)
                break
            self._head = None
            self.queue.popleft()
            self._start(cmd, reads, writes, why, cmd.id if why == "dispatch" else ref)
            why, ref = "fifo", cmd.id
            if first < 0:
                first = cmd.id
        self._wake(first)

    def _wake(self, admitted: int) -> None:
        """PE_CPU waits for room and command ``admitted`` (-1: none) was just admitted:
        there is room now, so it resumes at once (not only once the queue has drained)."""
        if admitted >= 0 and self.room_waiters:
            waiters, self.room_waiters = self.room_waiters, []
            for ev in waiters:
                ev.succeed(admitted)

    @staticmethod
    def _behind(reads, writes, link, older):
        """The first of ``older`` (``[reads, writes, touched, wait, cmd, link]`` of older
        commands still queued) that a command has a hazard (RAW, WAR, WAW) with, or that
        sends or receives on the same IPCQ link (``link``, :func:`_link`: messages are
        matched in order), or None."""
        for o in older:
            if _overlap(writes, o[2]) or _overlap(reads, o[1]) or (link is not None and link == o[5]):
                return o
        return None

    def _scan(self, why: str, ref: int, new_only: bool = False) -> None:
        """``rw_aware``: admit, in queue order, each queued command with no hazard against
        any in-flight command nor any older command left in the queue (module doc).
        ``why``/``ref`` as :meth:`_admit` (``dispatch`` of the new command, or the
        ``hazard`` whose completion triggered the scan). ``new_only``: check only the
        newest command (nothing else changed since the last scan). A queued command
        remembers what held it (an in-flight command's completion, or an older queued
        command) and is not re-checked while that still holds: a scan costs one step per
        queued command unless something it waited for has gone."""
        if self._scanning:  # a command completed inside a scan (one without stages)
            self._rescan = (why, ref)
            return
        self._scanning, first = True, -1
        ranges = self._ranges
        while True:
            older: list = []
            kept: deque = deque()
            todo = list(self.queue)
            if new_only:
                kept.extend(todo[:-1])
                older = [ranges[c.id] for c in todo[:-1]]
                todo = todo[-1:]
            for cmd in todo:
                rw = ranges.get(cmd.id)
                if rw is None:
                    reads, writes = hazard_ranges(cmd)
                    rw = ranges[cmd.id] = [reads, writes, reads + writes, None, cmd, _link(cmd)]
                wait = rw[3]
                if wait is not None and (not wait.done if wait.__class__ is Completion else wait.id in ranges):
                    older.append(rw)  # still held by what held it
                    kept.append(cmd)
                    continue
                reads, writes = rw[0], rw[1]
                wait = self._blocker(reads, writes)
                if wait is None:
                    o = self._behind(reads, writes, rw[5], older)
                    wait = o[4] if o else None
                if wait is not None:
                    rw[3] = wait
                    older.append(rw)
                    kept.append(cmd)
                    continue
                del ranges[cmd.id]
                self._start(cmd, reads, writes, why, cmd.id if why == "dispatch" else ref)
                if first < 0:
                    first = cmd.id
            self.queue = kept  # (nothing is dispatched during a scan: PE_CPU is a process)
            if self._rescan is None:
                break
            (why, ref), self._rescan, new_only = self._rescan, None, False
        self._scanning = False
        if kept:  # for a deadlock's message: the oldest queued command and what it waits for
            r = ranges[kept[0].id]
            self.blocked_on = (kept[0], self._blocker(r[0], r[1]))
        else:
            self.blocked_on = None
        self._wake(first)

    def _unblock(self, completion) -> None:
        self.blocked_on = None
        self._admit("hazard", completion.cmd_id)

    def plan(self, cmd) -> list:
        """The stages of ``cmd``, fresh (timing only: copied from its shape's cached plan)."""
        plans = self._plans
        if plans is None:
            return plan_stages(cmd, self.pe.by_role, self.pe.numerics)
        return plans.stages(cmd, self.pe.by_role, self.pe.numerics)

    def n_stages(self, cmd) -> int:
        """How many stages ``cmd`` would have (the pre-flight dry run counts them)."""
        plans = self._plans
        if plans is None:
            return len(plan_stages(cmd, self.pe.by_role, self.pe.numerics))
        return plans.count(cmd, self.pe.by_role, self.pe.numerics)

    def _start(self, cmd, reads, writes, why: str, ref: int) -> None:
        steady = self.pe.steady
        marks = None
        if steady is not None and steady.tile_axis is not None and self._plans is not None:
            # a run that fast-forwards may leave out a weight GEMM's output tiles (kbframe.sim.steady)
            marks = steady.gemm_tiles(self.pe, cmd)
        stages = self.plan(cmd)
        if marks:
            for st in stages:
                if st.tile in marks and st.op_kind == "dma_read":
                    st.effect = marks.pop(st.tile)
        self.n_commands += 1
        self.inflight[cmd.id] = _InFlight(cmd, len(stages), reads, writes, self.env.now, why, ref)
        if self.record is not None:
            self.record.append((cmd, stages))
        if not stages:
            self._complete(cmd)
            return
        for st in stages:
            if st.deps == 0:
                st.unit.submit(st)

    def _release(self, stage) -> None:
        """A stage ended: apply its numeric effect, log it, submit successors now ready."""
        if stage.effect is not None:
            stage.effect()
        self.pe.oplog.stage(self.pe.index, stage)
        seq = stage.seq
        for s in stage.succs:
            s.deps -= 1
            if s.deps == 0:
                s.ready_by = seq
                s.unit.submit(s)

    def _stage_done(self, stage) -> None:
        self._release(stage)
        rec = self.inflight[stage.cmd.id]
        rec.remaining -= 1
        if rec.remaining == 0:
            self._complete(stage.cmd)

    def _complete(self, cmd) -> None:
        rec = self.inflight.pop(cmd.id)
        now = self.env.now
        self.pe.oplog.command(self.pe.index, cmd, rec.t_admit, now, rec.why, rec.ref)
        cmd.completion.fire(now)
        if self._rw_aware and self.queue:
            self._scan("hazard", cmd.id)
