"""What each phase of a kernel cost: the spans, busy times, bounds and critical-path time
of the command groups a kernel names with ``tl.phase`` (like NVTX ranges), and the
simulated time of its collectives against their α-β model (DESIGN.md decisions 10, 12).

A phase *occurrence* is the commands one PE dispatched inside one ``with tl.phase(...)``;
the occurrences of the same name and ``layer`` on the PEs of a run (the k-th of each) are
one *group*: its span runs from its first stage's start on any PE to its last stage's end.
Phases may overlap in time (PE_CPU runs ahead, DMA overlaps compute), so shares need not
add up to 100 %; the critical-path time of each phase does add up to the path's length.

A group's busy time per resource (``hbm``: DMA data phases, ``gemm``, ``math``, ``link``:
IPCQ sends, ``dispatch``: PE_CPU), counted within the span of each PE's occurrence (PE_CPU
dispatches ahead), is its busiest PE's; its bound is the largest of them
and it is bound by that resource when its busy time fills ≥ 95 % of the span (the
critical path's rule), else by its ``chain``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError, HbmCapacityError
from ..record_fields import FIELDS, N
from ..records import label_codes
from ..report.critical_path import Path, Repeat
from ..report.record_columns import LastOf, Records
from ..sim.waits import WaitLog
from ..timebase import ps_to_ns

#: unit role → the resource it stands for in a phase's busy times
RESOURCE = {"dma_read": "hbm", "dma_write": "hbm", "gemm": "gemm", "math": "math", "ipcq_send": "link"}
RESOURCES = ("hbm", "gemm", "math", "link", "dispatch")
_CMD = FIELDS.index("cmd")
BINDS = 0.95


def _resources(roles: dict) -> dict:
    """``{op_log unit name: resource}`` from ``{unit name: roles}``; PE_CPU is ``dispatch``."""
    out = {"cpu": "dispatch"}
    for name, rs in roles.items():
        for r in rs:
            if r in RESOURCE:
                out[name] = RESOURCE[r]
                break
    return out


class Repeated(NamedTuple):
    """A run made of its simulated records and a period of its layers put back ``X`` times
    (kbframe.repeated.RepeatedTable ``table``): the simulated run's ``phases`` (the full
    run's are these with the period's put back, kbframe.run.skipped), per PE that jumped
    the period's first command id ``lo`` in the simulated run and its commands ``per``
    period, and the simulated records as columns (``rows``; read from ``table`` when None)."""

    table: Any
    phases: dict
    lo: dict
    per: dict
    rows: Any = None  # the simulated records as columns, if known (kbframe.report.record_columns.Records)


def _occurrences(phases: dict) -> list:
    """Every occurrence, PE by PE: ``(pe, name, layer, info, group key, last command)``."""
    table, seen = [], {}
    for p, ph in sorted(phases.items()):
        for name, first, last, info in ph:
            k = (name, info.get("layer"))
            seen[(p, k)] = seen.get((p, k), -1) + 1
            table.append((p, name, info.get("layer"), info, (k, seen[(p, k)]), last))
    return table


def _stats(phases: dict, rows, res: dict) -> tuple:
    """Per occurrence of ``phases`` (:func:`_occurrences` order), from the records ``rows``:
    its first stage's start and last stage's end (ps; -1: none), its busy ps per resource
    within them, and each record's occurrence (-1: none); the commands' ends ``{(pe, cmd):
    ps}``; the IPCQ send time of each record (0 but sends). Also the records' PEs."""
    pe = np.asarray(rows.pe, dtype=np.int64)
    cmd = np.asarray(rows.cmd, dtype=np.int64)
    t0 = np.asarray(rows.t0, dtype=np.int64)
    t1 = np.asarray(rows.t1, dtype=np.int64)
    td = np.asarray(rows.td, dtype=np.int64)
    codes, values = label_codes(rows.unit)
    names = sorted(values)
    code = {u: i for i, u in enumerate(names)}
    ucode = np.asarray([code[u] for u in values], dtype=np.int64)[codes]
    sched = code.get("scheduler", -1)
    res_of = np.asarray([RESOURCES.index(res[u]) if u in res else -1 for u in names], dtype=np.int64)[ucode]
    stage = (res_of >= 0) & (res_of != RESOURCES.index("dispatch"))
    occ = _occ_of(phases, pe, cmd)
    n = sum(len(ph) for ph in phases.values())
    big = np.iinfo(np.int64).max
    start = np.full(n, big, dtype=np.int64)
    end = np.full(n, -1, dtype=np.int64)
    m = (occ >= 0) & stage
    np.minimum.at(start, occ[m], t0[m])
    np.maximum.at(end, occ[m], t1[m])
    busy = np.zeros((n, len(RESOURCES)), dtype=np.int64)
    m = (occ >= 0) & (res_of >= 0)
    b0 = np.where(td >= 0, np.maximum(t0, td), t0)  # a DMA's data phase; others whole
    work = t1 - b0
    o = occ[m]
    live = end[o] >= 0  # within the occurrence's span (PE_CPU dispatches ahead of it)
    inside = np.clip(np.minimum(t1[m], end[o]) - np.maximum(b0[m], start[o]), 0, None)
    np.add.at(busy, (o[live], res_of[m][live]), inside[live])
    at = np.nonzero(ucode == sched)[0]
    done = _Done(LastOf(pe[at], cmd[at], at), t1)  # command ends, for the collectives
    link = np.where(res_of == RESOURCES.index("link"), work, 0)
    return start, end, busy, occ, done, link, pe


