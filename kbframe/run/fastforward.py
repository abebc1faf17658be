"""Fast-forward (issue 16, ``run.fast_forward``): a timing-only run whose schedule becomes
periodic is not simulated period by period. Its records are the shifted copies of one
period, and they are written as such.

How, exactly:

1. The workload names the axis its work repeats along
   (:meth:`~kbframe.workloads.base.Workload.periodic_axis`): decode's context length in steps of one
   KV tile. Taking ``k`` steps off the axis takes ``k`` periods of work out of the middle of
   the run and keeps the warm-up, the ragged last tile and the epilogue.
2. Four short copies of the bench are simulated in full, with ``n``, ``n + p``, ``n + 2p``
   and ``n + 3p`` steps (``p`` a candidate period, in steps: 1, 2, 3, 4, 6, 8). Each stream
   of records (one unit of one PE: its dispatches, its stages, its commands) is compared
   between the first two: the records they share from the start (the prefix), the
   records the second has in excess (one period's block) and the records that follow,
   the same in both but shifted (the tail). Every integer of a record (command id, tile,
   times, what it waited for) moves by its own amount per period, read off the copies;
   the streams then interleave by completion time, ties in the order the copies show.
3. A steady state moves every stream by the same time per period. A stream that moves
   by less (PE_CPU still filling PE_SCHEDULER's queue, dispatching ahead of the units) is
   settling: the copies are tried again :data:`GROWTH` times as long. The third and fourth copies
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

Only timing-only runs (``bench.data=false``) fast-forward: in data mode every tile's numbers
are computed. With ``run.check`` the sanitizer checks the four short copies, and its counts
are extrapolated like the rest.
"""
from __future__ import annotations

import copy
import io
import json
import time
from array import array
from dataclasses import dataclass

import numpy as np
from omegaconf import open_dict

from ..errors import KbframeError
from ..sim.engine import build_units
from ..sim.oplog import RowSink, _row, format_rows
from ..sim.sanitizer import read_oplog
from ..sim.waits import _FIELDS
from ..timebase import MAX_PS
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
#: the short copies may simulate at most this share of the run's steps (else it is cheaper
#: to simulate the run) ...
BUDGET = 0.1
#: ... or this share once a stream was seen settling: the schedule repeats and only its
#: warm-up is longer than the copies (decode_opt2's PE_CPU needs ~50 KV tiles: copies of
#: 14 % of a 2048-tile run; with the sanitizer on, the run then takes half the time)
SETTLING_BUDGET = 0.3


class NotPeriodic(Exception):
    """The short copies do not repeat as a periodic schedule would."""


class Settling(NotPeriodic):
    """A stream's records of one period move by another time than the whole run: that
    stream is still in a transient (PE_CPU filling PE_SCHEDULER's queue), so the copies are
    too short to show the steady state."""


@dataclass
class Outcome:
    """A fast-forwarded run: the simulation object standing for the full run (its engine,
    op_log totals and wait records extrapolated), its records (what :meth:`write_oplog`
    writes) and what was done. ``sim`` None: simulate in full."""

    sim: Simulation | None
    note: str
    records: tuple | None = None  # (table, codes, nums), as _Runs.records gives them

    def write_oplog(self, path) -> None:
        """The full run's ``op_log.jsonl`` text, written to ``path`` (its time counts in
        ``sim.wall_s``, as a simulation's streamed op_log does)."""
        t = time.perf_counter()
        _write_oplog(path, *self.records)
        self.sim.engine.wall_s += time.perf_counter() - t


def _fields(rows: list, heads: dict | None):
    """Each op_log record as ``(pe, unit, op_kind, bytes, peer, cmd, tile, t_start, t_end,
    t_data)``, times in integer ps (-1: none): from parsed records (dicts), or from a
    :class:`~kbframe.sim.oplog.RowSink`'s rows with ``heads`` (``OpLog.head_names``)."""
    for r in rows:
        if heads is not None and type(r) is tuple:
            head, cmd, tile, t0, t1, nbytes, td = r
            pe, unit, kind = heads[head]
            yield pe, unit, kind, nbytes, -1, cmd, tile, t0, t1, td
            continue
        if type(r) is str:  # a RowSink's text row (it names a peer)
            r = json.loads(r)
        yield (r["pe"], r["unit"], r["op_kind"], r["bytes"], r.get("peer", -1), r["cmd"], r["tile"],
               round(r["t_start_ns"] * 1000), round(r["t_end_ns"] * 1000),
               round(r["t_data_ns"] * 1000) if "t_data_ns" in r else -1)


