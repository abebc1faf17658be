"""PE_SCHEDULER: admits commands in dispatch order, plans their stages from the flat ops
and feeds them to the PE's units; completes each command's handle when its last stage
ends (ADR-0065 D3/D6, DDD-0065 §7–§8).

Hazards are strict FIFO (DDD-0065 §8): a command that reads what an in-flight command
writes (RAW), or writes what one reads or writes (WAR/WAW), waits until that command
completes, and every later command waits behind it. Hazards compare the byte ranges
that a command's op inputs, outputs and ``rw_handles`` name, per memory space.

This module imports nothing recipe-related (ADR-0065 D6.5).
"""
from __future__ import annotations

from collections import deque

from ..ir.commands import hazard_ranges
from .params import at_least_one
from .tiling import PlanCache, plan_stages
from .unit import PeUnit


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


class PeScheduler(PeUnit):
    """PE_SCHEDULER of one PE.

    Args:
        max_queued_commands: commands that may wait for admission; PE_CPU blocks beyond.
    Raises:
        ValueError: ``max_queued_commands`` < 1.
    """

    roles = ("admission",)
    label = "PE_SCHEDULER"

    def __init__(self, max_queued_commands: int = 64, description: str = "", roles=None, label=None):
        super().__init__(description, roles, label)
        at_least_one("max_queued_commands", max_queued_commands)
        self.max_queued = int(max_queued_commands)
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

    def has_room(self) -> bool:
        return len(self.queue) < self.max_queued

    def submit(self, cmd) -> None:
        """Take a command from PE_CPU (at the end of its dispatch)."""
        self.queue.append(cmd)
        if self.blocked_on is None:
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

    def _unblock(self, completion) -> None:
        self.blocked_on = None
        self._admit("hazard", completion.cmd_id)

    def _start(self, cmd, reads, writes, why: str, ref: int) -> None:
        plans = self._plans
        if plans is None:
            stages = plan_stages(cmd, self.pe.by_role, self.pe.numerics)
        else:
            stages = plans.stages(cmd, self.pe.by_role, self.pe.numerics)
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
