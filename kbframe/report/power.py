"""The power counter track of ``trace.json`` (``run.power_track``): each PE's watts over
time, from ``metrics.json`` ``energy`` (kbframe.run.energy) and the records' busy spans.
At every instant a unit starts or ends being busy the PE draws its static power plus, for
each busy unit, the unit's energy spread evenly over its busy time, so the track's area is
the PE's energy; kbframe.report.trace writes the counters."""
from __future__ import annotations

#: the tid of a PE's power counter track
POWER_TID = 0


def power_from_metrics(metrics: dict) -> dict:
    """What the power track needs (:func:`write_trace`'s ``power``), from ``metrics.json``
    ``energy`` (kbframe.run.energy): per PE ``{"units": {op_log unit: its dynamic pJ with
    its share of the TCM's}, "static_w": W, "latency_ns": the run's}``. The op_log names
    the records of the units serving ``dispatch`` and ``admission`` ``cpu`` and
    ``scheduler``; the TCM has no records, its energy is drawn on its traffic's units."""
    lat_ns = metrics["sim"]["latency_ns"]
    out = {}
    for pe in metrics["energy"]["by_unit"]:
        units = {}
        for name, u in pe["units"].items():
            if u["role"] != "tcm":
                log = {"dispatch": "cpu", "admission": "scheduler"}.get(u["role"], name)
                units[log] = u["dynamic_pj"] + u.get("tcm_pj", 0.0)
        out[pe["pe"]] = {"units": units, "static_w": pe["static_pj"] / lat_ns * 1e-3 if lat_ns else 0.0,
                         "latency_ns": lat_ns}
    return out


def power_counters(power: dict, busy: list):
    """``(pe, t_ps, W)`` counter values of each PE's track, in PE then time order; ``t_ps``
    None for the first (at 0: static power and the units never busy, spread over the run).

    Args:
        power: :func:`power_from_metrics`'s dict.
        busy: ``(pe, op_log unit, t0_ps, t1_ps)`` of each record's busy time.
    W at an instant: static W plus each busy unit's pJ / busy ps (= W) times its records
    busy then (counted, so no sum drifts)."""
    total: dict = {}
    for pe, unit, t0, t1 in busy:
        total[(pe, unit)] = total.get((pe, unit), 0) + (t1 - t0)
    watts = {key: power[key[0]]["units"].get(key[1], 0.0) / ps for key, ps in total.items()
             if key[0] in power and ps}
    edges: dict = {}
    for pe, unit, t0, t1 in busy:
        if (pe, unit) in watts:
            per = edges.setdefault(pe, {})
            per.setdefault(t0, []).append((unit, 1))
            per.setdefault(t1, []).append((unit, -1))
    for pe in sorted(power):
        lat_ps = power[pe]["latency_ns"] * 1000
        static = power[pe]["static_w"] + sum(  # units never busy: their energy over the run
            pj / lat_ps for u, pj in sorted(power[pe]["units"].items()) if pj and (pe, u) not in watts and lat_ps)
        yield pe, None, static
        active: dict = {}
        for t in sorted(edges.get(pe, {})):
            for unit, d in edges[pe][t]:
                active[unit] = active.get(unit, 0) + d
            yield pe, t, static + sum(n * watts[(pe, u)] for u, n in sorted(active.items()) if n)