def _records(rows: list, waits, heads: dict | None = None) -> list[tuple]:
    """``(names, nums)`` per op_log record (``rows`` as :func:`_fields` reads them): names
    are what must not change between periods (PE, unit, kind, bytes, peer, wait code and
    kind, and the stream of the record that readied a stage), nums the integers that
    shift: command, tile, times, the wait record's command and times, and its reference
    (for a stage: the index, within its stream, of the record that readied it;
    stream-local, so that other streams' records do not move it)."""
    if len(rows) != len(waits):
        raise NotPeriodic("op_log and wait records differ in number")
    if not rows:
        return []
    pe, unit, kind, nbytes, peer, cmd, tile, t0, t1, td = zip(*_fields(rows, heads))
    w = np.frombuffer(waits.data, dtype=np.int64).reshape(-1, _FIELDS)
    streams: dict = {}
    sid = np.array([streams.setdefault(k, len(streams)) for k in zip(pe, unit)], dtype=np.int64)
    order = np.argsort(sid, kind="stable")
    first = np.searchsorted(sid[order], sid[order])  # where each record's stream starts, in order
    local = np.empty(len(sid), dtype=np.int64)
    local[order] = np.arange(len(sid)) - first       # its place within its stream
    why, ref = w[:, 5], w[:, 6].copy()
    readied = np.nonzero((why == -1) & (ref >= 0))[0]  # stages readied by record ref
    ref_sid = np.full(len(sid), -1, dtype=np.int64)
    ref_sid[readied] = sid[ref[readied]]
    ref[readied] = local[ref[readied]]
    stream_of = list(streams)
    ref_stream = [stream_of[s] if s >= 0 else None for s in ref_sid.tolist()]
    names = zip(pe, unit, kind, nbytes, peer, w[:, 0].tolist(), why.tolist(), ref_stream)
    nums = zip(cmd, tile, t0, t1, td, w[:, 1].tolist(), w[:, 2].tolist(), w[:, 3].tolist(), w[:, 4].tolist(),
               ref.tolist())
    return list(zip(names, nums))


def _global_refs(table: list, codes: np.ndarray, nums: np.ndarray) -> np.ndarray:
    """Column 9 back from stream-local to record indices (what the wait records hold).
    Raises NotPeriodic if a reference leaves its stream (then the copies misled us)."""
    streams: dict = {}
    sid = np.array([streams.setdefault((n[0], n[1]), len(streams)) for n in table], dtype=np.int64)[codes]
    ref_sid = np.array([streams.get(n[7], -1) if n[7] is not None else -1 for n in table], dtype=np.int64)[codes]
    order = np.argsort(sid, kind="stable")  # each stream's records, in record order, stream after stream
    start = np.searchsorted(sid[order], np.arange(len(streams)))
    count = np.bincount(sid, minlength=len(streams))
    out = nums.copy()
    at = np.nonzero(ref_sid >= 0)[0]
    local = nums[at, 9]
    if (local < 0).any() or (local >= count[ref_sid[at]]).any():
        raise NotPeriodic("a stage's reference leaves its stream")
    out[at, 9] = order[start[ref_sid[at]] + local]
    return out


