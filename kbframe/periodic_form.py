"""The op_log's periodic form (a fast-forwarded run's, :attr:`kbframe.records.RecordTable.form`):
found in a table's records (:func:`find_periodic`), its header and ``repeat`` lines written
(:class:`Periodic`) and read back (:func:`periodic_header`, :func:`repeat_form`).

The form, as ``op_log.jsonl`` holds it: a first line ``{"op_log": "periodic", "records": N,
"prefix": A, "period": M, "times": R}``, the ``A`` records before the repeating part, one period's ``M`` records, a line
``{"repeat": {"records": M, "times": R - 1, "shift": {field: shift, ...}}}`` (the period
is repeated ``R - 1`` more times, the ``j``-th repetition shifted by ``j`` times each
field's shift: one integer, one per record of the period, or ``{"by_name": [[pe, unit,
op_kind, shift], ...]}``, one per record name; ``t_*_ns`` in ns; a record with no
``t_data_ns`` has none in any repetition), then the records after it. Expanding it gives
exactly the record-by-record file's records (:meth:`RecordTable.parse` expands it;
:mod:`kbframe.report.oplog` streams it).

A table may have several repeating sections, one after another (a fast-forwarded run whose
PEs each work through several items, each item's loop repeating). The header then names
the first section as above and the others in a list
``"sections": [[B, M, R], ...]``: ``B`` records after the previous section's repetitions,
then ``R`` repetitions of an ``M``-record period. Each section is written as the records
before it, its first period and its own ``repeat`` line; the records after the last
section's repetitions end the file. With one section there is no ``sections`` key.

A section's first period may itself hold repeating sections (nested: a period of layers
holds each layer's weight tiles and KV tiles, each repeating). Such a section is written
where it lies, as the records before it, its first period and a ``repeat`` line with a
``"depth"`` (1 within a section's first period, 2 within a nested one's, ...): its
repetitions are part of the enclosing first period, which the enclosing ``repeat`` line
repeats whole. The header then counts them, ``"nested": K``. A reader expands each
``repeat`` line where it stands: the ``records`` before it, repetitions included, repeat.

A foundation module, as kbframe.records: it knows the records' fields, not the table.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np

from .record_fields import FIELDS, N, SHIFTED, WRITTEN, ns_text
from .sorting import stable_order


@dataclass(frozen=True)
class Periodic:
    """A table's periodic form: records ``[prefix, prefix + period * times)`` are ``times``
    repetitions of the first ``period`` of them, repetition ``j`` shifted by ``j *
    shift`` (:attr:`shift`: per written field, ``(period,)`` int64, ps for times): its first
    repeating section; :attr:`rest` the others, after it; :attr:`inner` the sections
    repeating within its first period (nested)."""

    records: int
    prefix: int
    period: int
    times: int
    shift: dict
    #: the table's further repeating sections, in record order, each a :class:`Periodic`
    #: whose ``prefix`` is its first record's index (their own ``rest`` empty)
    rest: tuple = ()
    #: sections within records ``[prefix, prefix + period)``, in record order, ``prefix``
    #: their first record's index; each may hold its own (a layer's weight tiles within a
    #: period of layers)
    inner: tuple = ()

    @property
    def end(self) -> int:
        """The index after the last repeated record."""
        return self.prefix + self.period * self.times

    @property
    def sections(self) -> tuple:
        """Every repeating section, this one first."""
        return (self, *self.rest)

    @property
    def more(self) -> list:
        """The header's ``sections``: per further section ``[records before it since the
        previous section's repetitions, period, times]``."""
        return [[s.prefix - before.end, s.period, s.times] for before, s in zip(self.sections, self.rest)]

    @property
    def nested(self) -> int:
        """How many sections repeat within sections' first periods, at any depth (the
        header's ``nested``; one ``repeat`` line each)."""
        return sum(len(s.inner) + sum(i.nested for i in s.inner) for s in self.sections)

    def drawn(self) -> list:
        """Every section as the records hold it, in record order: the sections, and each
        one's inner sections within its first and its last repetition (the ones a reader
        of the written records sees; the repetitions between hold theirs too)."""
        return sorted(_placed(self.sections), key=lambda s: s.prefix)

    def inserted(self, at: int, period: int, extra: int) -> "Periodic | None":
        """This form with ``extra`` more periods of ``period`` records put in at record
        ``at`` (kbframe.repeated: the records from ``at`` on come that many periods later):
        the section whose repetitions run up to ``at`` or across it repeats ``extra *
        period`` records more, the sections after it start that much later; None when no
        section does with a window that divides ``period`` and that holds the period before
        ``at`` and a window more (the form of the longer table is then to be found in it).
        Each period put in repeats the one before ``at`` as that repeats the one before it,
        whose windows across their boundary the section holds, so its windows stay alike
        however few of them come after ``at``."""
        grow = [s for s in self.sections
                if s.prefix + period + s.period <= at <= s.end and period % s.period == 0]
        if len(grow) != 1:
            return None
        g, n = grow[0], extra * period

        def moved(s: Periodic) -> Periodic:
            if s is g:
                return replace(s, records=s.records + n, times=s.times + n // s.period, inner=tuple(map(moved, s.inner)))
            if s.prefix >= at:
                return replace(s, records=s.records + n, prefix=s.prefix + n, inner=tuple(map(moved, s.inner)))
            return replace(s, records=s.records + n, inner=tuple(map(moved, s.inner)))
        first = moved(self)
        return replace(first, rest=tuple(map(moved, self.rest)))

    def header(self) -> str:
        head = {"op_log": "periodic", "records": self.records, "prefix": self.prefix,
                "period": self.period, "times": self.times}
        if self.rest:
            head["sections"] = self.more
        if self.nested:
            head["nested"] = self.nested
        return json.dumps(head) + "\n"

    def repeat_line(self, codes: np.ndarray | None = None, names: list | None = None, depth: int = 0,
                    data: np.ndarray | None = None) -> str:
        """The ``repeat`` line: each field's shift, one integer when every record of the
        period shifts by it, else per record name (``{"by_name": [[pe, unit, op_kind, shift],
        ...]}``) when every record of a name shifts alike and that is shorter (``codes``: the
        period's name codes into ``names``), else one per record; times in ns
        (:func:`ns_text`). A nested section's line (``depth`` 1 or more) says its depth.
        ``data``: which records of the period have a data phase (the data phase's shift
        applies to those alone, so one integer says it when they all move alike)."""
        parts = []
        for f, key in SHIFTED.items():
            v = self.shift[f]
            if not v.any():
                continue
            if f == "td" and data is not None and data.any() and (v[data] == v[data][0]).all():
                v = np.full_like(v, v[data][0])
            fmt = ns_text if f in ("t0", "t1", "td") else str
            if (v == v[0]).all():
                parts.append(f'"{key}": ' + fmt(int(v[0])))
                continue
            by = _by_name(v, codes) if codes is not None else None
            if by is not None:
                parts.append(f'"{key}": {{"by_name": ['
                             + ", ".join(f"[{json.dumps(list(names[c]))[1:-1]}, {fmt(x)}]" for c, x in by) + "]}")
            else:
                parts.append(f'"{key}": [' + ", ".join(map(fmt, v.tolist())) + "]")
        nest = f'"depth": {depth}, ' if depth else ""
        return (f'{{"repeat": {{"records": {self.period}, "times": {self.times - 1}, {nest}'
                f'"shift": {{{", ".join(parts)}}}}}}}\n')


def _placed(sections) -> list:
    """``sections`` and, within the first and the last repetition of each, its inner ones
    (and theirs), each at its first record."""
    out = []
    for s in sections:
        out.append(s)
        for off in dict.fromkeys((0, s.period * (s.times - 1))):
            out += [replace(i, prefix=i.prefix + off) for i in _placed(s.inner)]
    return out


def _by_name(v: np.ndarray, codes: np.ndarray) -> list | None:
    """``[(name code, shift), ...]`` when every record of a name code shifts by one value
    ``v`` gives and the list is much shorter than ``v`` (else None)."""
    uc, first, inv = np.unique(codes, return_index=True, return_inverse=True)
    if len(uc) * 8 > len(v) or not (v[first][inv] == v).all():
        return None
    return list(zip(uc.tolist(), v[first].tolist()))


#: :func:`find_periodic` tries the given period and its parts ``period // k``, ``k`` up to this
#: (a run whose period works through ``k`` items, one after the other, repeats each item's
#: share of it: ``period // k`` records)
SPLITS = 8
#: at most this many repeating sections at one level (the table's, or one section's first period)
MAX_SECTIONS = 1024
#: window sizes tried besides the given period's parts: this many of the commonest distances
#: between a record and the next or next-but-one record of its name (a weight GEMV's tile on
#: every PE), found in the first :data:`SAMPLE` records of the part searched
CANDIDATES = 8
SAMPLE = 1 << 20
#: a section's first period of this many records or more is searched for sections of its own,
#: down to :data:`MAX_DEPTH` levels (a period of layers holds each layer's weight tiles and KV tiles)
NEST_FROM = 48
MAX_DEPTH = 4


def _windows_ok(cols: dict, m: int) -> np.ndarray:
    """``ok[i]``: record ``i + 2m`` minus record ``i + m`` equals record ``i + m`` minus record
    ``i`` in every written field (the name equal), one column at a time (``cols``: the
    written fields of the records searched)."""
    c = cols["name"]
    e = c[m:] == c[:-m]
    ok = e[m:] & e[:-m]
    c = cols["td"] < 0  # a data phase in all three or none (a repetition keeps "none")
    e = c[m:] == c[:-m]
    ok &= e[m:] & e[:-m]
    for f in SHIFTED:
        c = cols[f]
        d = c[m:] - c[:-m]
        ok &= d[m:] == d[:-m]
    return ok


def _distances(names: np.ndarray, lags: int = 2) -> list:
    """The :data:`CANDIDATES` commonest distances from a record to the next (and the
    next-but-one) record of its name code, commonest first, each at most a third of the
    records."""
    names = names[:SAMPLE]
    order = stable_order(names)
    sorted_names = names[order]
    ds = []
    for lag in range(1, lags + 1):
        same = sorted_names[lag:] == sorted_names[:-lag]
        ds.append((order[lag:] - order[:-lag])[same])
    d = np.concatenate(ds) if ds else np.zeros(0, dtype=np.int64)
    d = d[(d > 0) & (3 * d <= len(names))]
    if not len(d):
        return []
    vals, counts = np.unique(d, return_counts=True)
    top = np.argsort(-counts, kind="stable")[:CANDIDATES]
    return vals[top].tolist()


def _sections(cols: dict, sizes: list, min_times: int) -> list:
    """``(first record, window size, times)`` of the repeating sections of the records
    ``cols`` holds (:func:`find_periodic`), greedily, in record order."""
    n = len(cols["name"])
    runs = {}  # window size → (starts, ends) of the runs of i whose ok (_windows_ok) holds, long enough
    for m in dict.fromkeys(sizes):
        if m > 0 and n >= min_times * m:
            ok = _windows_ok(cols, m)
            edges = np.diff(np.concatenate(([0], ok.view(np.int8), [0])))
            starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
            keep = (ends - starts) // m + 2 >= min_times
            if keep.any():
                runs[m] = starts[keep], ends[keep]
    found = []
    while len(found) < MAX_SECTIONS:
        best = None
        for m, (starts, ends) in runs.items():
            keep = (ends - starts) // m + 2 >= min_times
            starts, ends = runs[m] = starts[keep], ends[keep]
            if not len(starts):
                continue
            times = (ends - starts) // m + 2
            i = int(np.lexsort((-starts, ends - starts, times))[-1])  # most windows, then longest, then first
            key = ((int(times[i]) - 1) * m, m, int(ends[i] - starts[i]), -int(starts[i]))
            if best is None or key > best[0]:  # most records left out, then the larger window
                best = (key, int(starts[i]), m, int(times[i]))
        if best is None:
            break
        _, a, m, times = best
        found.append((a, m, times))
        b = a + m * times  # records [a, b) taken: runs keep the i whose records i, i + w, i + 2w lie outside
        for w, (starts, ends) in runs.items():
            left, right = np.minimum(ends, a - 2 * w), np.maximum(starts, b)
            runs[w] = (np.concatenate((starts[left > starts], right[ends > right])),
                       np.concatenate((left[left > starts], ends[ends > right])))
    return sorted(found)


def _forms(cols: dict, lo: int, found: list, n: int, min_times: int, depth: int) -> list:
    """The :class:`Periodic` of each section ``found`` in records ``cols`` (the first at
    index ``lo`` of the table of ``n``), each with the sections of its first period."""
    forms = []
    for a, m, times in found:
        shift = {f: cols[f][a + m:a + 2 * m] - cols[f][a:a + m] for f in SHIFTED}
        inner = ()
        if m >= NEST_FROM and depth < MAX_DEPTH:
            part = {f: c[a:a + m] for f, c in cols.items()}
            sizes = [d for d in _distances(part["name"]) if d < m]
            inner = tuple(_forms(part, lo + a, _sections(part, sizes, min_times), n, min_times, depth + 1))
        forms.append(Periodic(n, lo + a, m, times, shift, inner=inner))
    return forms


def find_periodic(table, period: int, min_times: int = 3) -> Periodic | None:
    """The table's repeating sections: runs of windows of ``period`` records (or of a part
    ``period // k`` of it, :data:`SPLITS`, or of a size common in the records,
    :data:`CANDIDATES`), each window the one before shifted by the same amount per record
    (every written field, :data:`WRITTEN`; the name not at all), at least ``min_times``
    windows each, taken greedily: the run that leaves out the most records, then the same in
    the records no run holds yet, up to :data:`MAX_SECTIONS` (the given period's first, then
    the common sizes in the records between); within each section's first period the same,
    nested (:data:`NEST_FROM`). The first in record order, the others its
    :attr:`~Periodic.rest`; None when there is no such run. Its records need not come from
    any particular mechanism: the windows are found in the table (linear time a window size
    and a section, a column at a time)."""
    n = len(table)
    if not n:
        return None
    cols = {f: table.column(f) for f in WRITTEN}
    found = _sections(cols, [period // k for k in range(1, SPLITS + 1) if period > 0 and period % k == 0], min_times)
    at, gaps = 0, []  # then the records no section holds, with the sizes common in each
    for a, m, times in [*found, (n, 0, 0)]:
        if a - at >= NEST_FROM:
            part = {f: c[at:a] for f, c in cols.items()}
            gaps += [(at + b, w, t) for b, w, t in _sections(part, _distances(part["name"]), min_times)]
        at = a + m * times
    forms = _forms(cols, 0, sorted(found + gaps), n, min_times, 1)
    if not forms:
        return None
    return replace(forms[0], rest=tuple(forms[1:]))


def repeat_shift(repeat: dict, period: int, codes: np.ndarray | None = None, names: list | None = None) -> dict:
    """:attr:`Periodic.shift` from a ``repeat`` line's ``repeat`` object (its ``shift``: per
    field one integer, ``period`` of them, or ``{"by_name": [[pe, unit, op_kind, shift],
    ...]}`` looked up by the period's name ``codes`` into ``names``; times in ns). Raises
    ValueError or KeyError."""
    shift = {}
    unknown = set(repeat["shift"]) - set(SHIFTED.values())
    if unknown:
        raise ValueError(f"the repeat line shifts no field {sorted(unknown)[0]!r} "
                         f"(fields: {', '.join(SHIFTED.values())})")
    for f, key in SHIFTED.items():
        time = f in ("t0", "t1", "td")
        v = repeat["shift"].get(key, 0)
        if isinstance(v, dict):
            v = _by_name_shift(v, key, codes, names)
        elif not (_number(v) or (type(v) is list and all(map(_number, v)))):
            raise ValueError(f"the repeat line's shift of {key} must be a number, a list of numbers or "
                             f'{{"by_name": [...]}}')
        if not time and not all(float(x).is_integer() for x in (v if type(v) is list else [v])):
            raise ValueError(f"the repeat line's shift of {key} must be whole")
        v = np.asarray(v, dtype=np.float64 if time else np.int64)
        if time:
            if not np.isfinite(v).all() or (np.abs(v) > 2.0 ** 52 / 1000).any():
                raise ValueError(f"the repeat line's shift of {key} is not a finite time in ns")
            v = np.round(v * 1000)
        if v.ndim > 1 or (v.ndim == 1 and len(v) != period):
            raise ValueError(f"the repeat line's shift of {key} has {v.size} values, not 1 or {period}")
        if f in ("cmd", "t0", "t1", "td") and (v < 0).any():
            raise ValueError(f"the repeat line's shift of {key} is negative: a repetition comes after the one before")
        shift[f] = np.broadcast_to(v.astype(np.int64), (period,)).copy()
    return shift


def _number(v) -> bool:
    return type(v) in (int, float)


def _by_name_shift(v: dict, key: str, codes, names) -> list:
    """A shift given per record name: one value per record of the period."""
    if set(v) != {"by_name"} or type(v["by_name"]) is not list or codes is None:
        raise ValueError(f'the repeat line\'s shift of {key} must be a number, a list or {{"by_name": [...]}}')
    by = {}
    for e in v["by_name"]:
        if type(e) is not list or len(e) != 4 or type(e[0]) is not int or not _number(e[3]):
            raise ValueError(f"the repeat line's shift of {key} by name must list [pe, unit, op_kind, shift]")
        if by.setdefault(tuple(e[:3]), e[3]) != e[3]:
            raise ValueError(f"the repeat line's shift of {key} by name names pe {e[0]} {e[1]} {e[2]} twice")
    missing = [names[c] for c in dict.fromkeys(codes.tolist()) if names[c] not in by]
    if missing:
        raise ValueError(f"the repeat line's shift of {key} by name has no shift for pe {missing[0][0]} "
                         f"{missing[0][1]} {missing[0][2]}")
    return [by[names[c]] for c in codes.tolist()]


def shift_rows(form: Periodic, block: np.ndarray) -> np.ndarray:
    """``form``'s shift of the records of its first period ``block`` as an ``(period, 10)``
    row per record (zero where nothing moves; a record with no data phase keeps none)."""
    step = np.zeros((form.period, N), dtype=np.int64)
    for f in SHIFTED:
        step[:, FIELDS.index(f)] = form.shift[f]
    step[block[:, FIELDS.index("td")] < 0, FIELDS.index("td")] = 0
    return step


class Reading:
    """What reading a periodic op_log has taken so far (:meth:`kbframe.records.RecordTable.parse`
    and :mod:`kbframe.report.oplog` both read through one): its header (a dict, ``r``), its
    sections' forms, and the nested ones waiting for their section's ``repeat`` line.
    Raises ValueError, KeyError, TypeError (a malformed header)."""

    def __init__(self, r: dict):
        self.head = periodic_header(r)
        self.forms: list = []
        self.pending: list = []
        self.nested = 0

    def surplus(self, r: dict) -> bool:
        """Whether ``repeat`` line ``r`` would be a section's past the header's last."""
        return not r["repeat"].get("depth", 0) and len(self.forms) == len(self.head["sections"])

    def repeat(self, r: dict, seen: int, codes, names: list) -> tuple:
        """``(form, depth)`` of ``repeat`` line ``r`` after ``seen`` records (:func:`repeat_form`),
        with the nested forms its first period holds (:func:`adopt_nested`)."""
        depth = r["repeat"].get("depth", 0)
        form = repeat_form(r, self.head, seen, len(self.forms), codes, names)
        form = replace(form, inner=adopt_nested(self.pending, form, depth))
        if depth:
            self.pending.append((depth, form))
            self.nested += 1
        else:
            self.forms.append(form)
        return form, depth

    def finish(self, seen: int) -> Periodic:
        """The whole form, once ``seen`` records were read: every section's ``repeat`` line
        there, none nested left over, the counts the header's. Raises ValueError."""
        forms, want = self.forms, len(self.head["sections"])
        if len(forms) < want:
            raise ValueError("a periodic op_log with no repeat line" if not forms else
                             f"a periodic op_log with {len(forms)} of its {want} sections' repeat lines")
        if self.pending:
            raise ValueError("a nested repeat line after its section's repeat line")
        if seen != self.head["records"]:
            raise ValueError(f"a periodic op_log of {seen} records; its header says {self.head['records']}")
        if self.nested != self.head["nested"]:
            raise ValueError(f"a periodic op_log with {self.nested} nested repeat lines; its header says "
                             f"{self.head['nested']}")
        return replace(forms[0], rest=tuple(forms[1:]))


def adopt_nested(pending: list, form: Periodic, depth: int) -> tuple:
    """The nested forms a ``repeat`` line at ``depth`` takes as its :attr:`~Periodic.inner`:
    those of ``pending`` (``(depth, form)`` in line order) one level deeper, which come
    before it and lie in its first period; taken out of ``pending``. Raises ValueError
    when one does not lie there or a deeper one is left without its parent."""
    lo, hi = form.prefix, form.prefix + form.period
    mine = [f for d, f in pending if d == depth + 1]
    orphan = [d for d, _ in pending if d > depth + 1]
    if orphan:
        raise ValueError(f"a nested repeat line of depth {orphan[0]} before this one has no depth-{orphan[0] - 1} "
                         f"repeat line around it")
    if any(f.prefix < lo or f.end > hi for f in mine):
        raise ValueError(f"a nested repeat line of depth {depth + 1} before this one lies outside the first period "
                         f"this one repeats")
    pending[:] = [(d, f) for d, f in pending if d <= depth]
    return tuple(mine)


def periodic_header(r: dict) -> dict:
    """A periodic op_log's header line (a dict), checked: its ``records``, ``prefix``,
    ``period``, ``times`` and ``sections`` (if any) as ints that fit together; with
    ``"sections"``: per section (the first too) ``(first record's index, period, times,
    records before it since the previous section, written records before it)``. Raises
    ValueError, KeyError, TypeError."""
    if r.get("op_log") != "periodic":
        raise ValueError(f'the first line names op_log form {r.get("op_log")!r}, not "periodic"')
    head = {k: r[k] for k in ("records", "prefix", "period", "times")}
    head["nested"] = r.get("nested", 0)
    if any(type(v) is not int for v in head.values()) or head["nested"] < 0:
        raise ValueError("the header's records, prefix, period, times and nested must be integers (nested 0 or more)")
    more = r.get("sections", [])
    if "sections" in r and (type(more) is not list or not more or any(
            type(s) is not list or len(s) != 3 or any(type(v) is not int for v in s) for s in more)):
        raise ValueError("the header's sections must be a list of [records before, period, times] integer triples")
    secs, at, w = [], 0, 0
    for before, period, times in [(head["prefix"], head["period"], head["times"]), *more]:
        if before < 0 or period < 1 or times < 1:
            at = -1
            break
        secs.append((at + before, period, times, before, w + before))
        at += before + period * times
        w += before + period
    if at < 0 or at > head["records"]:
        raise ValueError(f"the header's counts do not fit together (records {head['records']}, prefix "
                         f"{head['prefix']}, period {head['period']}, times {head['times']}"
                         + (f", sections {more})" if more else ")"))
    head["sections"] = secs
    return head


def repeat_form(r: dict, head: dict, seen: int, k: int = 0, codes=None, names: list | None = None) -> Periodic:
    """The :class:`Periodic` form a ``repeat`` line (a dict) gives after ``seen`` records
    (repetitions of earlier lines included) of an op_log with header ``head``
    (:func:`periodic_header`): of section ``k``, or, with a ``depth``, of a section nested
    in section ``k``'s first period. ``codes(m)``: the name codes of the last ``m`` records
    (for a shift given per name, in ``names``). Raises ValueError, KeyError, TypeError,
    OverflowError."""
    rep = r["repeat"]
    if not isinstance(rep, dict) or not isinstance(rep.get("shift", {}), dict):
        raise ValueError('a repeat line is {"repeat": {"records": M, "times": R, "shift": {...}}}')
    depth, period, times = rep.get("depth", 0), rep.get("records"), rep.get("times")
    if any(type(v) is not int for v in (depth, period, times)):
        raise ValueError("a repeat line's records, times and depth must be integers")
    if k >= len(head["sections"]):
        raise ValueError("a nested repeat line after the last section's repeat line")
    prefix, p, t, before, _ = head["sections"][k]
    if depth:
        if depth < 1 or period < 1 or times < 1:
            raise ValueError("a nested repeat line's depth, records and times must be positive integers")
        first = seen - period
        if first < prefix or seen + period * times > prefix + p:
            raise ValueError(f"the nested repeat line's {period} records, {times} more times, do not lie in "
                             f"the first period of the section of {p} records from record {prefix}")
        return _in_range(Periodic(head["records"], first, period, times + 1,
                                  repeat_shift(rep, period, codes(period) if codes else None, names)))
    if period != p or times != t - 1 or seen != prefix + p:
        raise ValueError(f"the repeat line does not follow the header's {before} + {p} "
                         f"records, {t} times")
    return _in_range(Periodic(head["records"], prefix, p, t, repeat_shift(rep, p, codes(p) if codes else None, names)))


def _in_range(form: Periodic) -> Periodic:
    """``form``, its repetitions' values checked to stay within 2^62 (int64, with room for
    the values they shift). Raises ValueError."""
    for f, key in SHIFTED.items():
        if int(np.abs(form.shift[f]).max(initial=0)) * (form.times - 1) >= 1 << 62:
            raise ValueError(f"the repeat line's shift of {key}, {form.times - 1} times, passes 2^62")
    return form
