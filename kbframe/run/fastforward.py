"""Fast-forward (``run.fast_forward``): a timing-only run whose schedule becomes
periodic is not simulated period by period. Its records are the shifted copies of one
period, and they are written as such.

It is first made in one simulation whose loops leave a steady stretch out
(:func:`_in_one`, kbframe.sim.steady, kbframe.run.jump_checks and kbframe.run.skipped); when
that cannot be made, from short copies, thus:

1. The workload names the axis its work repeats along
   (:meth:`~kbframe.workloads.base.Workload.periodic_axis`): decode's context length in steps of one
   KV tile. Taking ``k`` steps off the axis takes ``k`` periods of work out of the middle of
   the run and keeps the warm-up, the ragged last tile and the epilogue.
2. Four short copies of the bench are simulated in full, with ``n``, ``n + p``, ``n + 2p``
   and ``n + 3p`` steps (``p`` a candidate period, in steps: 1, 2, 3, 4, 6, 8). Each stream
   of records (one unit of one PE: its dispatches, its stages, its commands) is compared
   between the first two: the records they share from the start (the prefix), the
   records the second has in excess (one period's block) and the records that follow,
   the same in both but shifted (the tail); when the period adds records at several places
   of a stream (a KV tile of each of a PE's items), a block and a shifted stretch per place,
   each block at the same tile of its item's loop. Every integer of a record (command id, tile,
   times, what it waited for) moves by its own amount per period, read off the copies;
   the streams then interleave by completion time, ties in the order the copies show
   (records of two neighbouring periods as in the third copy, which holds two; records of
   periods far apart, PE_CPU dispatching many tiles ahead, in the order they were scheduled).
3. A steady state moves every stream by the same time per period. A stream that moves
   by less (PE_CPU still filling PE_SCHEDULER's queue, dispatching ahead of the units) is
   settling: the copies are tried again :data:`GROWTH` times as long (when that is beyond the
   budget, the longer candidate periods first: a schedule that repeats every few steps
   looks settling over one). With blocks at several places, each item's records must all
   move by that item's time. The third and fourth copies
   are predicted from the first two and compared with what was simulated, record by
   record and total by total (counts, bytes, busy time, FLOPs, TCM peak, link traffic).
   Any difference: the next candidate period is tried; when none repeats (PEs
   contending for shared HBM, items of different lengths on one PE), or the copies would
   simulate more than :data:`BUDGET` of the run's steps (:data:`SETTLING_BUDGET` once a
   stream was seen settling), the run is simulated in full,
   and the summary says so.
4. The full run's records are the prefix, the block repeated with its shifts, then the
   tail shifted by all of them (numpy, column by column); its totals are extrapolated the
   same way. ``op_log.jsonl``, ``metrics.json`` (but ``sim.wall_s`` and the
   ``fast_forward`` note) and ``trace.json`` are byte-identical to the full simulation's;
   ``run.fast_forward=verify`` runs both and fails on any difference (the tests run it on
   every golden case and on many-PE runs; ``benchmarks/check_identical.py`` compares all
   its timing-only cases with fast-forward on against a tree without it).

The streams, their comparison and the prediction are :mod:`kbframe.run.periodic`; this
module runs the copies, keeps to the budget, and makes the full run from the prediction.

Only timing-only runs (``bench.data=false``) fast-forward: in data mode every tile's numbers
are computed. With ``run.check`` the sanitizer checks the four short copies, and its counts
are extrapolated like the rest.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np

from ..errors import KbframeError, RecordBudgetError
from ..sim.engine import build_units
from ..periodic_form import find_periodic
from ..record_fields import FIELDS
from ..records import RecordTable
from ..repeated import RepeatedTable
from ..sim import sanitizer
from ..sim.steady import WEIGHT_TILES, Axis, Steady
from ..timebase import MAX_PS
from . import preflight
from . import jump_checks, skipped
from .periodic import NotPeriodic, Runs, Settling, precheck, records_of, streams_of, totals
from .simulate import Simulation, simulate

#: steps the first short copies keep before the periods they vary (warm-up reached by
#: then) ...
MIN_STEPS = 16
#: ... times this while a stream is still settling (decode_opt2's PE_CPU settles after ~50
#: KV tiles: copies from 64 tiles on show its steady state, whatever the run's length modulo
#: the period)
GROWTH = 4
#: candidate periods, in steps of the periodic axis
PERIODS = (1, 2, 3, 4, 6, 8)
#: a run fast-forwards only when this many periods or more would be skipped
MIN_COPIES = 8
#: ``run.oplog=auto``: a fast-forwarded run of this many records or more writes its op_log in
#: periodic form (a model step's; a kernel's run stays greppable record by record)
PERIODIC_FROM = 1_000_000
#: the short copies may simulate at most this share of the run's steps (else it is cheaper
#: to simulate the run) ...
BUDGET = 0.1
#: ... or this share once a stream was seen settling: the schedule repeats and only its
#: warm-up is longer than the copies (decode_opt2's PE_CPU needs ~50 KV tiles: copies of
#: 14 % of a 2048-tile run; with the sanitizer on, the run then takes half the time)
SETTLING_BUDGET = 0.3


@dataclass
class Outcome:
    """A fast-forwarded run: the simulation object standing for the full run (its engine,
    op_log totals and record table extrapolated: what :meth:`write_oplog` writes) and
    what was done. ``sim`` None: simulate in full."""

    sim: Simulation | None
    note: str
    #: records one period adds (every stream's block): its op_log's periodic form repeats
    #: windows of this many records or of a part of it (kbframe.periodic_form.find_periodic)
    period_records: int = 0
    #: ``sim`` is the run simulated in full (in one simulation, no loop left anything out):
    #: nothing was made; its sanitizer verdict is still to be taken
    whole: bool = False
    #: its records a RepeatedTable: the simulated run's phases, and per PE the period's
    #: first command and commands (kbframe.run.skipped.Made.simulated)
    simulated: tuple | None = None

    def write_oplog(self, path, form: str = "auto") -> int:
        """The full run's ``op_log.jsonl`` text, written to ``path`` from its record table
        (its time counts in ``sim.wall_s``, as a simulation's streamed op_log does), record
        by record or, ``form`` ``periodic`` (``auto``: from :data:`PERIODIC_FROM` records on),
        in periodic form when its records repeat (kbframe.records: the table's ``form`` set,
        which the trace draws too); the lines written."""
        t = time.perf_counter()
        table = self.sim.oplog.table
        if not self.whole and (form == "periodic" or (form == "auto" and len(table) >= PERIODIC_FROM)):
            table.form = _form(table, self.period_records)
        lines = self.sim.oplog.write(path)
        self.sim.engine.wall_s += time.perf_counter() - t
        return lines


#: a RepeatedTable's form is found in the run with its period put back this many times at most
FORM_PERIODS = 3


def _form(table: RecordTable, period: int):
    """The periodic form of ``table``'s records (kbframe.periodic_form.find_periodic). A
    :class:`~kbframe.repeated.RepeatedTable`'s is found in the same run with its period
    put back :data:`FORM_PERIODS` times at most, the section that runs up to or across them
    repeating the periods left out too; else in its records."""
    if isinstance(table, RepeatedTable) and table.X > FORM_PERIODS:
        m = FORM_PERIODS
        short = find_periodic(table.with_periods(m), period)
        form = short.inserted(table.x + m * table.P, table.P, table.X - m) if short is not None else None
        if form is not None:
            return form
    return find_periodic(table, period)


def _apply(sim: Simulation, tot: dict, table: RecordTable) -> None:
    """Make ``sim`` (the longest short copy) stand for the full run: its records ``table``
    and totals ``tot``, set through the op_log, PE_CPU and links."""
    e, o = sim.engine, sim.oplog
    sim.latency_ps = tot["latency_ps"]
    o.restore_totals(tot)
    o.replace_records(table)
    pe_of = np.array(table.name_col(0), dtype=np.int64)
    is_cpu = np.array([u == "cpu" for u in table.name_col(1)], dtype=bool)
    # each PE's dispatches' logical bytes in dispatch order (a period moves no bytes)
    parts = ([(table.base[lo:hi], times) for lo, hi, times in table.pieces()] if isinstance(table, RepeatedTable)
             else [(table.array(), 1)])
    nb = FIELDS.index("bytes")
    dispatches = [(r[is_cpu[r[:, 0]]], times) for r, times in parts]  # taken once, then split by PE
    cpu = [(pe_of[d[:, 0]], d[:, nb], times) for d, times in dispatches]
    for pe in e.pes.built():
        mine = np.concatenate([np.tile(b[p == pe.index], times) for p, b, times in cpu])
        pe.cpu.restore(tot[("cpu", pe.index, "n_commands")], tot[("cpu", pe.index, "busy_ps")], mine)
    for key, ln in e.fabric.links.items():
        ln.restore_counters(**{f: tot[("link", key, f)] for f in ln.COUNTERS})
    for f in ("commands", "stages", "accesses"):
        if ("sanitizer", f) in tot:
            sim.sanitizer[f] = tot[("sanitizer", f)]


def _check(engine, table) -> dict:
    """The sanitizer's check of a short copy's records."""
    return sanitizer.check(engine, table)


class _Copies:
    """Short copies of the bench by their number of steps, each simulated once (the
    candidate periods share them); the hardware's units are instantiated once. Their
    op_logs are kept in memory: nothing is written before the run directory is opened.
    With the sanitizer on, a copy is checked when its verdict is taken (:meth:`take`):
    the checks of copies a run never relies on (it is simulated in full) are not made."""

    def __init__(self, cfg, wl, kernel, recipes, check, units):
        self.cfg, self.wl, self.kernel, self.recipes, self.check = cfg, wl, kernel, recipes, check
        self.units = units
        self.bench = wl.cfg.copy()  # one copy, its key set per short copy (they run one by one)
        self.done: dict = {}
        self.checks: dict = {}  # steps -> (engine, op_log) of a copy not yet checked

    def get(self, n: int) -> tuple:
        """The copy with ``n`` steps: ``(simulation, records, streams)`` (:func:`records_of`,
        :func:`streams_of`)."""
        if n not in self.done:
            w = self.wl.with_axis(n, self.bench)
            # only compared here: nothing written, the records stay in the table
            sim = simulate(self.cfg, w, self.kernel, self.recipes, None, None, self.check, False,
                           copy.deepcopy(self.units), check_later=self.check)
            if self.check:  # checked when taken
                self.checks[n] = (sim.engine, sim.oplog.table)
            recs = records_of(sim.oplog.table)
            self.done[n] = (sim, recs, streams_of(recs))
        return self.done[n]

    def cost(self, n_a: int, p: int) -> int:
        """Steps the copies for ``(n_a, p)`` would add to those simulated so far (at most:
        :func:`precheck` may rule the candidate out after two)."""
        return sum(n for n in {n_a + i * p for i in range(4)} if n not in self.done)

    def close(self) -> None:
        self.checks.clear()

    def take(self, steps) -> None:
        """Take the sanitizer's verdicts on the copies with these steps, in this order (those
        not checked or already taken are passed over): a rule one broke raises its
        SanitizerError."""
        for n in steps:
            if n in self.checks:
                self.done[n][0].sanitizer = _check(*self.checks.pop(n))

    def settle(self) -> None:
        """:meth:`take` every verdict not yet taken (those of candidates ruled out), in
        order of their steps."""
        self.take(sorted(self.checks))

    @property
    def steps(self) -> int:
        return sum(self.done)

    def runs(self, n_a: int, p: int) -> Runs:
        """The four copies of candidate ``(n_a, p)`` compared and verified. A rule one of
        the first three broke (SanitizerError) comes first, and one the fourth broke comes
        before NotPeriodic; else the fourth copy's verdict is left to the caller
        (:meth:`take`, then ``Runs.verify_counts``), which makes the full run's records
        while it is checked."""
        precheck(self.get(n_a), self.get(n_a + p))
        got = [self.get(n_a + i * p) for i in range(4)]
        self.take(n_a + i * p for i in range(3))
        try:
            runs = Runs(*([g[i] for g in got] for i in range(3)))
            runs.verify()
        except NotPeriodic:
            self.take([n_a + 3 * p])
            raise
        return runs


def run(cfg, wl, kernel, recipes, check: bool, units: dict | None = None, show: bool = False) -> Outcome:
    """Fast-forward the bench: in one simulation (:func:`_in_one`), else from short copies.
    ``Outcome.sim`` is None (simulate it in full, ``note`` says why) when the workload has
    no periodic axis, too few periods or none that verifies, when a short copy fails (the
    full run's pre-flight checks and simulation then report the error as they would) or when
    the extrapolated run ends beyond the time base; ``Outcome.whole`` when the one
    simulation left nothing out, and so is the full run. ``show``: the progress bar of that
    simulation.

    Writes nothing: :meth:`Outcome.write_oplog` writes the op_log. ``units``: one PE's
    unbound units (kbframe.sim.engine.build_units), copied for each short copy. The short copies start
    at :data:`MIN_STEPS` steps and grow :data:`GROWTH`-fold while a stream is still settling
    (:class:`Settling`), as long as they stay short of half the run.
    """
    t_start = time.perf_counter()
    axis = wl.periodic_axis()
    if axis is None:
        return Outcome(None, "simulated in full: the workload names no periodic axis")
    key, step = axis
    q = int(cfg.bench[key]) // step
    units = units if units is not None else build_units(cfg.hardware)
    one = _in_one(cfg, wl, kernel, recipes, check, units, key, q, t_start, show)
    if one.sim is not None:
        return one
    copies = _Copies(cfg, wl, kernel, recipes, check, units)
    try:
        out = _run(copies, q, key, t_start, wl.ff_min_steps or MIN_STEPS, wl.ff_budget)
    finally:
        copies.close()
    if out.sim is None and one.note:
        out.note += f" (in one simulation: {one.note})"
    return out


def _in_one(cfg, wl, kernel, recipes, check: bool, units: dict, key: str, q: int, t_start: float,
            show: bool = False) -> Outcome:
    """Fast-forward in one simulation (kbframe.run.skipped); ``Outcome.sim`` None when the
    run is too short to leave anything out (``note`` empty) or the simulated run does not
    show that what it left out was steady (``note`` says why), even simulated once more
    with its loops judged from :data:`GROWTH` times as many steps on (a warm-up that looked
    steady for a while: a short PE_SCHEDULER queue, many tiles prefetched). With nested axes
    (``Workload.nested_axes``, and ``Workload.ff_weight_tiles``: its weight GEMMs' output
    tiles) their loops jump too, and a run that cannot be made so is simulated again with
    the kernel's nested loops alone, then with the periodic axis's loops jumping alone. A
    simulation that left nothing out is the full run (``Outcome.whole``)."""
    first = wl.ff_min_steps or MIN_STEPS
    loops = tuple(wl.nested_axes())
    nested = loops + ((WEIGHT_TILES.key,) if wl.ff_weight_tiles else ())
    # nested loops jump too; a run that cannot be made so is simulated once more with the
    # kernel's nested loops alone (not its weight GEMMs'), then with its outer loops
    # jumping alone, then (or without nested loops, at once) jumping later
    tries = ([(nested, first)] if nested else []) + ([(loops, first)] if loops and loops != nested else []) \
        + [((), first), ((), first * GROWTH)]
    why = ""
    refused = None  # of the try refused last: what _refused_alike compares
    for n_try, (inner, min_steps) in enumerate(tries):
        if refused is not None and _refused_alike(refused, inner, min_steps):
            continue
        axes = [Axis(key, tuple(wl.ff_periods or PERIODS), min_steps, wl.ff_after),
                *(WEIGHT_TILES if k == WEIGHT_TILES.key else Axis(k, PERIODS, MIN_STEPS) for k in inner)]
        steady = Steady(axes, skipped.snapshot, preflight.record_budget(cfg), f"{cfg.bench.name} at {wl.shape_text()}",
                        jump_checks.probe, jump_checks.repeats)
        if not inner and axes[0].too_short(q):
            return Outcome(None, why)
        try:
            sim = simulate(cfg, wl, kernel, recipes, None, None, check, show, copy.deepcopy(units),
                           check_later=check, steady=steady)
            if not steady.jumps:  # nothing left out: this is the full simulation
                none = f"no loop along {' or '.join(a.key for a in axes)} looked steady with a stretch to leave out"
                if steady.unrepeated:  # one did, but its records did not repeat (kbframe.run.jump_checks.repeats)
                    none = f"no loop along {' or '.join(a.key for a in axes)} jumped ({steady.unrepeated})"
                preflight.check_simulated_records(cfg, wl, len(sim.oplog.table), none)
                return Outcome(sim, f"simulated in full: {none}" + (f" (before: {why})" if why else ""), whole=True)
            made = skipped.make(sim, steady, totals(sim), repeated=bool(nested))
            break
        except jump_checks.NotSteady as e:  # a nested loop's jump, or one that looked steady too early: once more
            late = min((i.J for i in steady.instances if i.level == 0 and i.J is not None), default=None)
            refused = (inner, min_steps, late, dict(steady.first_jump), e.upto)  # not the simulation: it is freed
            how = (f"from {min_steps} steps on" if min_steps != first else
                   f"along {key} alone" if not inner else f"along {' and '.join([key, *inner])}")
            why = f"{why}; {how}, {e}" if why else f"{how}, {e}"
        except RecordBudgetError:
            raise
        except KbframeError as e:
            return Outcome(None, f"the run failed ({e})")
    else:
        return Outcome(None, why)
    preflight.check_forwarded_records(cfg, wl, int(made.tot["n_records"]),
                                      len(made.table.base) if isinstance(made.table, RepeatedTable) else None)
    if made.latency_ps >= MAX_PS or any(isinstance(n, tuple) and n[-1] == "busy_ps" and v >= MAX_PS
                                         for n, v in made.tot.items()):
        return Outcome(None, "the run ends beyond the time base")
    if check:  # the simulated records checked; the counts of what was put back added
        try:
            sim.sanitizer = _check(sim.engine, sim.oplog.table)
        except KbframeError as e:  # the full simulation reports it as it would
            return Outcome(None, f"the run failed ({e})")
        for f, v in skipped.sanitized(sim.engine, made).items():
            made.tot[("sanitizer", f)] = sim.sanitizer[f] + v
        sanitizer.release(sim.engine)
    _apply(sim, made.tot, made.table)
    sim.phases = made.phases
    sim.engine.wall_s = time.perf_counter() - t_start
    note = made.note + (f" (simulated once more: {why})" if why else "")  # a try refused cost a simulation
    return Outcome(sim, note, made.period, simulated=made.simulated)


def _refused_alike(refused: tuple, inner: tuple, min_steps: int) -> bool:
    """Whether a try of :func:`_in_one` along the nested axes ``inner``, its outer loops
    jumping from ``min_steps`` on, would be refused as an earlier try was (``refused``: its
    nested axes and steps, the iteration its outer loops first jumped at, per axis the
    records made when a loop of it first jumped (``Steady.first_jump``) and the records its
    refusal read, ``NotSteady.upto``): it makes the same records and decisions as far as
    the refusal read them, for the axes it drops had no loop that had jumped by then, and
    its outer loops, jumping later, had jumped later still."""
    axes, steps, late, first_jump, upto = refused
    if set(inner) - set(axes) or min_steps < steps:
        return False
    if min_steps > steps and (late is None or late < min_steps):
        return False
    return all(k not in first_jump or (upto is not None and upto <= first_jump[k]) for k in set(axes) - set(inner))


def _phases(runs: Runs, n_a: int, p: int, k_full: int) -> dict | None:
    """The full run's ``tl.phase`` annotations (kbframe.run.phases) from the copies', when
    the axis is the layers their phases are tagged with: per PE, the first copy's phases
    up to its last layer, its last period's ``p`` layers repeated for each skipped period
    (command ids shifted by a period's commands, layers relabelled), then what follows them,
    shifted by them all. None when the second copy is not what this predicts from the first
    (the phases are left out)."""
    a, b = runs.sims[0], runs.sims[1]
    if not a.phases:
        return {}

    def shifted(entry, by: int, layers: int = 0):
        nm, f, l_, inf = entry
        inf = dict(inf)
        if layers and inf.get("layer") is not None:
            inf["layer"] += layers
        if inf.get("after") is not None:  # a collective's partial: a command id too
            inf["after"] += by
        return nm, f + by, l_ + by, inf

    def predict(ph: list, extra: int, per: int) -> list:
        at = [i for i, e in enumerate(ph) if e[3].get("layer") is not None and n_a - p <= e[3]["layer"] < n_a]
        if not at:
            return ph
        i0, i1 = at[0], at[-1]
        out = ph[:i1 + 1]
        for k in range(1, extra + 1):
            out += [shifted(e, k * per, k * p) for e in ph[i0:i1 + 1]]
        return out + [shifted(e, extra * per) for e in ph[i1 + 1:]]

    full = {}
    for pe, ph in a.phases.items():
        per = b.engine.pes[pe].cpu.n_commands - a.engine.pes[pe].cpu.n_commands
        if predict(ph, 1, per) != b.phases.get(pe):
            return None
        full[pe] = predict(ph, k_full, per)
    return full


def _run(copies: _Copies, q: int, key: str, t_start: float, min_steps: int = MIN_STEPS,
         budget_share: float | None = None) -> Outcome:
    """:func:`run` with its short copies, for a run of ``q`` whole steps of ``key``; the
    copies start at ``min_steps`` and may cost ``budget_share`` of the run (None: the
    defaults)."""
    why = None
    n_min = min_steps
    while True:
        settling = False
        for p in PERIODS:
            n_a = n_min + (q - n_min) % p
            k_full = (q - n_a) // p
            if k_full < MIN_COPIES or (n_a + 3 * p) * 2 > q:
                break
            budget = budget_share or (SETTLING_BUDGET if n_min > min_steps else BUDGET)
            if copies.steps + copies.cost(n_a, p) > budget * q:
                if settling:  # the longer periods tried for want of longer copies: the copies' verdict
                    break
                return Outcome(None, f"simulated in full: {why + '; more' if why else 'its'} short copies would "
                                     f"cost over {budget:.0%} of the run")
            try:
                runs = copies.runs(n_a, p)
            except Settling as e:
                if not settling:
                    why, settling = f"not periodic ({e})", True
                if _can_grow(copies, q, n_min * GROWTH, budget_share):
                    break
                continue  # a schedule periodic over more steps moves by other times over fewer
            except NotPeriodic as e:
                if not settling:
                    why = f"not periodic ({e})"
                continue
            except KbframeError as e:
                return Outcome(None, f"simulated in full: a short copy failed ({e})")
            # the full run's records are made, then the last copy's verdict is taken, before
            # any other reason not to fast-forward
            tot = runs.total(k_full)
            preflight.check_forwarded_records(copies.cfg, copies.wl, int(tot["n_records"]))  # before any is made
            late = [n for n in tot if n == "latency_ps" or (isinstance(n, tuple) and n[-1] == "busy_ps")]
            beyond, not_periodic = any(tot[n] >= MAX_PS for n in late), None
            if not beyond:
                try:
                    table = runs.table(k_full)
                except NotPeriodic as e:
                    not_periodic = e
            try:  # every copy checked: this candidate's, then those of the candidates ruled out
                copies.take([n_a + 3 * p])
                try:
                    runs.verify_counts()
                except NotPeriodic as e:
                    why = f"not periodic ({e})"
                    continue
                if beyond:
                    return Outcome(None, "simulated in full: the run ends beyond the time base")
                if not_periodic is not None:
                    return Outcome(None, f"simulated in full: not periodic ({not_periodic})")
                copies.settle()
            except KbframeError as e:
                return Outcome(None, f"simulated in full: a short copy failed ({e})")
            sim = runs.sims[3]
            if copies.check:  # every verdict taken: the stage records are not needed again
                sanitizer.release(sim.engine)
            _apply(sim, tot, table)
            sim.phases = _phases(runs, n_a, p, k_full)
            sim.engine.wall_s = time.perf_counter() - t_start
            return Outcome(sim, f"fast-forwarded {k_full - 3} of {k_full} periods of {p} step(s) along {key} "
                                f"({len(table) - len(runs.recs[3])} of {len(table)} records by shifting)",
                           len(runs.blk))
        if not settling:
            return Outcome(None, f"simulated in full: {why or 'too few periods to skip'}")
        n_min *= GROWTH


def _can_grow(copies: _Copies, q: int, n_min: int, budget_share: float | None) -> bool:
    """Whether copies from ``n_min`` steps (a period of one step) are possible and within
    the budget of a run whose shorter copies saw a stream settling. When they are not,
    :func:`_run` tries the longer candidate periods on copies of the present length first:
    a schedule that repeats every few steps moves its streams by other times than the run
    over one step, as a settling one does (Llama-3's fused layers on 8 PEs repeat every 4,
    each fourth 2 ns later than the other three)."""
    k_full = q - n_min
    budget = budget_share or SETTLING_BUDGET
    return k_full >= MIN_COPIES and (n_min + 3) * 2 <= q and copies.steps + copies.cost(n_min, 1) <= budget * q


def verify(cfg, wl, kernel, recipes, check: bool, ff: Simulation) -> Simulation:
    """``run.fast_forward=verify``: simulate the bench in full as well (its records kept in
    its table, nothing written) and compare; the full simulation (its metrics are compared
    too, :func:`verify_metrics`). Raises SanitizerError (rule ``fast_forward``) naming the
    first difference: the first line of the op_log texts of the two tables that differs, or
    the total, the wait record, the phases or the dispatch cycles that differ."""
    from ..errors import SanitizerError
    full = simulate(cfg, wl, kernel, recipes, None, None, check, False)
    for i, (la, lb) in enumerate(zip(full.oplog.table.text().splitlines(), ff.oplog.table.text().splitlines())):
        if la != lb:
            raise SanitizerError(f"fast-forward: op_log line {i + 1} differs from the full simulation's: "
                                 f"{lb} instead of {la}", "fast_forward")
    if full.oplog.n_records != ff.oplog.n_records:
        raise SanitizerError(f"fast-forward: {ff.oplog.n_records} records, the full simulation has "
                             f"{full.oplog.n_records}", "fast_forward")
    tf, tg = totals(full), totals(ff)
    bad = [n for n in tf if tf[n] != tg.get(n)]
    if bad:
        raise SanitizerError(f"fast-forward: total {bad[0]} is {tg.get(bad[0])}, the full simulation's "
                             f"{tf[bad[0]]}", "fast_forward")
    if full.oplog.table.buf != ff.oplog.table.buf:
        raise SanitizerError("fast-forward: the wait records differ from the full simulation's", "fast_forward")
    if (full.phases or {}) != (ff.phases or {}):
        raise SanitizerError("fast-forward: the phases (tl.phase) differ from the full simulation's", "fast_forward")
    for pe in full.engine.pes.built():
        if pe.cpu.cycles != ff.engine.pes[pe.index].cpu.cycles:
            raise SanitizerError(f"fast-forward: PE{pe.index} dispatch cycles {ff.engine.pes[pe.index].cpu.cycles!r}, "
                                 f"the full simulation's {pe.cpu.cycles!r}", "fast_forward")
    return full


def verify_metrics(got: dict, want: dict) -> None:
    """``run.fast_forward=verify``: the metrics of the fast-forwarded run (``got``: what its
    analyses made of the records it simulated and the periods it put back) against the full
    simulation's (``want``), value for value but the wall time. Raises SanitizerError (rule
    ``fast_forward``) naming the first key that differs."""
    from ..errors import SanitizerError
    a, b = _flat(got), _flat(want)
    for key in dict.fromkeys([*b, *a]):
        if key != "sim.wall_s" and a.get(key, "(none)") != b.get(key, "(none)"):
            raise SanitizerError(f"fast-forward: metrics.json {key} is {a.get(key, '(none)')!r}, the full "
                                 f"simulation's {b.get(key, '(none)')!r}", "fast_forward")


def _flat(d: dict, prefix: str = "") -> dict:
    """``{"a.b.c": value}`` of a nested dict (a list a value)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