def _totals(sim: Simulation) -> dict:
    """Every integer a metric is made of, by name: they grow by the same amount each period,
    but peaks (TCM high water, a link's deepest queue), which stay."""
    e, o = sim.engine, sim.oplog
    t = {"latency_ps": sim.latency_ps, "n_records": o.n_records, "hbm_bytes": o.hbm_bytes}
    for key, tot in o._totals.items():
        for f in ("count", "bytes", "busy_ps", "flops"):
            t[("oplog", key, f)] = getattr(tot, f)
    for pe in e.pes.built():
        t[("cpu", pe.index, "n_commands")] = pe.cpu.n_commands
        t[("cpu", pe.index, "busy_ps")] = pe.cpu.busy_ps
        t[("tcm", pe.index)] = pe.tcm.high_water
    for key, ln in e.fabric.links.items():
        for f in ("sent", "received", "bytes", "busy_ps"):
            t[("link", key, f)] = getattr(ln, f)
        t[("link", key, "max_outstanding")] = ln.max_outstanding
    for f in ("commands", "stages", "accesses"):
        if f in sim.sanitizer:
            t[("sanitizer", f)] = sim.sanitizer[f]
    return t


def _is_constant(name) -> bool:
    return isinstance(name, tuple) and (name[0] == "tcm" or name[-1] == "max_outstanding")


def _arr(rs) -> np.ndarray:
    return np.array([r[1] for r in rs], dtype=np.int64).reshape(-1, 10)


def _streams(recs: list) -> dict:
    """``{(pe, unit): [(index, record), ...]}`` in record order."""
    out: dict = {}
    for i, r in enumerate(recs):
        out.setdefault((r[0][0], r[0][1]), []).append((i, r))
    return out


def _own(r) -> tuple:
    """A stream record's own fields: its names and command, tile and times (the wait
    record's index of what readied a stage counts all streams, so it may move earlier)."""
    return r[1][0], r[1][1][:5]


def _names(rs) -> list:
    return [r[1][0] for r in rs]


def _parting(a: list, b: list) -> int:
    """Where stream ``b`` (one more period) parts from ``a``: the first record whose own
    fields differ."""
    return next((i for i, (ra, rb) in enumerate(zip(a, b)) if _own(ra) != _own(rb)), len(a))


def _precheck(a: tuple, b: tuple) -> None:
    """What the first two copies alone rule out, before the next two are simulated: a
    stream that does not grow by a period, or whose records after the block are not the
    same as the shorter copy's (NotPeriodic); a stream whose block moved by another time
    than the run against the period before it (Settling). ``a``, ``b``: ``(simulation,
    records, streams)``, as :meth:`_Copies.get` gives them."""
    delta = b[0].latency_ps - a[0].latency_ps
    sa, sb = a[2], b[2]
    if set(sa) != set(sb):
        raise NotPeriodic("the copies do not have the same streams")
    for key in sorted(sa, key=str):
        ra, rb = sa[key], sb[key]
        m = len(rb) - len(ra)
        if m < 0:
            raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} do not grow by a period")
        x = _parting(ra, rb)
        if _names(ra[x:]) != _names(rb[x + m:]):
            raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} are not periodic")
        if 0 < m <= x and _names(rb[x - m:x]) == _names(rb[x:x + m]):
            moved = _arr([r[1] for r in rb[x:x + m]])[:, 2:4] - _arr([r[1] for r in rb[x - m:x]])[:, 2:4]
            if (moved != delta).any():
                raise Settling(f"the records of {key[1]} on PE{key[0]} move {int(moved.min())} ps a period, "
                               f"the run {delta} ps")


