"""Fast-forward in one simulation: the run is simulated once with a :class:`~kbframe.sim.steady.Steady`
on its engine, whose loops along the periodic axis leave out a steady stretch of ``R``
iterations (kbframe.sim.steady), and the full run is made from it here by putting the
stretch back, once kbframe.run.jump_checks has found every jump can be. Tried before the
short copies of :mod:`kbframe.run.fastforward`, which remain what a run that this cannot
make falls back on.

The full run's records are those before the jump, ``R / p`` periods made by moving the
period before it (kbframe.run.moves), then the rest moved by all of them (numpy, a column
at a time); its totals grow by ``R / p`` times a period's, its ``tl.phase`` annotations the
same way.

Loops along an axis nested in the periodic axis's steps (a decoder layer's KV tiles,
``Workload.nested_axes``) are put back first, all their jumps in one pass; the jumps of the
loops they are nested in are then checked in, and put back into, the records so made,
their command ids and record counts where the nested jumps moved them, a period's growth
including what the nested jumps inside it put back.
"""
from __future__ import annotations

import bisect

import numpy as np

from ..hw.tiling import left_out, plan_key, plan_units_key, whole
from ..record_fields import N, ROW
from ..records import RecordTable
from ..repeated import RepeatedTable
from ..sim import access_templates, sanitizer
from ..sim.steady import Steady
from .jump_checks import NotSteady, PerPe, check_jump
from .moves import ADMITTED, CMD, CMD_REFS, RECORD_REFS, REF, T0, TD, TILE, T1, WHY
from .periodic import running_totals


class Made:
    """The full run made from a run that skipped: its record table, totals (by name, as
    kbframe.run.periodic.totals names them), latency (ps), ``tl.phase`` annotations, the
    summary's note, the records of the shortest period of the outermost loops that jumped,
    and its jumps (:class:`~kbframe.run.jump_checks.PutBack`); with a :class:`~kbframe.repeated.RepeatedTable`,
    ``simulated``: the simulated run's phases, and per PE the first command of the period
    put back and its commands (kbframe.run.phases.Repeated)."""

    def __init__(self, table, tot, latency_ps, phases, note, period, jumps, simulated=None):
        self.table, self.tot, self.latency_ps, self.phases = table, tot, latency_ps, phases
        self.note, self.period, self.jumps, self.simulated = note, period, jumps, simulated


def _shifts(rows: np.ndarray, pe_of: np.ndarray, found: list, before: np.ndarray, table: np.ndarray) -> np.ndarray:
    """How far the jumps ``found`` (in record order) move each record of ``rows`` (records
    of ``table``, the simulated one, or copies of them) when ``before[i]`` of them come
    before it: the sum of each such jump's moves (kbframe.run.moves' rules; a command, a
    command ``ref`` or the record a ``ref`` names is the loop's or later from one loop's
    first command on, and the loops' first commands on a PE come in record order), from
    prefix sums per PE rather than one jump at a time."""
    d = np.zeros_like(rows)
    dt = np.concatenate(([0], np.cumsum([f.X * f.dt for f in found])))
    d[:, T0] = d[:, T1] = dt[before]
    d[:, TD] = np.where(rows[:, TD] >= 0, dt[before], 0)
    pe = pe_of[rows[:, 0]]
    why, ref = rows[:, WHY], rows[:, REF]
    by_cmd = np.isin(why, CMD_REFS)
    by_rec = np.nonzero(np.isin(why, RECORD_REFS) & (ref >= 0))[0]
    t_pe = pe_of[table[ref[by_rec], 0]]
    t_cmd = table[ref[by_rec], CMD]
    for q in np.unique(np.concatenate([pe, t_pe])).tolist():
        mine = [j for j, f in enumerate(found) if q in f.mover.first_of and not f.inst.tiles]
        if not mine:
            continue
        idx = np.array(mine, dtype=np.int64)
        first = np.array([found[j].mover.first_of[q] for j in mine], dtype=np.int64)
        w_cmd = np.concatenate(([0], np.cumsum([found[j].X * found[j].per_period[q] for j in mine])))
        w_rec = np.concatenate(([0], np.cumsum([found[j].X * found[j].P for j in mine])))

        def upto(at, c):  # the jumps of this PE before the record whose loops' first command is c or earlier
            return np.minimum(np.searchsorted(idx, before[at], side="left"), np.searchsorted(first, c, side="right"))
        at = np.nonzero(pe == q)[0]
        d[at, CMD] = w_cmd[upto(at, rows[at, CMD])]
        c = at[by_cmd[at]]
        d[c, REF] = w_cmd[upto(c, ref[c])]
        t = np.nonzero(t_pe == q)[0]
        d[by_rec[t], REF] += w_rec[upto(by_rec[t], t_cmd[t])]
    if any(f.inst.tiles for f in found):
        _tile_shifts(d, rows, pe_of, found, before, table, pe, by_rec, t_pe, t_cmd)
    return d


