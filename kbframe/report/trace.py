"""``op_log.jsonl`` → ``trace.json`` in Chrome trace-event format (Perfetto, chrome://tracing).

Layout:
- one process (``pid``) per PE, named ``PE<n>``;
- one thread (track) per unit, named ``PE_CPU dispatch``, ``PE_SCHEDULER``, ``DMA read``,
  ``DMA write``, ``GEMM``, ``MATH`` (an unknown unit keeps its op_log name);
- one complete event (``"ph": "X"``) per op_log record, ``name`` = op_kind, ``cat`` = unit,
  ``ts``/``dur`` in µs (the format's unit), ``args`` = {op_kind, cmd, bytes, tile} (DMA adds
  ``t_data_us``, when the channel began moving the transfer's bytes; a slice on the run's
  critical path adds ``critical: true``, see :func:`write_trace`);
- one flow per command (``"ph"`` ``s`` → ``t`` … → ``f``, ``id`` = pe·10⁹ + cmd, bound to the
  enclosing slices): dispatch on PE_CPU → admission in PE_SCHEDULER → each stage in time
  order, so a viewer can follow one composite from dispatch to completion;
- on many PEs, an IPCQ track per link: a record naming a ``peer`` PE goes to the track
  ``IPCQ send → PE<peer>`` (``IPCQ recv ← PE<peer>``), and a flow (``cat`` ``ipcq``, ``id``
  from :data:`LINK_FLOW_BASE`) joins each send to the receive that took it (the k-th
  receive on a link takes its k-th send, as the sanitizer's ``ipcq_matched`` checks);
- with ``run.power_track``, a counter track ``power W`` per PE (``"ph": "C"``): its static
  power plus, for each unit busy at that moment, the unit's energy spread evenly over its
  busy time (a DMA channel's data phases, every other unit's slices; the TCM's energy on
  the units whose traffic made it; a unit whose slices take no time, an IPCQ receive, over
  the whole run), so its area is the PE's energy (kbframe.report.power computes it from
  kbframe.run.energy's figures).

Complete events on one thread must nest, but some spans overlap without nesting: commands
in flight in PE_SCHEDULER, DMA transfers whose setup overlaps (DESIGN.md modelling notes).
Those go to overflow lanes, extra threads next to the unit's first one and named
``PE_SCHEDULER ·2``, ``DMA read ·2`` …; a unit whose slices never overlap has one track.

The records are read from the run's record table (kbframe.records; an op_log.jsonl in any
JSON layout is read into one first), a chunk of columns at a time, and events are written
as they are made; only the commands still in flight are held (the records are in
completion order, and a command's ``scheduler`` record follows its stages).

A table in periodic form (a fast-forwarded run's op_log, kbframe.periodic_form) is drawn with the
first and last periods of each repeating section in full (a nested section within each of
them the same way); each repetition between them is one slice per PE on a track
``repeated`` (``name`` ``period j of R``, or ``section k period j of R`` when there are
several sections; ``args`` its records and its shift from the section's first period), or,
for a period of fewer than :data:`SLICE_EACH_FROM` records, one slice per PE for them all
(``periods 2-{R-1} of R``, ``args`` ``repetitions`` and ``every_us``), and the phases and
flows that lie within them are left out: the trace grows with the run's distinct work, not
with its repetitions.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
from collections import deque
from pathlib import Path

import numpy as np

from ..files import final_name, temp_path
from ..record_fields import FIELDS
from ..records import RecordTable
from ..sorting import groups
from .oplog import op_log_file
from .power import POWER_TID, power_counters, power_from_metrics


def tracks_from_units(units: dict) -> dict:
    """Track names, in track order, from ``metrics.json`` ``units`` (each with the
    ``label`` its unit declares): op_log unit → track name. The ``cpu`` records are
    PE_CPU's dispatches, so its track is ``"<label> dispatch"``."""
    return {name: (f"{u.get('label', name)} dispatch" if name == "cpu" else u.get("label", name))
            for name, u in units.items()}


def _metrics(path: Path) -> dict | None:
    """A run's ``metrics.json`` (None when there is none), checked as far as the trace reads
    it. Raises ValueError naming the file."""
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(m, dict):
            raise ValueError("not a JSON object")
        tracks_from_metrics(m)
        return m
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a run's metrics.json ({e})") from None