class _Runs:
    """The four short copies of one candidate period and what they say.

    Each stream of records (one unit of one PE: its dispatches, its stages, its commands)
    is in the order the unit made them. In the shorter copy ``a`` and the next one ``b`` a
    stream is the same up to where they part, then ``b`` has one period's records (the
    block), then both have the same records again (the tail), shifted. Every integer of a
    record moves by its own amount: a block record by what the third copy shows between
    its two blocks, a tail record by what ``b`` shows against ``a``. The streams then
    interleave by completion time, ties in the order ``b`` has them.
    """

    def __init__(self, sims: list, recs: list, streams: list):
        self.sims, self.recs = sims, recs
        keys = set(streams[0])
        if any(set(st) != keys for st in streams[1:]):
            raise NotPeriodic("the copies do not have the same streams")
        self.pre, self.blk, self.step, self.suf, self.tail_step = [], [], [], [], []
        for key in sorted(keys, key=str):
            a, b, c, d = (st[key] for st in streams)
            m = len(b) - len(a)
            if m < 0 or len(c) != len(a) + 2 * m or len(d) != len(a) + 3 * m:
                raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} do not grow by a period")
            x = _parting(a, b)
            if _names(a[x:]) != _names(b[x + m:]) or _names(b[x:x + m]) != _names(c[x + m:x + 2 * m]) \
                    or [_own(r) for r in c[:x + m]] != [_own(r) for r in b[:x + m]]:
                raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} are not periodic")
            self.pre += b[:x]
            self.blk += b[x:x + m]
            self.step.append(_arr([r[1] for r in c[x + m:x + 2 * m]]) - _arr([r[1] for r in c[x:x + m]]))
            self.suf += b[x + m:]
            self.tail_step.append(_arr([r[1] for r in b[x + m:]]) - _arr([r[1] for r in a[x:]]))
        self.step = np.concatenate(self.step) if self.step else np.zeros((0, 10), np.int64)
        delta = sims[1].latency_ps - sims[0].latency_ps
        moved = self.step[:, 2:4]
        if moved.size and not (moved == delta).all():  # a steady state moves every stream by Δ
            i = int(np.nonzero((moved != delta).any(axis=1))[0][0])
            n = self.blk[i][1][0]
            raise Settling(f"the records of {n[1]} on PE{n[0]} move {int(moved[i, 0])} ps a period, "
                           f"the run {delta} ps")
        self.tail_step = np.concatenate(self.tail_step) if self.tail_step else np.zeros((0, 10), np.int64)
        self.totals = [_totals(s) for s in sims]

    def records(self, k: int) -> tuple[list, np.ndarray, np.ndarray]:
        """The records of the copy with ``k`` periods inserted after the shorter one
        (``k ≥ 1``; the second copy is ``k = 1``), in completion order: ``(table, codes,
        nums)``, each record's names ``table[code]`` and its integers a row of ``nums``."""
        table, code = [], {}
        for _, r in self.pre + self.blk + self.suf:
            if r[0] not in code:
                code[r[0]] = len(table)
                table.append(r[0])
        codes_of = lambda rs: np.array([code[r[0]] for _, r in rs], dtype=np.int64)  # noqa: E731
        pre = _arr([r for _, r in self.pre])
        blk = _arr([r for _, r in self.blk])
        blocks = blk[None, :, :] + np.arange(k, dtype=np.int64)[:, None, None] * self.step[None, :, :]
        suf = _arr([r for _, r in self.suf]) + (k - 1) * self.tail_step
        nums = np.concatenate([pre, blocks.reshape(-1, 10), suf])
        codes = np.concatenate([codes_of(self.pre), np.tile(codes_of(self.blk), k), codes_of(self.suf)])
        # ties in completion time: the order of the representatives in the second copy
        rank = np.concatenate([np.array([i for i, _ in self.pre], dtype=np.int64),
                               np.tile(np.array([i for i, _ in self.blk], dtype=np.int64), k),
                               np.array([i for i, _ in self.suf], dtype=np.int64)])
        order = np.lexsort((rank, nums[:, 3]))  # by end time, then as in the second copy
        order = _completions_after_their_stage(table, codes, nums, order)
        return table, codes[order], nums[order]

    def total(self, k: int) -> dict:
        ta, tb = self.totals[0], self.totals[1]
        if ta.keys() != tb.keys():
            raise NotPeriodic("the copies do not have the same units, links or PEs")
        return {n: (ta[n] if _is_constant(n) else ta[n] + k * (tb[n] - ta[n])) for n in ta}

    def verify(self) -> None:
        """The third and fourth copies must be what the first two predict."""
        for k, (recs, tot) in ((2, (self.recs[2], self.totals[2])), (3, (self.recs[3], self.totals[3]))):
            table, codes, nums = self.records(k)
            if [table[c] for c in codes.tolist()] != [r[0] for r in recs] or not np.array_equal(
                    nums, np.array([r[1] for r in recs], dtype=np.int64).reshape(-1, 10)):
                raise NotPeriodic(f"the copy with {k} periods is not the predicted one")
            if tot != self.total(k):
                bad = next(n for n in tot if tot[n] != self.total(k).get(n))
                raise NotPeriodic(f"the copy with {k} periods has another total {bad}")