def _repeated_stats(rep: Repeated, phases: dict, res: dict, segments: Path) -> tuple | None:
    """:func:`_stats` of the full run ``phases`` from its simulated records (``rep``): an
    occurrence of the period before the jump again ``X`` times a period later each, the
    later ones ``X`` periods later; a command's end likewise. The path's records are
    looked up in the full run. None when an occurrence spans the jump."""
    t = rep.table
    X, dt = t.X, t.dt
    start, end, busy, _, done, link, pe = _stats(rep.phases, rep.rows if rep.rows is not None
                                                 else _records(t.simulated()), res)
    parts, at = [], 0
    for p, ph in sorted(rep.phases.items()):
        if not ph:
            continue
        idx = np.arange(at, at + len(ph))
        at += len(ph)
        if p not in rep.lo:
            parts.append((idx, 0))
            continue
        lo, hi = rep.lo[p], rep.lo[p] + rep.per[p]
        first = np.array([e[1] for e in ph])
        last = np.array([e[2] for e in ph])
        inside = (lo <= first) & (last < hi)
        if ((first < hi) & (last >= hi)).any():
            return None
        parts.append((idx[first < hi], 0))
        parts += [(idx[inside], k * dt) for k in range(1, X + 1)]
        parts.append((idx[first >= hi], X * dt))
    order = np.concatenate([i for i, _ in parts]) if parts else np.zeros(0, dtype=np.int64)
    later = np.concatenate([np.full(len(i), d, dtype=np.int64) for i, d in parts]) if parts else order
    live = end[order] >= 0  # an occurrence with stages (else its start and end say none)
    f_start = np.where(live, start[order] + later, start[order])
    f_end = np.where(live, end[order] + later, end[order])
    if len(f_start) != sum(len(ph) for ph in phases.values()):
        return None
    full_done = _CommandEnds(done, rep.lo, rep.per, X, dt)
    w = Repeat(t.x, t.P, X, dt).weights(len(link))  # a send of the period counts X times more
    # each segment's record: its occurrence in the full run (-1: none)
    on = segments.rec >= 0
    path = t.rows_at(segments.rec[on]) if on.any() else np.zeros((0, N), dtype=np.int64)
    occ_on = np.full(len(segments), -1, dtype=np.int64)
    occ_on[on] = _occ_of(phases, np.array(t.name_col(0), dtype=np.int64)[path[:, 0]], path[:, _CMD])
    return f_start, f_end, busy[order], occ_on, full_done, link * w, pe


class _Done:
    """``{(pe, cmd): end ps}`` of the commands of some records (their PE_SCHEDULER record's
    end), a mapping's ``get``; a command id None has none."""

    def __init__(self, last: LastOf, t1: np.ndarray):
        self.last, self.t1 = last, t1

    def get(self, key, default=None):
        j = self.last.get(key) if key[1] is not None else None
        return default if j is None else int(self.t1[j])