def _tile_shifts(d, rows, pe_of, found, before, table, pe, by_rec, t_pe, t_cmd) -> None:
    """:func:`_shifts`' part for the jumps of weight GEMMs' tile loops
    (:class:`~kbframe.run.moves.TileMover`'s rules over all of them): a record of such a
    GEMM's command after its jump moves its tile by the tiles put back; a command's record
    after a jump keeps its start (its admission) when that came before the jump; a record
    ``ref`` moves by the records a jump put back when the jump comes before the record that
    names it and after the one named, or that one is of the jump's GEMM's tiles (a period
    of them repeats)."""
    at = np.array([j for j, f in enumerate(found) if f.inst.tiles], dtype=np.int64)
    tiles = [found[j] for j in at]
    xs = np.array([f.x for f in tiles], dtype=np.int64)
    w_rec = np.concatenate(([0], np.cumsum([f.X * f.P for f in tiles])))
    keys, jump = [], []  # (pe, the GEMM's command) of each jump, and the jump (its place among the tile jumps)
    for j, f in enumerate(tiles):
        for q, c in f.mover.first_of.items():
            keys.append((q << 40) | c)  # command ids are below 2^40
            jump.append(j)
    order = np.argsort(keys)
    keys, jump = np.array(keys, dtype=np.int64)[order], np.array(jump, dtype=np.int64)[order]

    def jump_of(q, c):  # the tile jump of each (pe, command), -1: none
        k = (q << 40) | c
        i = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        return np.where(keys[i] == k, jump[i], -1)
    gone = np.searchsorted(at, before, side="left")  # tile jumps before each record
    # a command admitted before a jump (the GEMM's own, one behind it) keeps its start
    adm = np.nonzero(np.isin(rows[:, WHY], ADMITTED) & (gone > 0))[0]
    for j, f in enumerate(tiles):
        held = adm[(gone[adm] > j) & (rows[adm, T0] < table[f.x, T0])]
        d[held, T0] -= f.X * f.dt
    j = jump_of(pe, rows[:, CMD])
    moves = (j >= 0) & (j < gone) & (rows[:, TILE] >= 0)
    d[moves, TILE] += np.array([f.X * f.mover.tiles for f in tiles], dtype=np.int64)[j[moves]]
    if len(by_rec):
        s = rows[by_rec, REF]
        past = np.minimum(np.searchsorted(xs, s, side="right"), gone[by_rec])  # jumps between: those before s
        add = w_rec[past]
        js = jump_of(t_pe, t_cmd)
        js[table[s, TILE] < 0] = -1  # a GEMM's prologue does not repeat
        own = (js >= 0) & (js == past) & (js < gone[by_rec])  # the next jump after it is its GEMM's tiles'
        add[own] += np.array([f.X * f.P for f in tiles], dtype=np.int64)[js[own]]
        d[by_rec, REF] += add


def _in_order(found: list) -> bool:
    """Whether the jumps ``found`` (in record order) can be put back in one pass
    (:func:`_shifts`): distinct places, and on each PE the loops' first commands in that
    order."""
    xs = [f.x for f in found]
    if any(a >= b for a, b in zip(xs, xs[1:])):
        return False
    seen: dict = {}
    for f in found:
        for q, c in f.mover.first_of.items():
            if c < seen.get(q, -1):
                return False
            seen[q] = c
    return True


def _put_back_all(rows: np.ndarray, pe_of: np.ndarray, found: list, out: np.ndarray | None = None) -> np.ndarray:
    """``rows`` with the periods of every jump ``found`` (in record order, :func:`_in_order`)
    put back, in one pass: each jump's periods made by moving the period before it (and by
    the jumps before it), the records between moved by every jump before them; into
    ``out`` if given."""
    xs = np.array([f.x for f in found], dtype=np.int64)
    n = len(rows) + sum(f.X * f.P for f in found)
    out = np.empty((n, N), dtype=np.int64) if out is None else out
    before = np.searchsorted(xs, np.arange(len(rows)), side="right")
    at = 0
    for j, f in enumerate([None, *found]):
        if f is not None:  # its periods: the period before it moved 1..X periods, and by the jumps before it
            tmpl = rows[f.x - f.P:f.x]
            f.mover.of(rows)
            f.mover.periods(tmpl, f.X, _shifts(tmpl, pe_of, found, np.full(f.P, j - 1), rows),
                            out[at:at + f.X * f.P])
            at += f.X * f.P
        lo = 0 if f is None else f.x
        hi = found[j].x if j < len(found) else len(rows)
        seg = rows[lo:hi]
        out[at:at + len(seg)] = seg + _shifts(seg, pe_of, found, before[lo:hi], rows)
        at += len(seg)
    return out