def _completions_after_their_stage(table: list, codes: np.ndarray, nums: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``order`` with each command's PE_SCHEDULER record moved to right after its own stage
    that ends at the same instant, if the tie-break put it before: PE_SCHEDULER logs a
    command as its last stage ends (kbframe.sim.oplog), and the second copy's order, which
    breaks the other ties, does not say this when the command's records lie in different
    parts (block, tail) of their streams."""
    t1 = nums[order, 3]
    tied = np.zeros(len(order), dtype=bool)
    same = t1[1:] == t1[:-1]
    tied[1:] |= same
    tied[:-1] |= same
    sched = np.array([n[1] == "scheduler" for n in table], dtype=bool)[codes[order]]
    todo = np.nonzero(tied & sched)[0]
    if not len(todo):
        return order
    out = order.tolist()
    pe_cmd = lambda i: (table[codes[i]][0], int(nums[i, 0]))  # noqa: E731
    for pos in todo.tolist()[::-1]:  # from the end, so earlier positions stay valid
        i = out[pos]
        end, key = nums[i, 3], pe_cmd(i)
        last = None
        j = pos + 1
        while j < len(out) and nums[out[j], 3] == end:
            r = out[j]
            if table[codes[r]][1] not in ("cpu", "scheduler") and pe_cmd(r) == key:
                last = j
            j += 1
        if last is not None:
            out.insert(last, out.pop(pos))
    return np.array(out, dtype=np.int64)


def _write_oplog(path, table: list, codes: np.ndarray, nums: np.ndarray) -> None:
    """The op_log text of these records, as :class:`~kbframe.sim.oplog.OpLog` writes it."""
    heads = np.array([f'{{"pe": {pe}, "unit": "{unit}", "op_kind": "{kind}", "cmd": '
                      for pe, unit, kind, *_ in table], dtype=object)
    col = nums[:, :5].T.tolist()
    head, nbytes = heads[codes].tolist(), np.array([n[3] for n in table], dtype=np.int64)[codes].tolist()
    peer = np.array([n[4] for n in table], dtype=np.int64)[codes]
    if not (peer >= 0).any():
        text = format_rows(zip(head, col[0], col[1], col[2], col[3], nbytes, col[4]))
    else:  # an IPCQ record also names the other PE (OpLog.stage)
        rows, out = [], []
        for h, cmd, tile, t0, t1, nb, td, pr in zip(head, *col[:4], nbytes, col[4], peer.tolist()):
            if pr >= 0:
                out.append(format_rows(rows))
                rows = []
                out.append(_row(h, cmd, tile, t0, t1, nb, -1)[:-2] + f', "peer": {pr}}}\n')
            else:
                rows.append((h, cmd, tile, t0, t1, nb, td))
        out.append(format_rows(rows))
        text = "".join(out)
    with open(path, "w", buffering=1 << 20) as f:
        f.write(text)


def _apply(sim: Simulation, tot: dict, table: list, codes: np.ndarray, nums: np.ndarray) -> None:
    """Make ``sim`` (the longest short copy) stand for the full run."""
    e, o = sim.engine, sim.oplog
    sim.latency_ps = tot["latency_ps"]
    o.n_records, o.hbm_bytes = tot["n_records"], tot["hbm_bytes"]
    for key, t in o._totals.items():
        for f in ("count", "bytes", "busy_ps", "flops"):
            setattr(t, f, tot[("oplog", key, f)])
    column = lambda j: np.array([n[j] for n in table], dtype=np.int64)[codes]  # noqa: E731
    data = np.empty((len(codes), _FIELDS), dtype=np.int64)
    data[:, 0] = column(5)
    data[:, 1:5] = nums[:, 5:9]
    data[:, 5] = column(6)
    data[:, 6] = nums[:, 9]
    o.waits.data = array(o.waits.data.typecode, data.ravel().tobytes())
    o._wdata = o.waits.data
    is_cpu = np.array([n[1] == "cpu" for n in table], dtype=bool)[codes]  # dispatches: bytes = logical bytes
    pe_of, nbytes = column(0), column(3)
    for pe in e.pes.built():
        cpu = pe.cpu
        cpu.n_commands = tot[("cpu", pe.index, "n_commands")]
        cpu.busy_ps = tot[("cpu", pe.index, "busy_ps")]
        sizes = nbytes[is_cpu & (pe_of == pe.index)]
        cost = {nb: cpu.cycles_for(nb) for nb in np.unique(sizes).tolist()}
        # summed in dispatch order, as PE_CPU does: cumsum adds one after another (the same float)
        cpu.cycles = float(np.cumsum(np.array([cost[nb] for nb in sizes.tolist()], dtype=np.float64))[-1]) \
            if len(sizes) else 0.0
    for key, ln in e.fabric.links.items():
        for f in ("sent", "received", "bytes", "busy_ps"):
            setattr(ln, f, tot[("link", key, f)])
    for f in ("commands", "stages", "accesses"):
        if ("sanitizer", f) in tot:
            sim.sanitizer[f] = tot[("sanitizer", f)]


class _Copies:
    """Short copies of the bench by their number of steps, each simulated once (the
    candidate periods share them); the hardware's units are instantiated once. Their
    op_logs are kept in memory: nothing is written before the run directory is opened."""

    def __init__(self, cfg, wl, kernel, recipes, check, key, step, r, units):
        self.cfg, self.wl, self.kernel, self.recipes, self.check = cfg, wl, kernel, recipes, check
        self.key, self.step, self.r = key, step, r
        self.units = units
        self.bench = wl.cfg.copy()  # one copy, its key set per short copy (they run one by one)
        self.done: dict = {}

    def get(self, n: int) -> tuple:
        """The copy with ``n`` steps: ``(simulation, records, streams)`` (:func:`_records`,
        :func:`_streams`)."""
        if n not in self.done:
            with open_dict(self.bench):
                self.bench[self.key] = n * self.step + self.r
            w = type(self.wl)(self.bench, n_pes=self.wl.n_pes)
            w.validate()
            if self.check:  # the sanitizer reads the op_log's text
                text = io.StringIO()
                sim = simulate(self.cfg, w, self.kernel, self.recipes, None, text, True, False,
                               copy.deepcopy(self.units))
                recs = _records(read_oplog(text), sim.oplog.waits)
            else:  # only compared: the records stay unformatted
                sink = RowSink()
                sim = simulate(self.cfg, w, self.kernel, self.recipes, None, sink, False, False,
                               copy.deepcopy(self.units))
                recs = _records(sink.rows, sim.oplog.waits, sim.oplog.head_names())
            self.done[n] = (sim, recs, _streams(recs))
        return self.done[n]

    def cost(self, n_a: int, p: int) -> int:
        """Steps the copies for ``(n_a, p)`` would add to those simulated so far (at most:
        :func:`_precheck` may rule the candidate out after two)."""
        return sum(n for n in {n_a + i * p for i in range(4)} if n not in self.done)

    @property
    def steps(self) -> int:
        return sum(self.done)

    def runs(self, n_a: int, p: int) -> _Runs:
        _precheck(self.get(n_a), self.get(n_a + p))
        got = [self.get(n_a + i * p) for i in range(4)]
        runs = _Runs(*([g[i] for g in got] for i in range(3)))
        runs.verify()
        return runs


def run(cfg, wl, kernel, recipes, check: bool, units: dict | None = None) -> Outcome:
    """Fast-forward the bench; ``Outcome.sim`` is None (simulate it in full, ``note`` says
    why) when the workload has no periodic axis, too few periods or none that verifies,
    when a short copy fails (the full run's pre-flight checks and simulation then report
    the error as they would) or when the extrapolated run ends beyond the time base.

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
    q, r = divmod(int(cfg.bench[key]), step)
    why = None
    copies = _Copies(cfg, wl, kernel, recipes, check, key, step, r,
                     units if units is not None else build_units(cfg.hardware))
    n_min = MIN_STEPS
    while True:
        settling = False
        for p in PERIODS:
            n_a = n_min + (q - n_min) % p
            k_full = (q - n_a) // p
            if k_full < MIN_COPIES or (n_a + 3 * p) * 2 > q:
                break
            budget = SETTLING_BUDGET if n_min > MIN_STEPS else BUDGET
            if copies.steps + copies.cost(n_a, p) > budget * q:
                return Outcome(None, f"simulated in full: {why + '; more' if why else 'its'} short copies would "
                                     f"cost over {budget:.0%} of the run")
            try:
                runs = copies.runs(n_a, p)
            except Settling as e:
                why, settling = f"not periodic ({e})", True
                break
            except NotPeriodic as e:
                why = f"not periodic ({e})"
                continue
            except KbframeError as e:
                return Outcome(None, f"simulated in full: a short copy failed ({e})")
            tot = runs.total(k_full)
            late = [n for n in tot if n == "latency_ps" or (isinstance(n, tuple) and n[-1] == "busy_ps")]
            if any(tot[n] >= MAX_PS for n in late):
                return Outcome(None, "simulated in full: the run ends beyond the time base")
            table, codes, nums = runs.records(k_full)
            try:
                nums = _global_refs(table, codes, nums)
            except NotPeriodic as e:
                return Outcome(None, f"simulated in full: not periodic ({e})")
            sim = runs.sims[3]
            _apply(sim, tot, table, codes, nums)
            sim.engine.wall_s = time.perf_counter() - t_start
            return Outcome(sim, f"fast-forwarded {k_full - 3} of {k_full} periods of {p} {key} step(s) "
                                f"({len(codes) - len(runs.recs[3])} of {len(codes)} records by shifting)",
                           (table, codes, nums))
        if not settling:
            return Outcome(None, f"simulated in full: {why or 'too few periods to skip'}")
        n_min *= GROWTH


def verify(cfg, wl, kernel, recipes, oplog_path, check: bool, temp, ff: Simulation) -> None:
    """``run.fast_forward=verify``: simulate the bench in full as well and compare. Raises
    SanitizerError (rule ``fast_forward``) naming the first difference: the op_log's first
    differing line, or the total, the wait record or the dispatch cycles that differ."""
    from ..errors import SanitizerError
    path = temp("ff_full.jsonl")
    try:
        full = simulate(cfg, wl, kernel, recipes, None, path, check, False)
        with open(path) as a, open(oplog_path) as b:
            for i, (la, lb) in enumerate(zip(a, b)):
                if la != lb:
                    raise SanitizerError(f"fast-forward: op_log line {i + 1} differs from the full simulation's: "
                                         f"{lb.strip()} instead of {la.strip()}", "fast_forward")
        if full.oplog.n_records != ff.oplog.n_records:
            raise SanitizerError(f"fast-forward: {ff.oplog.n_records} records, the full simulation has "
                                 f"{full.oplog.n_records}", "fast_forward")
    finally:
        path.unlink(missing_ok=True)
    tf, tg = _totals(full), _totals(ff)
    bad = [n for n in tf if tf[n] != tg.get(n)]
    if bad:
        raise SanitizerError(f"fast-forward: total {bad[0]} is {tg.get(bad[0])}, the full simulation's "
                             f"{tf[bad[0]]}", "fast_forward")
    if full.oplog.waits.data != ff.oplog.waits.data:
        raise SanitizerError("fast-forward: the wait records differ from the full simulation's", "fast_forward")
    for pe in full.engine.pes.built():
        if pe.cpu.cycles != ff.engine.pes[pe.index].cpu.cycles:
            raise SanitizerError(f"fast-forward: PE{pe.index} dispatch cycles {ff.engine.pes[pe.index].cpu.cycles!r}, "
                                 f"the full simulation's {pe.cpu.cycles!r}", "fast_forward")