def tracks_from_metrics(metrics: dict) -> dict:
    """:func:`tracks_from_units` of ``units`` and of every PE's (``pes[].units``), so a
    unit only some PEs use (an IPCQ send) keeps its label."""
    units = dict(metrics.get("units", {}))
    for pe in metrics.get("pes") or []:
        for name, u in pe.get("units", {}).items():
            units.setdefault(name, u)
    return tracks_from_units(units)


#: records the trace reads from the table at a time (:func:`write_trace`)
RECORD_CHUNK = 1 << 13
#: flow ids are ``pe * FLOW_ID_STRIDE + cmd``
FLOW_ID_STRIDE = 1_000_000_000
#: ids of the send → receive flows start here (below 2⁵³: viewers read ids as doubles)
LINK_FLOW_BASE = 1 << 52
#: threads per unit reserved for overflow lanes (tid = unit slot * LANE_STRIDE + lane + 1)
LANE_STRIDE = 1000


#: the tid of a PE's phase track (kbframe.run.phases), lanes after it
PHASE_TID = 900 * LANE_STRIDE
#: the tid of a PE's track of repeated periods (a table in periodic form)
REPEAT_TID = 899 * LANE_STRIDE
#: a section whose period holds fewer records is drawn with one slice per PE for all its
#: left-out repetitions (a slice a repetition would outweigh the records it stands for)
SLICE_EACH_FROM = 256


def _repeats(table: RecordTable) -> tuple[list, list, list]:
    """A table in periodic form (kbframe.periodic_form.Periodic): its sections as drawn
    (:meth:`~kbframe.periodic_form.Periodic.drawn`: nested ones within their section's first and
    last repetitions), per section the indices of the records the trace leaves out (every
    repetition but the first and last), and, per left-out repetition and PE, ``(section,
    pe, j, t0_ps, t1_ps, records)``: the span of its records on that PE."""
    p = table.form
    if p is None:
        return [], [], []
    pe_of = np.array(table.name_col(0), dtype=np.int64)
    sections = p.drawn()
    left_out, out, end = [], [], {}
    for k in sorted(range(len(sections)), key=lambda k: sections[k].prefix + sections[k].period):
        s = sections[k]  # in the order of the records left out: a section's nested ones in its
        if s.times < 3:  # first period come before its repetitions, those in its last after
            continue
        lo, hi = s.prefix + s.period, s.end - s.period
        for jj, q, a, b, n in _spans(table, pe_of, s):
            a = max(a, end.get(q, a))  # slices on one track must not overlap: a repetition starts as
            end[q] = b                 # the one before ends, if its first record began earlier
            out.append((k, q, jj, a, b, n))
        left_out.append(range(lo, hi))
    return sections, left_out, out


def _grouped(c: dict, key: np.ndarray) -> tuple:
    """Per distinct ``key`` of the records ``c`` (columns): the key, the earliest start, the
    latest end and how many records."""
    order, keys, first = groups(key)
    return (keys, np.minimum.reduceat(c["t0"][order], first), np.maximum.reduceat(c["t1"][order], first),
            np.diff(np.append(first, len(order))))