class _CommandEnds:
    """``{(pe, cmd): end ps}`` of the full run's commands from the simulated run's ``done``
    (a mapping's ``get``): those of the period's commands again a period later each, the
    later ones ``X`` periods later (their ids moved by the period's commands ``per``)."""

    def __init__(self, done: _Done, lo: dict, per: dict, X: int, dt: int):
        self.done, self.lo, self.per, self.X, self.dt = done, lo, per, X, dt

    def get(self, key, default=None):
        q, c = key
        if c is None or q not in self.lo or c < self.lo[q]:
            return self.done.get(key, default)
        k = min((c - self.lo[q]) // self.per[q], self.X)  # its period's command in the simulated run, k periods on
        v = self.done.get((q, c - k * self.per[q]))
        return default if v is None else v + k * self.dt


def _records(table):
    """The records of ``table`` as columns, without what they waited for."""
    return Records(*WaitLog(table).columns(waits=False))


def _occ_of(phases: dict, pe: np.ndarray, cmd: np.ndarray) -> np.ndarray:
    """Each record's occurrence (-1: none): per PE, the phase whose id range holds its
    command (from its PE and command)."""
    occ = np.full(len(pe), -1, dtype=np.int64)
    base = 0
    for p, ph in sorted(phases.items()):
        if not ph:
            continue
        firsts = np.asarray([f for _, f, _, _ in ph], dtype=np.int64)
        lasts = np.asarray([e for _, _, e, _ in ph], dtype=np.int64)
        at = np.nonzero(pe == p)[0]
        i = np.searchsorted(firsts, cmd[at], side="right") - 1
        ok = (i >= 0) & (cmd[at] <= lasts[np.maximum(i, 0)])
        occ[at[ok]] = base + i[ok]
        base += len(ph)
    return occ


def analyse(phases: dict, rows, segments, latency_ps: int, roles: dict, hbm_gbps: float = 0.0,
            peak_tflops: float = 0.0, repeated: Repeated | None = None) -> tuple[dict, list]:
    """``(metrics, trace slices)`` of a run's phases, or ``({}, [])`` when it named none.

    Args:
        phases: ``{pe: [(name, first cmd, last cmd, info), ...]}`` (``TL.phases``).
        rows: the run's records (kbframe.report.record_columns.Records); unused with
            ``repeated``.
        segments: its critical path (``CriticalPath.segments``: a :class:`~kbframe.report.critical_path.Path`
            or a list of segments).
        roles: ``{op_log unit name: roles}`` of the PEs' units.
        hbm_gbps, peak_tflops: one PE's HBM bandwidth (its share, when the PEs share it)
            and GEMM peak, for the analytic estimate: a phase whose info gives
            ``hbm_bytes`` and ``flops`` takes ``max(hbm_bytes / hbm_gbps, flops / peak)``
            on its busiest PE, a collective its ``model_ps`` (GenZ / LLM-Viewer style:
            no dispatch, no chains, every transfer at full bandwidth).
        repeated: the run is its simulated records with a period of layers put back
            (:class:`Repeated`): the figures are made from those.
    Returns:
        metrics: ``phases`` (``layers_ns``: each layer's latency, :func:`_layer_latencies`;
        ``by_phase``: per name its ``count``, ``span_ns``, ``per_layer_ns``, ``share``, ``busy_ns`` per resource,
        ``bound_ns``, ``binding``, ``critical_path_ns``, ``analytic_ns`` (None when its
        phases give no costs); ``analytic_ns``: their sum; ``critical_path_other_ns``: path
        time on no phase's record; ``link_bound_ns``: the busiest PE's IPCQ send time, the
        links' roofline bound beside ``roofline``'s HBM, compute and dispatch) and ``collectives`` (each group
        with ``collective`` info: ``algorithm``, ``pes``, ``bytes``, ``ns`` from the last
        partial's end to the last PE's last command's end, ``model_ns``).
        slices: ``(pe, name, t0_ps, t1_ps, layer)`` per occurrence, for the trace.
    """
    if not any(phases.values()):
        return {}, []
    res = _resources(roles)
    table = _occurrences(phases)
    n = len(table)
    segments = Path.of(segments)
    made = _repeated_stats(repeated, phases, res, segments) if repeated is not None else None
    if made is not None:
        start, end, busy, occ_on, done, link, pe = made
    else:
        if repeated is not None:  # an occurrence spans the jump: the full run's records
            rows = _records(repeated.table)
        start, end, busy, occ, done, link, pe = _stats(phases, rows, res)
        occ_on = np.where(segments.rec >= 0, occ[np.maximum(segments.rec, 0)], -1) if len(occ) else \
            np.full(len(segments), -1, dtype=np.int64)
    # the critical path's time per occurrence
    on_path = np.zeros(n + 1, dtype=np.int64)  # [n]: time on no phase's record
    np.add.at(on_path, np.where(occ_on >= 0, occ_on, n), segments.dur)

    groups: dict = {}
    for j, (p, name, layer, info, key, _) in enumerate(table):
        groups.setdefault(key, []).append(j)
    by_phase: dict = {}
    layers: dict = {}
    collectives = []
    slices = []
    for key, js in groups.items():
        name, layer = key[0]
        live = [j for j in js if end[j] >= 0]
        g0 = min((int(start[j]) for j in live), default=0)
        g1 = max((int(end[j]) for j in live), default=0)
        span = g1 - g0
        gbusy = busy[js].max(axis=0) if js else np.zeros(len(RESOURCES), dtype=np.int64)
        e = by_phase.setdefault(name, {"phase": name, "count": 0, "span_ps": 0, "busy": np.zeros(len(RESOURCES), np.int64),
                                       "critical_ps": 0})
        e["count"] += 1
        e["span_ps"] += span
        e["busy"] += gbusy
        e["critical_ps"] += int(on_path[js].sum())
        if layer is not None and live:
            lo, hi = layers.get(layer, (g0, g1))
            layers[layer] = (min(lo, g0), max(hi, g1))
        for j in live:
            slices.append((table[j][0], name, int(start[j]), int(end[j]), layer))
        info = table[js[0]][3]
        e["analytic_ps"] = _add(e.get("analytic_ps", 0), max((_analytic(table[j][3], hbm_gbps, peak_tflops)
                                                              for j in js), key=lambda v: -1 if v is None else v))
        if info.get("collective"):
            ready = [done.get((table[j][0], table[j][3].get("after")), 0) for j in js]
            last = [done.get((table[j][0], table[j][5]), 0) for j in js]
            collectives.append({"collective": info["collective"], "phase": name, "layer": layer,
                                "algorithm": info.get("algorithm"), "pes": info.get("pes"),
                                "bytes": info.get("bytes"), "ns": ps_to_ns(max(last) - max(ready)),
                                "model_ns": ps_to_ns(int(info.get("model_ps", 0)))})
    n_layers = max(1, len(layers))
    out = []
    for e in by_phase.values():
        b = {r: ps_to_ns(int(v)) for r, v in zip(RESOURCES, e["busy"])}
        top = max(b, key=b.get)
        span_ns = ps_to_ns(e["span_ps"])
        out.append({"phase": e["phase"], "count": e["count"], "span_ns": span_ns,
                    "per_layer_ns": span_ns / n_layers, "share": e["span_ps"] / latency_ps if latency_ps else 0.0,
                    "busy_ns": b, "bound_ns": b[top],
                    "binding": top if span_ns and b[top] >= BINDS * span_ns else "chain",
                    "critical_path_ns": ps_to_ns(e["critical_ps"]),
                    "analytic_ns": None if e["analytic_ps"] is None else ps_to_ns(round(e["analytic_ps"]))})
    sends = link > 0  # the links' bound: the busiest PE's IPCQ sends
    link_ps = int(np.bincount(pe[sends], weights=link[sends]).max()) if sends.any() else 0
    metrics = {"phases": {"layers_ns": _layer_latencies(layers),
                          "by_phase": out, "critical_path_other_ns": ps_to_ns(int(on_path[n])),
                          "link_bound_ns": ps_to_ns(link_ps),
                          "analytic_ns": None if any(e["analytic_ns"] is None for e in out)
                          else round(sum(e["analytic_ns"] for e in out), 3)}}
    if collectives:
        metrics["collectives"] = collectives
    return metrics, slices


def _layer_latencies(layers: dict) -> list:
    """Each layer's latency, ns, from ``{layer: (first start, last end)}`` ps: from the end of
    the layer before it (the first layer: from its own start) to its end. Spans overlap where
    PE_CPU dispatches a layer's first commands (its norm weights' load) while the layer before
    still runs (one PE: no all-reduce holds it back); these do not, and add up to the
    latency of the layers."""
    out, prev = [], None
    for _, (lo, hi) in sorted(layers.items()):
        out.append(ps_to_ns(hi - (lo if prev is None else prev)))
        prev = hi
    return out


def _analytic(info: dict, hbm_gbps: float, peak_tflops: float):
    """One occurrence's analytic time, ps (None: its info gives no costs)."""
    if "model_ps" in info:
        return float(info["model_ps"])
    if "hbm_bytes" not in info or not hbm_gbps or not peak_tflops:
        return None
    return max(info["hbm_bytes"] / hbm_gbps, info.get("flops", 0) / (peak_tflops * 1000.0)) * 1000.0


def _add(a, b):
    return None if a is None or b is None else a + b


def step(metrics: dict, tokens: int, model_layers: int | None = None, refused: ConfigError | None = None) -> dict:
    """``metrics.json`` ``step`` of a model's decode step making ``tokens`` tokens (one per
    sequence): its latency, ``tokens_per_s``, layers, per-layer latency, each phase's share
    and binding, what binds the step and the analytic estimate beside it.

    ``model_layers``: the model's layer count when the run simulates fewer: ``step.model``
    then estimates the whole step as the run's latency plus the last layer's latency (from
    the end of the layer before it; one layer: its span) for each layer not simulated, with
    its tokens/s: the layers repeat, so this is close when a layer is long against what
    links two (1.6·10⁻⁵ for Llama-3-70B at 8192 tokens on cube_mesh, 2.4 % for a 7.6 µs
    test layer from one layer, exact from two; docs/decoder_layer.md). ``refused``: why the whole model
    would not fit (kbframe.run.preflight.model_refusal): ``step.model`` then says so
    (``refused``; an HBM over its capacity also as ``hbm_need_bytes`` and ``hbm_bytes``) and
    estimates nothing (its latency and tokens/s None)."""
    lat = metrics["sim"]["latency_ns"]
    ph = metrics.get("phases", {})
    layers = ph.get("layers_ns", [])
    out = {"latency_ns": lat, "tokens": tokens, "tokens_per_s": tokens / lat * 1e9 if lat else 0.0,
           "layers": len(layers), "layer_ns": sum(layers) / len(layers) if layers else None,
           "binding": metrics["roofline"]["binding"],
           "analytic_ns": ph.get("analytic_ns"),
           "phases": [{k: e[k] for k in ("phase", "per_layer_ns", "share", "critical_path_ns", "binding",
                                         "analytic_ns")} for e in ph.get("by_phase", [])]}
    if not (model_layers and layers and model_layers > len(layers)):
        return out
    if refused:
        out["model"] = {"layers": model_layers, "latency_ns": None, "tokens_per_s": None, "refused": str(refused)}
        if isinstance(refused, HbmCapacityError):
            out["model"].update(hbm_need_bytes=refused.need_bytes, hbm_bytes=refused.have_bytes)
    else:
        est = lat + (model_layers - len(layers)) * layers[-1]
        out["model"] = {"layers": model_layers, "latency_ns": est, "tokens_per_s": tokens / est * 1e9,
                        "estimated": f"{len(layers)} simulated layer(s) and {model_layers - len(layers)} more of "
                                     f"the last one's latency"}
    return out


def summary_lines(metrics: dict) -> list[str]:
    """The console's ``phases`` and ``all-reduce`` lines (empty when the run named no phases)."""
    ph = metrics.get("phases")
    if not ph:
        return []
    lat = metrics["sim"]["latency_ns"]
    layers = ph["layers_ns"]
    rows = sorted(ph["by_phase"], key=lambda e: -e["critical_path_ns"])
    parts = [f"{e['phase']} {e['per_layer_ns'] / 1000:.2f} µs {e['binding']} (path {e['critical_path_ns'] / lat:.0%})"
             if lat else e["phase"] for e in rows if e["critical_path_ns"] or e["span_ns"]]
    lines = []
    st = metrics.get("step")
    if st:
        an = f"; analytic {st['analytic_ns'] / 1000:.2f} µs" if st["analytic_ns"] else ""
        lines.append(f"  step        {st['latency_ns'] / 1000:.2f} µs for {st['tokens']} token(s) over "
                     f"{st['layers']} layer(s): {st['tokens_per_s']:,.0f} tokens/s, binding {st['binding']}{an}")
        mo = st.get("model")
        if mo and mo.get("refused"):
            why = (f"{mo['hbm_need_bytes'] / 2 ** 30:.3g} GiB of HBM needed, {mo['hbm_bytes'] / 2 ** 30:.3g} GiB there"
                   if "hbm_bytes" in mo else mo["refused"])
            lines.append(f"  model       not estimated: the model's {mo['layers']} layers would not fit ({why}; "
                         f"metrics.json step.model.refused)")
        elif mo:
            lines.append(f"  model       {mo['latency_ns'] / 1e6:.3f} ms, {mo['tokens_per_s']:,.1f} tokens/s for the "
                         f"model's {mo['layers']} layers, estimated ({mo['estimated']})")
    if layers:
        lines.append(f"  layer       {sum(layers) / len(layers) / 1000:.2f} µs per layer ({len(layers)} layer"
                     f"{'s' if len(layers) != 1 else ''}); by critical-path time: " + ", ".join(parts[:6])
                     + (f" (+{len(parts) - 6} more in metrics.json phases)" if len(parts) > 6 else ""))
    coll = metrics.get("collectives")
    if coll:
        c = coll[0]
        ns = [x["ns"] for x in coll]
        lines.append(f"  all-reduce  {len(coll)} × {c['algorithm']} over {len(c['pes'])} PEs, {c['bytes']:,} B each: "
                     f"{min(ns):.1f}–{max(ns):.1f} ns simulated, α-β model {c['model_ns']:.1f} ns")
    return lines