def make(sim, steady: Steady, tot: dict, repeated: bool = False) -> Made:
    """Put back what ``sim`` (simulated with ``steady``) left out (module doc), each jump
    checked (kbframe.run.jump_checks): the jumps of nested loops first, then those of the
    loops they are nested in; ``tot``: its totals (kbframe.run.periodic.totals).
    ``repeated``: the outermost loop's one jump is not put back record by record but held
    as a :class:`~kbframe.repeated.RepeatedTable` (a model step's layers: the analyses work
    from the period). Raises NotSteady."""
    if steady.broken:
        raise NotSteady(steady.broken)
    jumps = steady.jumps
    if not jumps:
        raise NotSteady("no loop reached a steady state it could leave out")
    table = sim.oplog.table
    rows = table.array()
    pe_of = np.array(table.name_col(0), dtype=np.int64)
    tot = dict(tot)
    latency = sim.latency_ps
    phases = {pe: list(ph) for pe, ph in (sim.phases or {}).items()}
    made = RecordTable.of_rows(table.names, rows[:0])
    simulated = None  # with a RepeatedTable: its phases, and per PE the period's first command and commands
    placed: list = []  # every jump put back so far
    levels = sorted({inst.level for _, inst in jumps}, reverse=True)
    for level in levels:
        per_pe = PerPe(rows, pe_of)
        found = [check_jump(rows, pe_of, f"{k} of {inst.key}", inst,
                           (inst.p,) if inst.tiles else steady.axes[inst.key][1].periods, placed, per_pe)
                 for k, inst in jumps if inst.level == level]
        found.sort(key=lambda f: f.x)
        n = len(rows) + sum(f.X * f.P for f in found)
        final = level == levels[-1]
        if final and repeated and len(found) == 1 and not found[0].inst.tiles:  # held: the records, the period
            f = found[0]
            f.mover.of(rows)
            made = RepeatedTable(rows, table.names, f.x, f.P, f.X, f.mover.step(rows[f.x - f.P:f.x]),
                                 f.mover.step(rows[f.x:]))
            J = f.inst.J - f.p
            simulated = ({pe: list(ph) for pe, ph in phases.items()},
                         {pe: ids[J] for pe, ids in f.inst.ids.items()}, dict(f.per_period))
        else:
            out = None
            if final:  # straight into the table's buffer: the full run's records held once
                made.buf = bytearray(n * ROW.size)
                out = np.frombuffer(made.buf, dtype=np.int64).reshape(n, N)
            if _in_order(found):
                rows = _put_back_all(rows, pe_of, found, out)
            else:  # one at a time, the last first: the records before it stay where they are
                if any(f.inst.tiles for f in found):
                    raise NotSteady("the jumps of weight GEMMs' tiles and of loops interleave")
                for f in reversed(found):
                    f.mover.of(rows)
                    rows = np.concatenate([rows[:f.x], f.mover.periods(rows[f.x - f.P:f.x], f.X),
                                           f.mover.move(rows[f.x:], f.X)])
                if out is not None:
                    out[:] = rows
                    rows = out
        for f in reversed(found):
            latency += f.X * f.dt
            for name, v in f.delta.items():
                tot[name] += f.X * v
            for pe in f.inst.jumped:
                if pe in phases:
                    phases[pe] = _phases(phases[pe], f.inst, pe, f.p, f.X)
        placed += found
    tot["latency_ps"] = latency
    keys = list(dict.fromkeys(inst.key for _, inst in jumps))
    periods = {key: "/".join(str(p) for p in sorted({f.p for f in placed if f.inst.key == key})) for key in keys}
    what = " and ".join(f"{sum(f.X for f in placed if f.inst.key == key)} period(s) of {periods[key]} step(s) "
                        f"along {key}" for key in keys)
    note = (f"fast-forwarded in one simulation: {what} left out of {len(placed)} loop(s) "
            f"({len(made) - len(table)} of {len(made)} records by shifting)")
    for f in placed:
        f.mover.of(None)  # no view of the table's buffer kept: it must stay free to grow
    del rows
    outer = [f for f in placed if f.inst.level == levels[-1]]
    return Made(made, tot, latency, phases, note, min(f.P for f in outer), placed, simulated)