def _spans(table: RecordTable, pe_of: np.ndarray, s) -> list:
    """``(j, pe, t0_ps, t1_ps, records)`` of the repetitions of section ``s`` the trace leaves
    out (every one but the first and last), per repetition and PE in that order (``j`` from
    2; 0: one span per PE for them all, a period shorter than :data:`SLICE_EACH_FROM`).
    When every record's times move alike from one repetition to the next, from its first
    period alone (a model step's period of layers: the records left out are not made)."""
    d0, d1 = s.shift["t0"], s.shift["t1"]
    if len(d0) and (d0 == d0[0]).all() and (d1 == d1[0]).all():
        c = table.cols(s.prefix, s.prefix + s.period)
        qs, t0, t1, count = _grouped(c, pe_of[c["name"]])
        dt0, dt1, reps = int(d0[0]), int(d1[0]), s.times - 2
        if s.period < SLICE_EACH_FROM:
            return [(0, q, a + dt0, b + reps * dt1, n * reps)
                    for q, a, b, n in zip(qs.tolist(), t0.tolist(), t1.tolist(), count.tolist())]
        return [(r + 1, q, a + r * dt0, b + r * dt1, n) for r in range(1, reps + 1)
                for q, a, b, n in zip(qs.tolist(), t0.tolist(), t1.tolist(), count.tolist())]
    lo, hi = s.prefix + s.period, s.end - s.period
    c = table.cols(lo, hi)
    j = np.arange(hi - lo) // s.period + 2  # the repetition each record is in
    pe = pe_of[c["name"]]
    if s.period < SLICE_EACH_FROM:
        j[:] = 0  # one span per PE for them all
    key = j * (int(pe.max()) + 1) + pe  # one span per (repetition, PE)
    keys, t0, t1, count = _grouped(c, key)
    m = int(pe.max()) + 1
    return list(zip((keys // m).tolist(), (keys % m).tolist(), t0.tolist(), t1.tolist(), count.tolist()))


def _outside(phases: list, span: dict) -> list:
    """The phases ``(pe, name, t0, t1, layer)`` that no span ``{(section, pe): (t0, t1)}``
    on their PE holds (a span stands for left-out repetitions), in their order."""
    if not phases or not span:
        return list(phases)
    by_pe: dict = {}
    for (_, q), ab in span.items():
        by_pe.setdefault(q, []).append(ab)
    pe = np.array([ph[0] for ph in phases], dtype=np.int64)
    t0 = np.array([ph[2] for ph in phases], dtype=np.int64)
    t1 = np.array([ph[3] for ph in phases], dtype=np.int64)
    held = np.zeros(len(phases), dtype=bool)
    for q, ab in by_pe.items():
        at = np.nonzero(pe == q)[0]
        ab = np.array(ab, dtype=np.int64)
        for lo in range(0, len(ab), 1024):  # bounded temporaries: phases × spans
            a, b = ab[lo:lo + 1024, 0], ab[lo:lo + 1024, 1]
            held[at] |= ((a[None] <= t0[at, None]) & (t1[at, None] <= b[None])).any(axis=1)
    return [ph for ph, h in zip(phases, held.tolist()) if not h]


def _busy(table: RecordTable, lo: int, hi: int) -> list:
    """``(pe, op_log unit, t0, t1)`` of the busy time of records ``[lo, hi)`` (a DMA's from
    its data phase on), for the power track (:func:`write_trace`'s ``busy``)."""
    c = table.cols(lo, hi)
    b0 = np.where(c["td"] >= 0, c["td"], c["t0"])
    at = c["t1"] > b0
    names = table.names
    return [(names[k][0], names[k][1], a, b) for k, a, b in
            zip(c["name"][at].tolist(), b0[at].tolist(), c["t1"][at].tolist())]


def _write_repeats(write, repeats: list, sections: list, dumps) -> set:
    """Write the slices of the left-out repetitions (:func:`_repeats`): each is its
    section's period 1's records shifted, ``later_us`` later when every record moves by the
    same time (a steady state); with several sections (``sections``, as drawn), named and
    marked by their section (1 the first). The PEs they are on."""
    per_us = {}
    for k, s in enumerate(sections if repeats else ()):
        dt = s.shift["t1"]
        per_us[k] = float(dt[0]) / 1e6 if (dt == dt[0]).all() else None
    several = len(sections) > 1
    for k, pe, j, t0, t1, n in repeats:
        args = {"records": n, "as": "period 1"}
        if several:
            args["section"] = k + 1
        times = sections[k].times
        if j:
            if per_us[k] is not None:
                args["later_us"] = per_us[k] * (j - 1)
            name = f"period {j} of {times}"
        else:  # every left-out repetition in one slice (SLICE_EACH_FROM)
            args["repetitions"] = times - 2
            if per_us[k] is not None:
                args["every_us"] = per_us[k]
            name = f"periods 2-{times - 1} of {times}"
        name = f"section {k + 1} {name}" if several else name
        write(',\n{"name":"%s","cat":"repeated","ph":"X","ts":%s,"dur":%s,"pid":%d,"tid":%d,"args":%s}'
              % (name, _us(t0), _us(t1 - t0), pe, REPEAT_TID, dumps(args)))
    return {pe for _, pe, *_ in repeats}


def _write_phases(write, phases, dumps) -> set:
    """Write the phase slices (:func:`write_trace`'s ``phases``), each on the first lane of
    its PE whose last slice ended by its start; the ``(pe, lane)`` pairs used."""
    ends: dict = {}
    used = set()
    for pe, name, t0, t1, layer in sorted(phases, key=lambda s: (s[0], s[2], -s[3])):
        lanes = ends.setdefault(pe, [])
        lane = next((i for i, e in enumerate(lanes) if e <= t0), len(lanes))
        if lane == len(lanes):
            lanes.append(t1)
        else:
            lanes[lane] = t1
        used.add((pe, lane))
        args = {} if layer is None else {"layer": layer}
        write(',\n{"name":%s,"cat":"phase","ph":"X","ts":%s,"dur":%s,"pid":%d,"tid":%d,"args":%s}'
              % (dumps(name), _us(t0), _us(t1 - t0), pe, PHASE_TID + lane, dumps(args)))
    return used


def _us(ps: int) -> str:
    """Integer ps → µs as JSON text; ``ps / 1e6`` is the double nearest the decimal, so
    its repr is that decimal (no float noise in the file)."""
    return repr(ps / 1e6)


#: a slice's part in its command's flow
_DISPATCH, _ADMISSION, _STAGE = 0, 1, 2


class _Kind:
    """What the slices of one ``(pe, unit, op_kind)`` share: their JSON text, their unit's
    lanes (``ends``: each lane's latest end, ps, shared by the unit's op_kinds) and a count."""

    __slots__ = ("pe", "unit", "head", "ends", "lanes", "role", "count", "_tid0", "_name")

    def __init__(self, pe: int, unit, name: str, cat: str, ends: list, slot: int):
        self.pe, self.unit, self.ends, self.count = pe, unit, ends, 0
        self.head = f'{{"name":{name},"cat":{cat},"ph":"X","ts":'
        self.role = _DISPATCH if unit == "cpu" else _ADMISSION if unit == "scheduler" else _STAGE
        self.lanes: list[tuple] = []   # per lane: (slice text from pid to cmd, flow text after ts, tid)
        self._tid0, self._name = slot * LANE_STRIDE + 1, name

    def lane(self, lane: int) -> tuple:
        """``lanes[lane]``, made (with the lanes before it) on first use."""
        while len(self.lanes) <= lane:
            tid = self._tid0 + len(self.lanes)
            self.lanes.append((f',"pid":{self.pe},"tid":{tid},"args":{{"op_kind":{self._name},"cmd":',
                               f',"pid":{self.pe},"tid":{tid},"bp":"e"}}', tid))
        return self.lanes[lane]


def _link_flow(fid: int, send: tuple, recv: tuple) -> str:
    """The flow from a send slice to the receive that took it: ``(pe, tid, ts text)`` each."""
    event = ',\n{"name":"ipcq","cat":"ipcq","ph":"%s","id":%d,"ts":%s,"pid":%d,"tid":%d%s}'
    return (event % ("s", fid, send[2], send[0], send[1], "")
            + event % ("f", fid, recv[2], recv[0], recv[1], ',"bp":"e"'))


#: how a track of a record that names a peer PE points at it, by the record's kind
_LINK_ARROW = {"send": "→", "recv": "←"}


def _flow(fid: int, steps: list) -> str:
    """One command's flow events (``s``, ``t`` …, ``f``); ``steps`` are the steps' texts after
    ``"ts":`` in time order."""
    event = f',\n{{"name":"command","cat":"flow","ph":"%s","id":{fid},"ts":'
    first, *middle, last = steps
    t = event % "t"
    return event % "s" + first + (t + t.join(middle) if middle else "") + event % "f" + last


def write_trace(records, out: Path | str, tracks: dict | None = None, critical=None,
                phases=(), power: dict | None = None, source: str = "op_log.jsonl") -> dict:
    """Write the trace of ``records`` (the run's :class:`~kbframe.records.RecordTable`, or
    a path to an op_log.jsonl, read with :meth:`RecordTable.parse`) to ``out``
    (trace.json), atomically (a temporary file, then rename); ``source``: the op_log's
    file name, which the trace names (a path's own name when given one). ``tracks``
    (op_log unit → track name, in track order; the units'
    declared labels, :func:`tracks_from_units`) names the tracks; a unit it does not list
    keeps its op_log name and comes after those it lists.

    ``critical``: op_log record indices (0-based, blank lines not counted) on the run's
    critical path (:mod:`kbframe.report.critical_path`); their slices get
    ``"critical":true`` in ``args``, so Perfetto can find them (query
    ``args.critical``). The flag comes from the run, which knows what each record
    waited for; a trace rebuilt from an op_log alone (``python -m kbframe.report.trace``)
    has none, and is byte-identical to the run's trace without it.

    ``phases``: ``(pe, name, t0_ps, t1_ps, layer)`` per phase occurrence (the kernel's
    ``tl.phase`` groups, kbframe.run.phases), drawn as slices (``cat`` ``phase``) on a
    per-PE track ``layer`` above the units (overlapping phases on lanes ``layer ·2`` ...).
    Like the critical flags, only the run knows them.

    ``power``: ``{pe: {"units": {op_log unit: pJ}, "static_w": W, "latency_ns": ns}}``
    (kbframe.report.power.power_from_metrics): draw each PE's power counter track (module doc).

    Returns:
        ``{"slices": {unit: count}, "flows": n_commands, "link_flows": n_sends_received,
        "lanes": {unit@PEn: n}}``.
    Raises:
        OSError: the op_log cannot be read or the trace cannot be written.
        ValueError: a malformed op_log line (names the line number).
    """
    if not isinstance(records, RecordTable):
        source = Path(records).name
        records = RecordTable.parse(Path(records))
    out = Path(out)
    tracks = tracks or {}
    order = {unit: i for i, unit in enumerate(tracks)}
    tmp = temp_path(out)  # a fresh name, created exclusively: never a file or link already there
    lanes: dict[tuple, list] = {}        # (pe, unit) → per-lane max end (ps)
    slots: dict[str, int] = {}           # unit → slot (sets tids and sort order)
    names: dict[str, str] = {}           # op_kind / unit → its JSON string
    kinds: dict[tuple, _Kind] = {}       # (pe, unit, op_kind) → its _Kind
    pending: dict[tuple, list] = {}      # (pe, cmd text) → [(ps, tid, flow text)]: dispatch, then stages
    linked: dict[str, tuple] = {}        # a link's track → (op_log unit, arrow, peer): its name
    sends: dict[tuple, deque] = {}       # (src, dst) → sends not yet received: (pe, tid, ts)
    n_links = 0
    durs: dict[int, str] = {}            # duration (ps) → its µs text (few distinct values)
    n_flows = 0
    n_rec = -1                           # record index of the line being read
    busy = [] if power is not None else None  # (pe, op_log unit, t0, t1) of each record's busy time
    critical = critical or ()
    dumps = json.dumps

    def kind_of(pe, unit, kind) -> _Kind:
        k = kinds.get((pe, unit, kind))
        if k is None:
            if unit not in slots:
                slots[unit] = order[unit] if unit in order else len(order) + sum(u not in order for u in slots)
                names[unit] = dumps(str(unit))
            if kind not in names:
                names[kind] = dumps(str(kind))
            k = kinds[(pe, unit, kind)] = _Kind(pe, unit, names[kind], names[unit],
                                                lanes.setdefault((pe, unit), []), slots[unit])
        return k

    def from_fields(pe, unit, kind, cmd, tile, p0, p1, nbytes, p_data, peer) -> tuple:
        if peer is not None:  # one track per link and direction
            arrow = _LINK_ARROW.get(kind, "·")
            base, unit = unit, f"{unit}{arrow}PE{peer}"
            linked[unit] = (base, arrow, peer)
        return (kind_of(pe, unit, kind), p0, p1, p_data, _us(p0), str(cmd), str(tile), str(nbytes),
                None if peer is None else (peer, kind))

    def from_table(table, parts):
        """Each record of the table in ``parts`` (index ranges): ``(its _Kind, t_start, t_end,
        t_data or None, ts text, cmd text, tile text, bytes text, (peer, op_kind) or None)``,
        made column by column (C-level maps) a chunk at a time, and handed over with no Python
        frame per record; between two parts, one tuple whose _Kind is None."""
        gap = [(None,) * 9]
        return itertools.chain.from_iterable(
            itertools.chain.from_iterable(
                table_chunk(table.names, table.cols(a, min(hi, a + RECORD_CHUNK))) for a in range(lo, hi, RECORD_CHUNK))
            if lo is not None else gap for lo, hi in parts)

    def table_chunk(names, c):
        """One chunk of :func:`from_table`: an iterator of its records."""
        code, cmd, tile, p0, p1, td, nbytes, peer = (c[f].tolist() for f in FIELDS[:8])
        if (c["peer"] >= 0).any():  # a record names a peer: one by one
            return (from_fields(*names[k], m, t, a0, a1, b, None if d < 0 else d, pr if pr >= 0 else None)
                    for k, m, t, a0, a1, d, b, pr in zip(code, cmd, tile, p0, p1, td, nbytes, peer))
        known = {k: kind_of(*names[k]) for k in dict.fromkeys(code)}  # tracks in order of use
        data = c["td"].astype(object)
        data[c["td"] < 0] = None
        return zip([known[k] for k in code], p0, p1, data.tolist(), list(map(repr, (c["t0"] / 1e6).tolist())),
                   list(map(str, cmd)), list(map(str, tile)), list(map(str, nbytes)), [None] * len(code))

    sections, left_out, repeats = _repeats(records)
    parts = [(0, len(records))]
    if left_out:  # the left-out repetitions: record indices after them move up; phases within them go
        parts, at = [], 0
        for r in left_out:
            parts += [(at, r.start), (None, None)]
            at = r.stop
        parts.append((at, len(records)))
        starts = np.array([r.start for r in left_out], dtype=np.int64)
        stops = np.array([r.stop for r in left_out], dtype=np.int64)
        gone = np.concatenate(([0], np.cumsum(stops - starts)))  # records left out before each section's, after
        c = np.fromiter(critical, dtype=np.int64)
        k = np.searchsorted(starts, c, side="right") - 1  # the last left-out range starting at or before
        inside = (k >= 0) & (c < stops[np.maximum(k, 0)])
        critical = set((c - np.where(k >= 0, gone[k + 1], 0))[~inside].tolist())
        span = {}
        for sec, pe, _, t0, t1, _ in repeats:
            a, b = span.get((sec, pe), (t0, t1))
            span[(sec, pe)] = (min(a, t0), max(b, t1))
        phases = _outside(phases, span)
        if busy is not None:
            for r in left_out:
                busy += _busy(records, r.start, r.stop)
    try:
        with open(tmp, "xt", buffering=1 << 20) as f:
            # the records' text is gathered and written a chunk at a time: a write call
            # per slice and flow costs more than making its text
            pieces: list = []
            write = pieces.append
            write('{"displayTimeUnit": "ns",\n "traceEvents": [\n')
            sep = ""
            for k, p0, p1, p_data, ts, cmd, tile, nbytes, peer in from_table(records, parts):
                if k is None:  # left-out repetitions: nothing in flight across them is drawn
                    sends.clear()
                    pending.clear()
                    continue
                n_rec += 1
                if not n_rec & (RECORD_CHUNK - 1):
                    f.write("".join(pieces))
                    pieces.clear()
                k.count += 1
                ends = k.ends
                lane = 0
                for end in ends:   # first lane free at p0 (module doc)
                    if end <= p0:
                        if p1 > end:
                            ends[lane] = p1
                        break
                    lane += 1
                else:
                    ends.append(p1)
                args, flow, tid = k.lanes[lane] if lane < len(k.lanes) else k.lane(lane)
                if peer is not None:  # a send, or the receive that takes it
                    (peer, kind), pe = peer, k.pe
                    if kind == "send":
                        sends.setdefault((pe, peer), deque()).append((pe, tid, ts))
                    elif kind == "recv" and sends.get((peer, pe)):
                        write(_link_flow(LINK_FLOW_BASE + n_links, sends[(peer, pe)].popleft(), (pe, tid, ts)))
                        n_links += 1
                dur = durs.get(p1 - p0)
                if dur is None:
                    if len(durs) > 4096:
                        durs.clear()
                    dur = durs[p1 - p0] = _us(p1 - p0)
                extra = "" if p_data is None else f',"t_data_us":{_us(p_data)}'
                if n_rec in critical:
                    extra += ',"critical":true'
                write(f'{sep}{k.head}{ts},"dur":{dur}{args}{cmd},"bytes":{nbytes},"tile":{tile}{extra}}}}}')
                sep = ",\n"
                if busy is not None:
                    b0 = p0 if p_data is None else p_data
                    if p1 > b0:
                        busy.append((k.pe, k.unit if peer is None else linked[k.unit][0], b0, p1))
                key = (k.pe, cmd)
                if k.role == _STAGE:
                    steps = pending.get(key)
                    if steps is None:  # a stage with no dispatch record before it
                        steps = pending[key] = [None]
                    steps.append((p0, tid, ts + flow))
                elif k.role == _DISPATCH:
                    pending[key] = [(p0, tid, ts + flow)]
                else:
                    steps = pending.pop(key, None) or [None]
                    chain = ([steps[0]] if steps[0] is not None else []) + [(p0, tid, ts + flow)] + sorted(steps[1:])
                    if len(chain) >= 2:
                        n_flows += 1
                        write(_flow(k.pe * FLOW_ID_STRIDE + int(cmd), [text for _, _, text in chain]))
            f.write("".join(pieces))
            write = f.write
            phase_lanes = _write_phases(write, phases, dumps)
            repeat_pes = _write_repeats(write, repeats, sections, dumps)
            for pe, t, w in power_counters(power, busy) if power is not None else ():
                write(',\n{"name":"power W","ph":"C","ts":%s,"pid":%d,"tid":%d,"args":{"W":%r}}'
                      % ("0" if t is None else _us(t), pe, POWER_TID, w))
            meta = []
            for pe in sorted({p for p, _ in lanes} | {p for p, _ in phase_lanes} | repeat_pes):
                meta.append({"name": "process_name", "ph": "M", "pid": pe, "tid": 0,
                             "args": {"name": f"PE{pe}"}})
                meta.append({"name": "process_sort_index", "ph": "M", "pid": pe, "tid": 0,
                             "args": {"sort_index": pe}})
            for (pe, unit), ends in sorted(lanes.items()):
                if unit in linked:
                    u0, arrow, peer = linked[unit]
                    base = f"{tracks.get(u0, str(u0))} {arrow} PE{peer}"
                else:
                    base = tracks.get(unit, str(unit))
                for lane in range(len(ends)):
                    tid = slots[unit] * LANE_STRIDE + lane + 1
                    meta.append({"name": "thread_name", "ph": "M", "pid": pe, "tid": tid,
                                 "args": {"name": base if lane == 0 else f"{base} ·{lane + 1}"}})
                    meta.append({"name": "thread_sort_index", "ph": "M", "pid": pe, "tid": tid,
                                 "args": {"sort_index": tid}})
            for (pe, lane) in sorted(phase_lanes):
                meta.append({"name": "thread_name", "ph": "M", "pid": pe, "tid": PHASE_TID + lane,
                             "args": {"name": "layer" if lane == 0 else f"layer ·{lane + 1}"}})
                meta.append({"name": "thread_sort_index", "ph": "M", "pid": pe, "tid": PHASE_TID + lane,
                             "args": {"sort_index": -100 + lane}})
            for pe in sorted(repeat_pes):
                meta.append({"name": "thread_name", "ph": "M", "pid": pe, "tid": REPEAT_TID,
                             "args": {"name": "repeated"}})
                meta.append({"name": "thread_sort_index", "ph": "M", "pid": pe, "tid": REPEAT_TID,
                             "args": {"sort_index": -200}})
            for ev in meta:
                write(sep + dumps(ev, ensure_ascii=False))
                sep = ",\n"
            other = {"source": final_name(source).removesuffix(".partial"), "generator": "kbframe.trace",
                     "time_unit": "us"}
            write("\n ],\n \"otherData\": " + dumps(other) + "}\n")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    slices: dict = {}
    for k in kinds.values():  # in order of each unit's first slice
        slices[k.unit] = slices.get(k.unit, 0) + k.count
    return {"slices": slices, "flows": n_flows, "link_flows": n_links,
            "lanes": {f"{u}@PE{p}": len(e) for (p, u), e in sorted(lanes.items())}}


def main(argv=None) -> int:
    """``python -m kbframe.report.trace [--power] OP_LOG [TRACE]``: (re)build a trace from an
    op_log; ``--power`` adds the power track from the run's metrics.json."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    power = "--power" in args
    args = [a for a in args if a != "--power"]
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m kbframe.report.trace [--power] RUN_DIR|op_log.jsonl [trace.json]")
        return 0 if args else 2
    dst = None
    try:
        src = op_log_file(args[0])
        dst = Path(args[1]) if len(args) > 1 else src.with_name("trace.json")
        metrics = src.with_name("metrics.json")  # the units' labels, as the run named its tracks
        m = _metrics(metrics)
        tracks = tracks_from_metrics(m) if m is not None else None
        if power and (m is None or "energy" not in m):
            raise ValueError(f"--power: {metrics} has no energy section (a run of a kbframe with energy tables)")
        info = write_trace(src, dst, tracks, power=power_from_metrics(m) if power else None)
    except (OSError, ValueError) as e:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) and e.filename is None and dst:
            e.filename = str(dst)  # a full disk's error names no file
        print(f"kbframe: error: {e}", file=sys.stderr)
        return 1
    print(f"{dst}: {sum(info['slices'].values())} slices, {info['flows']} flows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
