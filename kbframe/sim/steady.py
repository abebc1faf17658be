"""Skipping a steady stretch inside one simulation: the loops of a kernel along the
workload's periodic axis (:meth:`~kbframe.workloads.base.Workload.periodic_axis`), and along
the axes nested in its steps (:meth:`~kbframe.workloads.base.Workload.nested_axes`: a
decoder layer's KV tiles), go through :meth:`kbframe.tl.context.TL.steps`, and while a
:class:`Steady` is installed on the engine (``Engine.steady``) such a loop may leave out a
stretch of its iterations: each :class:`Axis` by its own rules.

Per loop instance (the ``k``-th loop of an axis a PE enters; the PEs of an SPMD kernel
enter theirs together), the first PE to reach iteration ``i`` decides: when ``i`` is past
:attr:`Steady.min_steps` and the times at which this PE's kernel reached its last
iterations repeat with some candidate period ``p`` (two equal spans of ``p`` iterations,
PE_CPU no longer filling PE_SCHEDULER's queue), the loop jumps from ``J = i`` to ``J + R``
on every PE that runs the instance, ``R`` a multiple of ``p`` and of the sizes of the
buffer rings the loop rotates through (``TL.steps(..., rings)``: the state repeats only when
both do), leaving at least ``p + after`` iterations and the epilogue to simulate (``after``: the
axis's, 2 unless the workload says). Command ids go on without a
gap, so the run is exactly a run of the workload with ``R`` fewer steps: what it leaves out
is checked by :mod:`kbframe.run.jump_checks` and put back by :mod:`kbframe.run.skipped`.

A weight-streaming GEMM's output tiles (:data:`WEIGHT_TILES`, among the axes when the
workload's weight GEMMs repeat, ``Workload.ff_weight_tiles``) are a loop too, inside one
command: at the ``k``-th such command a PE admits
(:meth:`Steady.gemm_tiles`), its plan leaves out output tiles ``J .. J + R - 1``
(kbframe.hw.tiling.leave_out), alike on every PE, ``R`` a multiple of the GEMM's period
(:data:`WEIGHT_TILES`) and ``J`` three periods in (one to settle, two to check; the axis's
``min_steps`` at least): the decision is taken at admission, not seen, since such a loop
is DMA-bound from its first tiles (all its transfers are queued at once), and what is put
back is checked as any jump's is. Its iterations are marked when the first transfer of an
output tile ends.

It only decides; the time of each iteration's start, each PE's command ids and a snapshot
of the run's totals (``snapshot``, given by the run layer) at the iterations before the
jump are what :mod:`kbframe.run.skipped` needs to put the stretch back.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from ..errors import RecordBudgetError
from ..hw.tiling import gemm_tile_loop, leave_out


@dataclass(frozen=True)
class Axis:
    """An axis whose loops may jump: its bench ``key``, candidate ``periods`` (in
    iterations), the iterations simulated before a jump may be decided (``min_steps``) and
    after the period checked past it (``after``: the loop's end must not reach back into
    that period; a KV tile's few commands need 2, a layer's thousands 1)."""

    key: str
    periods: tuple
    min_steps: int
    after: int = 2

    @property
    def multiple(self) -> int:
        return math.lcm(*self.periods)

    @property
    def window(self) -> int:
        """Iterations before a jump whose ids and totals are kept."""
        return 2 * max(self.periods)

    @property
    def tail(self) -> int:
        """Iterations after a jump at most: a period checked, and the end."""
        return max(self.periods) + self.after

    def least(self, multiple: int | None = None) -> int:
        """The fewest iterations a jump leaves out: fewer would not pay for the check
        (``multiple``: of the candidate periods and the loop's rings; None: the periods')."""
        return max(self.multiple if multiple is None else multiple, 2 * self.multiple)

    def too_short(self, n: int, multiple: int | None = None) -> bool:
        """Whether a loop of ``n`` iterations is too short to leave anything out."""
        return n - self.min_steps - self.tail < self.least(multiple)

    @property
    def fewest_simulated(self) -> int:
        """The fewest iterations a loop that jumps simulates: those before it is seen
        steady (``min_steps``, and two of the shortest candidate period), that period
        checked after the jump, and ``after``."""
        p = min(self.periods)
        return max(self.min_steps, 2 * p) + p + self.after


#: the output tiles of a weight-streaming GEMM (a decode GEMV), each K tile a transfer and
#: a GEMM stage: left out from the fifth on at the earliest, a period checked and two more
#: simulated to its end. A GEMM's period is the fewest output tiles that hold
#: :data:`WARM_TILES` K tiles or more and a multiple of the DMA channel's transfers in flight
#: (transfers bound by their setup latency end in groups of that many); a period's worth
#: runs before the two checked (the transfers in flight settle)
WEIGHT_TILES = Axis("weight tiles", (1,), 4, 2)
WARM_TILES = 16


@dataclass
class Instance:
    """The ``k``-th loop of an axis on each PE. ``key``: the axis; ``level``: 0 for the
    workload's periodic axis, 1 for an axis nested in its steps; ``n``: its iterations;
    ``J``, ``R``: the jump (None: none), from iteration ``J`` to ``J + R``, decided with
    period ``p``;
    ``furthest``: the furthest iteration a PE reached; ``first[pe]``: the first command id
    the loop issued on ``pe``;
    ``ids[pe][i]``: the next command id when ``pe`` reached iteration ``i`` (iterations
    ``J - window .. J``), ``ids[pe][J]`` the first command after the jump; ``snaps``: what
    :attr:`Steady.snapshot` gave when the first PE reached iteration ``i`` (the same
    iterations); ``times``: when the first PE reached the last iterations (ps);
    ``jumped``: the PEs whose loop jumped; ``tiles``: a weight GEMM's tile loop
    (:data:`WEIGHT_TILES`): the tiles of an iteration (an output tile's K tiles), 0 for a
    kernel's loop."""

    n: int
    key: str = ""
    level: int = 0
    multiple: int | None = None  # lcm of the candidate periods and the loop's rings: alike on every PE
    ring: int | None = None  # lcm of the loop's rings (a jump is a multiple of it): alike on every PE
    J: int | None = None
    R: int = 0
    p: int = 0  # the period the loop looked steady with
    furthest: int = -1
    first: dict = field(default_factory=dict)
    ids: dict = field(default_factory=dict)
    snaps: dict = field(default_factory=dict)
    times: deque = None
    jumped: set = field(default_factory=set)
    tiles: int = 0


def _tile_period(per: int, in_flight: int) -> int:
    """The period, in output tiles of ``per`` K tiles, of a weight GEMM's tile loop
    (:data:`WEIGHT_TILES`) whose DMA channel has ``in_flight`` transfers in flight at once."""
    p = 1
    while p * per < WARM_TILES or p * per % in_flight:
        p += 1
    return p


class Steady:
    """The controller of one simulation's jumps (module doc).

    Args:
        axes: the :class:`Axis` es whose loops may jump, the workload's periodic axis first
            (a loop of another key is left alone).
        snapshot: ``(engine, first=None) -> (records so far, totals dict, commands in
            flight per PE, {pe: commands completed})``, taken at each iteration start
            before a jump (kbframe.run.skipped); the totals None while a PE of ``first``
            (a loop's first command id per PE) has not completed it.
        max_records: a run holding more records than this while its outer loops have not
            jumped stops with RecordBudgetError (0: never).
        run: what the run is, as RecordBudgetError names it (e.g. the bench and its shape).
        probe: ``(engine, instance, k, periods) -> exception | False | int``: an early
            verdict on the first jump of each axis of the innermost level (not a weight
            GEMM's tiles, whose verdict reads the GEMM's end), once every PE has jumped:
            an exception (raised here: the jump cannot be put back, whatever the run does
            next), False (it may be), or the records to wait for before asking again
            (kbframe.run.jump_checks.probe). None: every verdict waits for the run's end.
        repeats: ``(engine, instance, i, periods) -> bool``: whether, for one of the
            candidate periods that divide a jump at iteration ``i``, the records of the two
            periods before it repeat as far as they are in, asked of a loop before it jumps
            there (kbframe.run.jump_checks.repeats); where they do not, it does not jump. None:
            not asked.
    """

    def __init__(self, axes, snapshot, max_records: int = 0, run: str = "the run", probe=None, repeats=None):
        self.axes = {a.key: (0 if j == 0 else 1, a) for j, a in enumerate(axes)}  # nested: level 1
        self.snapshot = snapshot
        self.probe = probe
        self.repeats = repeats
        #: the first jump of each axis of the innermost level whose verdict the run does
        #: not wait for: [(instance, its k, its axis, records to wait for)]
        self._probing: list = []
        self._probed: set = set()
        self._deepest = max(level for level, _ in self.axes.values())  # its jumps are put back first
        self.max_records = max_records  # records the run may hold before its outer loops jump (0: any)
        self.run = run
        self.engine = None  # set by the engine it is installed on (kbframe.run.simulate)
        self.instances: list[Instance] = []  # every axis's, in the order first entered
        self._by_key: dict = {}  # key -> its instances, k-th first
        self._entered: dict = {}
        self.broken: str | None = None  # why this run cannot stand for the full one
        #: the last loop whose jump :attr:`repeats` held back (kbframe.run.jump_checks.repeats)
        self.unrepeated: str | None = None
        #: the weight GEMMs' tile axis when the run may leave out their tiles, else None
        self.tile_axis = self.axes[WEIGHT_TILES.key][1] if WEIGHT_TILES.key in self.axes else None
        #: per axis, the records made when a loop of it first jumped (a weight GEMM: first
        #: left tiles out): those before are what the run makes without that axis too
        self.first_jump: dict = {}

    def steps(self, tl, key: str, n: int, rings: tuple = ()):
        """The iterations of a loop of ``n`` along ``key`` on ``tl``'s PE whose buffers
        rotate through rings of these sizes (TL.steps)."""
        if key not in self.axes:
            return range(n)
        level, axis = self.axes[key]
        return self._iterate(tl, n, level, axis, math.lcm(axis.multiple, *rings), math.lcm(1, *rings))

    def _iterate(self, tl, n: int, level: int, axis: Axis, multiple: int, ring: int):
        pe = tl.pe.index
        k = self._entered.get((pe, axis.key), 0)
        self._entered[(pe, axis.key)] = k + 1
        mine = self._by_key.setdefault(axis.key, [])
        if k == len(mine):
            mine.append(Instance(n, axis.key, level, times=deque(maxlen=axis.window + 1)))
            self.instances.append(mine[-1])
        inst = mine[k]
        inst.first[pe] = tl.last_cmd_id + 1
        inst.multiple = inst.multiple or multiple
        inst.ring = inst.ring or ring
        if inst.n != n or inst.multiple != multiple or inst.ring != ring:  # not one loop: nothing left out here
            self.broken = (f"loop {k} of {axis.key} has {n} iterations on PE{pe}, {inst.n} on another"
                           if inst.n != n else
                           f"loop {k} of {axis.key} rotates other buffer rings on PE{pe} than on another")
            yield from range(n)
            return
        least = axis.least(multiple)
        if axis.too_short(n, multiple):
            yield from range(n)
            return
        env = tl.pe.env
        ids: dict = {}
        i = 0
        while i < n:
            if inst.J is None or i <= inst.J:
                ids[i] = tl.last_cmd_id + 1
                ids.pop(i - axis.window - 1, None)
            # the first PE to reach i follows the run and decides, while a jump could still leave enough out
            if inst.J is None and i > inst.furthest and n - i - 1 - axis.after >= least:
                inst.furthest = i
                if level == 0 and self.max_records and len(self.engine.oplog.table) > self.max_records:
                    raise RecordBudgetError(
                        f"{self.run} holds {len(self.engine.oplog.table):,} op_log records at step {i} of {n} along "
                        f"{axis.key} before they repeat, over run.max_records={self.max_records:,}; raise "
                        f"run.max_records or shrink the run")
                inst.times.append(env.now)
                if i >= axis.min_steps - axis.window:
                    inst.snaps[i] = self.snapshot(self.engine, inst.first)
                    inst.snaps.pop(i - axis.window - 1, None)
                p = self._steady(inst, i, axis.periods) if i >= axis.min_steps else None
                m = math.lcm(p, ring) if p else 0  # the state repeats every m iterations
                R = (n - i - p - axis.after) // m * m if p else 0  # after it: a period checked, and the end
                if R >= least:
                    self._jump(inst, k, i, R, p, level, axis)
            if i == inst.J:
                inst.jumped.add(pe)
                inst.ids[pe] = dict(ids)
                i += inst.R
            if self._probing:
                self._ask()
            yield i
            i += 1

    def _jump(self, inst: Instance, k: int, i: int, R: int, p: int, level: int, axis: Axis) -> None:
        """Make the ``k``-th loop ``inst`` of ``axis`` jump from iteration ``i`` by ``R``
        (it looked steady with period ``p``), unless its records so far do not repeat for
        any period dividing ``R`` (:attr:`repeats`): then it goes on, to jump later if it can."""
        if self.repeats is not None and not self.repeats(self.engine, inst, i,
                                                         tuple(q for q in axis.periods if R % q == 0)):
            self.unrepeated = f"loop {k} of {axis.key} looked steady at step {i}, its records not repeating"
            return
        inst.J, inst.R, inst.p = i, R, p
        self.first_jump.setdefault(axis.key, len(self.engine.oplog.table))
        if self.probe is not None and axis.key not in self._probed and level == self._deepest:
            self._probed.add(axis.key)
            self._probing.append([inst, k, axis, 0])

    def _ask(self) -> None:
        """Ask :attr:`probe` about each first jump waiting for its verdict whose PEs have all
        jumped and whose records are in; raise what it finds."""
        n, built = len(self.engine.oplog.table), None
        for entry in list(self._probing):
            inst, k, axis, need = entry
            if n < need:
                continue
            built = built or {pe.index for pe in self.engine.pes.built()}
            if not built <= inst.jumped:
                continue
            got = self.probe(self.engine, inst, k, axis.periods)
            if isinstance(got, Exception):
                raise got
            if got is False:
                self._probing.remove(entry)
            else:
                entry[3] = got

    def gemm_tiles(self, pe, cmd) -> dict | None:
        """At ``cmd``'s admission on ``pe``: when
        it is a weight-streaming GEMM (kbframe.hw.tiling.gemm_tile_loop) whose loop is long
        enough, leave out its output tiles from ``J`` on (three of its periods: one to
        settle, two checked; :attr:`Axis.min_steps` at least), whole periods of them but
        the one checked and ``after`` (module doc), and return, per tile where the
        iterations before the jump begin (their first K tile, numbered as planned), what
        its first transfer's end calls (:attr:`Stage.effect`); else None."""
        loop = gemm_tile_loop(cmd, pe.by_role)
        axis = self.tile_axis
        if loop is None:
            return None
        n, per = loop
        p = _tile_period(per, getattr(pe.by_role["dma_read"], "max_outstanding", 1))
        J = max(axis.min_steps, 3 * p)  # left out from output tile J on
        R = (n - J - p - axis.after) // p * p
        if R < 2 * p:  # fewer would not pay for the check
            return None
        k = self._entered.get((pe.index, axis.key), 0)
        self._entered[(pe.index, axis.key)] = k + 1
        mine = self._by_key.setdefault(axis.key, [])
        if k == len(mine):
            mine.append(Instance(n, axis.key, 1, tiles=per))
            self.instances.append(mine[-1])
        inst = mine[k]
        if inst.n != n or inst.tiles != per:
            self.broken = f"weight GEMM {k} has {n}×{per} tiles on PE{pe.index}, {inst.n}×{inst.tiles} on another"
            return None
        inst.J, inst.R, inst.p = J, R, p
        self.first_jump.setdefault(axis.key, len(self.engine.oplog.table))
        inst.first[pe.index] = cmd.id
        inst.jumped.add(pe.index)
        leave_out(cmd, J, R)
        return {i * per: partial(self._tile_reached, inst, pe, i) for i in (J - 2 * p, J - p, J)}

    def _tile_reached(self, inst: Instance, pe, i: int) -> None:
        """``pe``'s weight GEMM ``inst`` begins iteration ``i`` (its first transfer ended)."""
        inst.ids.setdefault(pe.index, {})[i] = pe.cpu.n_commands + 1
        if i not in inst.snaps:  # the first PE to get here takes the snapshot
            inst.snaps[i] = self.snapshot(self.engine)

    def _steady(self, inst: Instance, i: int, periods: tuple) -> int | None:
        """Whether the run looks steady at iteration ``i``: for a candidate period, the last
        two periods took equal times, added equal numbers of records and grew every total
        alike, and each PE had as many commands in flight at their ends
        (PE_CPU filling PE_SCHEDULER's queue dispatches at an even pace too, but faster
        than the units complete commands); and the loop's first command had completed
        on each PE when the two began (PE_CPU runs ahead of the units: the records of
        the loop's first iterations may come after those of what preceded it). The
        shortest such period, or None."""
        t, snaps = list(inst.times), inst.snaps
        for p in sorted(periods):
            if len(t) <= 2 * p or i - 2 * p not in snaps:
                continue
            if t[-1] - t[-1 - p] != t[-1 - p] - t[-1 - 2 * p]:
                continue
            n = [snaps[i - j * p][0] for j in range(3)]
            if not n[0] - n[1] == n[1] - n[2] > 0:
                continue
            if not snaps[i][2] == snaps[i - p][2] == snaps[i - 2 * p][2]:
                continue
            done = snaps[i - 2 * p][3]  # the loop's own commands ran in both periods
            if any(done.get(pe, 0) < first for pe, first in inst.first.items()):
                continue
            a, b, c = (snaps[i - j * p][1] for j in (2, 1, 0))  # taken: the loop's first commands had run
            if all(c[k] - b[k] == b[k] - a.get(k, 0) for k in c):
                return p
        return None

    @property
    def jumps(self) -> list:
        """``(k, instance)`` of every loop that jumped (``k``: its place among its axis's
        loops), in the order the loops were first entered."""
        ks = {id(inst): k for mine in self._by_key.values() for k, inst in enumerate(mine)}
        return [(ks[id(inst)], inst) for inst in self.instances if inst.J is not None]