def _phases(ph: list, inst, pe: int, p: int, X: int) -> list:
    """A PE's ``tl.phase`` annotations with the ``X`` periods of ``p`` iterations put back:
    those of the period before the jump repeated (ids moved, a layer label by ``p`` a
    period), the later ones moved by all of them."""
    J = inst.J
    lo, hi = inst.ids[pe][J - p], inst.ids[pe][J]
    per = hi - lo

    def moved(entry, j: int, since: int, layers: int = 0):
        nm, f, l_, info = entry
        info = dict(info)
        if layers and info.get("layer") is not None:
            info["layer"] += layers
        if info.get("after") is not None and info["after"] >= since:  # a collective's partial: a command id
            info["after"] += j * per
        return nm, f + j * per, l_ + j * per, info

    inside = [e for e in ph if lo <= e[1] and e[2] < hi]
    out = [e for e in ph if e[1] < hi]
    out = [e if e[2] < hi else (e[0], e[1], e[2] + X * per, e[3]) for e in out]
    for j in range(1, X + 1):
        out += [moved(e, j, lo, j * p) for e in inside]
    return out + [moved(e, X, hi) for e in ph if e[1] >= hi]


def snapshot(engine, first: dict | None = None) -> tuple:
    """What kbframe.sim.steady keeps at an iteration's start (``Steady.snapshot``): the
    records so far, the totals, per PE the commands dispatched but not completed, and those
    completed. The totals are None while a PE of ``first`` (``{pe: a loop's first command
    id}``) has not completed that command: no period of the loop can be steady yet, and
    taking them costs a record's worth of work per name."""
    pes = engine.pes.built()
    done = {pe.index: (engine.oplog.unit_totals(pe.index, "scheduler") or (0,))[0] for pe in pes}
    flight = tuple(pe.cpu.n_commands - done[pe.index] for pe in pes)
    ready = first is None or all(done.get(pe, 0) >= c for pe, c in first.items())
    return len(engine.oplog.table), running_totals(engine, engine.oplog) if ready else None, flight, done


def sanitized(engine, made: Made) -> dict:
    """The sanitizer's counts (commands, stages, accesses) of the periods ``made`` put back:
    per jump, those of the commands of the period before it as simulated, and of what the
    jumps of nested loops in that period put back, times the periods (``engine``: the
    simulation's, its stage records kept)."""
    plans = dict((pe.index, plan) for pe, plan in sanitizer.plans(engine))  # each sorted by command id
    ids = {pe: [cmd.id for cmd, _ in plan] for pe, plan in plans.items()}
    templates = access_templates.Templates()  # each command shape re-planned once, for every PE
    memo: dict = {}

    def period(jump) -> np.ndarray:
        if id(jump) not in memo and jump.inst.tiles:
            memo[id(jump)] = _tile_period(engine, jump, plans, ids, templates, memo)
        if id(jump) not in memo:
            inst, got = jump.simulated, np.zeros(3, dtype=np.int64)
            for pe in jump.per_period:
                lo, hi = inst.ids[pe][inst.J - jump.p], inst.ids[pe][inst.J]
                at = ids.get(pe, [])
                sub = plans.get(pe, [])[bisect.bisect_left(at, lo):bisect.bisect_left(at, hi)]
                got += (len(sub), sum(len(st) for _, st in sub),
                        sanitizer.count_data_dependencies(engine.pes[pe], sub, templates))
            memo[id(jump)] = got + sum((j.X * period(j) for j in jump.inner), np.zeros(3, dtype=np.int64))
        return memo[id(jump)]
    total = sum((j.X * period(j) for j in made.jumps), np.zeros(3, dtype=np.int64))
    return dict(zip(("commands", "stages", "accesses"), (int(v) for v in total)))


def _tile_period(engine, jump, plans: dict, ids: dict, templates, memo: dict) -> np.ndarray:
    """The sanitizer's counts of a period of a weight GEMM's tiles put back: no command;
    its stages, as simulated; its accesses, those of the GEMM planned whole less those of
    it as planned, per period (each shape's once, in ``memo``)."""
    got = np.zeros(3, dtype=np.int64)
    inst = jump.inst
    lo, hi = (inst.J - jump.p) * inst.tiles, inst.J * inst.tiles
    for q, c in inst.first.items():
        cmd, stages = plans[q][bisect.bisect_left(ids[q], c)]
        got[1] += sum(1 for st in stages if lo <= st.tile < hi)
        key = ("tiles", plan_units_key(engine.pes[q].by_role), plan_key(cmd))
        if key not in memo:
            pe, full = engine.pes[q], whole(cmd)
            n_full = sanitizer.count_data_dependencies(pe, [(full, pe.scheduler.plan(full))], templates)
            n_part = sanitizer.count_data_dependencies(pe, [(cmd, stages)], templates)
            memo[key] = divmod(n_full - n_part, left_out(cmd)[1] // jump.p)
        n, rest = memo[key]
        assert rest == 0, "a weight GEMM's left-out output tiles are alike: their accesses divide by its periods"
        got[2] += n
    return got
