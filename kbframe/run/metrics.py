"""What a run reports: ``metrics.json`` from a finished simulation (:func:`run_metrics`) and
the console summary (:func:`summary`). Read by kbframe.run.bench, which writes them.
"""
from __future__ import annotations

from pathlib import Path

from ..report import critical_path, roofline
from . import energy, phases
from ..timebase import ps_to_ns


def _unit_metrics(pe, oplog, latency_ps) -> dict:
    """One PE's units in its order, each with the label it declares; "cpu" and "scheduler"
    are the op_log's names for PE_CPU's dispatches and PE_SCHEDULER's commands."""
    labels = {"cpu": pe.cpu.label, "scheduler": pe.scheduler.label,
              **{name: u.label for name, u in pe.stage_units.items()}}
    units = {}
    count, nbytes, busy_ps = oplog.count, oplog.bytes, oplog.busy_ps
    for name, label in labels.items():
        key = (pe.index, name)
        if key not in count:
            continue
        busy = busy_ps[key]
        units[name] = {"label": label, "busy_ns": ps_to_ns(busy),
                       "utilisation": busy / latency_ps if latency_ps else 0.0,
                       "count": count[key], "bytes": nbytes[key]}
    return units


def _hbm_ns(pe, oplog) -> float:
    """A PE's HBM bound: each DMA channel moves its bytes at its own bandwidth (reads and
    writes overlap), so the busiest channel's bytes / bandwidth."""
    return max([oplog.bytes[(pe.index, u.name)] / u.bandwidth_gbps
                for u in pe.units_serving("dma_read", "dma_write")] or [0.0])


def _used(engine, pe, oplog) -> list:
    """The PEs that logged records (``pe`` if none did)."""
    totals = oplog.pe_totals()
    return [p for p in engine.pes.built() if p.index in totals] or [pe]


def unit_labels(engine, pe, oplog) -> dict:
    """What of ``metrics.json`` names the units, ``units`` and ``pes[].units`` with their
    labels (kbframe.report.trace.tracks_from_metrics names trace.json's tracks by them),
    known before the critical path."""
    return {"units": _unit_metrics(pe, oplog, 0),
            "pes": [{"units": _unit_metrics(p, oplog, 0)} for p in _used(engine, pe, oplog)]}


def run_metrics(cfg, wl, engine, pe, oplog, latency_ps, cp: dict) -> dict:
    """``metrics.json`` of a finished simulation (README.md "What each run writes"); ``pe`` is
    the PE whose units ``units`` shows, ``cp`` the critical path's metrics."""
    lat_ns = ps_to_ns(latency_ps)
    totals = oplog.pe_totals()
    used = _used(engine, pe, oplog)
    # the bounds of a run on many PEs: the PEs work in parallel, so each bound is the
    # largest PE's (a lower bound the simulation obeys); shared HBM adds each cube's bytes
    # against the cube's bandwidth. On one PE they are that PE's.
    hbm_ns = max(_hbm_ns(p, oplog) for p in used)
    hbm_gbps = sum(max([u.bandwidth_gbps for u in p.units_serving("dma_read")] or [0.0]) for p in used)
    if engine.shared_hbm:
        cubes = {}
        for p in used:
            cubes[p.index // engine.ppc] = cubes.get(p.index // engine.ppc, 0) + sum(
                oplog.bytes[(p.index, u.name)] for u in p.units_serving("dma_read", "dma_write"))
        hbm_ns = max([hbm_ns] + [b / engine.cube_hbm_gbps for b in cubes.values()])
        hbm_gbps = min(hbm_gbps, len(cubes) * engine.cube_hbm_gbps)
    compute_ns = max(totals.get(p.index, {}).get("flops", 0) / (p.by_role["gemm"].peak_tflops * 1000.0)
                     for p in used)
    dispatch_ns = max(p.cpu.cycles / p.cpu.clock_ghz for p in used)
    bounds = {"hbm": hbm_ns, "compute": compute_ns, "dispatch": dispatch_ns}
    largest = max(bounds, key=bounds.get)
    commands = sum(p.cpu.n_commands for p in used)
    cycles = sum(p.cpu.cycles for p in used)
    n_stages = sum(c for (_, u), c in oplog.count.items() if u not in ("cpu", "scheduler"))
    n_units = wl.n_units()
    pes = [{"pe": p.index, "latency_ns": ps_to_ns(totals.get(p.index, {}).get("end_ps", 0)),
            "dispatch": {"commands": p.cpu.n_commands, "cycles": p.cpu.cycles},
            "hbm_ns": _hbm_ns(p, oplog), "tcm_peak_bytes": p.tcm.high_water,
            "units": _unit_metrics(p, oplog, latency_ps)} for p in used]
    slow = max(pes, key=lambda e: e["latency_ns"])
    fast = min(pes, key=lambda e: e["latency_ns"])
    links = [{"src": ln.src, "dst": ln.dst, "sends": ln.sent, "bytes": ln.bytes, "busy_ns": ps_to_ns(ln.busy_ps),
              "utilisation": ln.busy_ps / latency_ps if latency_ps else 0.0, "max_queued": ln.max_outstanding,
              "credits": ln.credits}
             for _, ln in sorted(engine.fabric.links.items()) if ln.sent]
    return {
        "bench": cfg.bench.name,
        "kernel": cfg.bench.kernel,
        "workload": type(wl).__name__,
        "shape": wl.shape(),
        "calibration": {"FIXED": cfg.calibration.FIXED, "R": cfg.calibration.R,
                        "cap_bytes": cfg.calibration.cap_bytes},
        # latency: from the kernel's launch to the last PE's end; launch_ns: the launch
        # cost's share (hardware.units.cpu.launch_ns, 0 unless declared)
        "sim": {"latency_ns": lat_ns, "events": oplog.n_records, "stages": n_stages,
                "wall_s": engine.wall_s, "launch_ns": max(ps_to_ns(p.cpu.launch_ps) for p in used)},
        # every PE's PE_CPU together, per unit of progress (KV tile, output block ...): keys
        # keep the name *_per_tile
        "dispatch": {"commands": commands, "cycles": cycles,
                     "unit": wl.unit, "n_units": n_units,
                     "commands_per_tile": commands / n_units,
                     "cycles_per_tile": cycles / n_units},
        # the bounds stay bounds; what binds is the critical path's kind
        "roofline": {"bound_ns": bounds[largest], "largest_bound": largest, "binding": cp["binding"],
                     "fraction": bounds[largest] / lat_ns if lat_ns else 0.0,
                     "hbm_ns": hbm_ns, "compute_ns": compute_ns, "dispatch_ns": dispatch_ns,
                     "hbm_bytes": oplog.hbm_bytes, "flops": oplog.flops,
                     # the GEMM flops simulated per ns of the latency, TFLOP/s
                     "achieved_tflops": oplog.flops / lat_ns / 1000.0 if lat_ns else 0.0},
        "units": _unit_metrics(pe, oplog, latency_ps),
        # peak_bytes: the most TCM any PE of the run held at once (a search's budget metric)
        "tcm": {"high_water_bytes": pe.tcm.high_water, "capacity_bytes": pe.tcm.capacity_bytes,
                "peak_bytes": max(p.tcm.high_water for p in engine.pes.built())},
        # many PEs: each PE's own figures, the spread of their ends, HBM bytes
        # against the bandwidth the PEs used together, and each PE→PE link
        "pes": pes,
        "pe_spread": {"n_pes": len(pes), "slowest_pe": slow["pe"], "slowest_ns": slow["latency_ns"],
                      "fastest_pe": fast["pe"], "fastest_ns": fast["latency_ns"],
                      "spread": (slow["latency_ns"] - fast["latency_ns"]) / slow["latency_ns"]
                      if slow["latency_ns"] else 0.0},
        "hbm": {"bytes": oplog.hbm_bytes, "gbps_used": hbm_gbps,
                "achieved_gbps": oplog.hbm_bytes / lat_ns if lat_ns else 0.0,
                "mode": "shared" if engine.shared_hbm else "partitioned"},
        "ipcq": {"links": links, "bytes": sum(ln["bytes"] for ln in links),
                 "sends": sum(ln["sends"] for ln in links)},
        "describe": wl.describe(),
        "critical_path": cp,
        # energy per action × the energy group's tables, and static power × latency (kbframe.run.energy)
        "energy": energy.run_energy(cfg.energy, used, oplog, str(cfg.bench.dtype), latency_ps, wl.unit, n_units,
                                    wl.tokens()),
    }


def summary(metrics: dict, out_dir: Path) -> str:
    """A short human summary of a run for the console."""
    d, r, n = metrics["dispatch"], metrics["roofline"], metrics["numerics"]
    unit = d.get("unit", "tile")
    lines = [
        f"kbframe {metrics['bench']}: {metrics.get('describe', '')}",
        f"  latency     {metrics['sim']['latency_ns']:.1f} ns simulated  ({metrics['sim']['events']} events, "
        f"{metrics['sim']['wall_s']:.2f} s wall)",
        f"  dispatch    {d['commands']} commands, {d['cycles']:.1f} cycles; per {unit} {d['commands_per_tile']:.2f} "
        f"commands, {d['cycles_per_tile']:.1f} cycles",
        f"  roofline    largest bound {r['largest_bound']} {r['bound_ns']:.1f} ns; achieved {r['fraction']:.1%} "
        f"of it; binding: {r['binding']}",
        f"  critical    {critical_path.summary_line(metrics['critical_path'])}",
    ]
    sp = metrics.get("pe_spread")
    if sp and sp["n_pes"] > 1:
        ends = (f"all end at {sp['slowest_ns']:.1f} ns" if sp["slowest_ns"] == sp["fastest_ns"] else
                f"slowest PE{sp['slowest_pe']} {sp['slowest_ns']:.1f} ns, fastest PE{sp['fastest_pe']} "
                f"{sp['fastest_ns']:.1f} ns (spread {sp['spread']:.1%})")
        lines.append(f"  PEs         {sp['n_pes']} used; {ends}; "
                     f"HBM {metrics['hbm']['bytes']:,} B at {metrics['hbm']['achieved_gbps']:.1f} of "
                     f"{metrics['hbm']['gbps_used']:.1f} GB/s ({metrics['hbm']['mode']})")
    q = metrics.get("ipcq")
    if q and q["links"]:
        busiest = max(q["links"], key=lambda ln: ln["busy_ns"])
        lines.append(f"  IPCQ        {len(q['links'])} links, {q['sends']:,} sends, {q['bytes']:,} B; busiest "
                     f"PE{busiest['src']}→PE{busiest['dst']} {busiest['busy_ns']:.1f} ns "
                     f"({busiest['utilisation']:.1%}), {busiest['max_queued']} of {busiest['credits']} credits")
    if "energy" in metrics:
        lines.append(energy.summary_line(metrics["energy"]))
    lines += phases.summary_lines(metrics)
    ff = metrics.get("fast_forward")
    if ff and ff["mode"] != "off" and not n["enabled"]:
        lines.append(f"  fast-fwd    {ff['note']}")
    lines += roofline.table_lines(metrics, indent="    ")
    if n["enabled"]:
        lines.append(f"  numerics    max_abs_err {n['max_abs_err']:.3g}, max_rel_err {n['max_rel_err']:.3g} "
                     f"vs float64 reference ({n['dtype']})")
    else:
        lines.append("  numerics    off (bench.data=false)")
    unused = metrics.get("inputs", {}).get("unused_keys")
    if unused:
        lines.append(f"  inputs      from {metrics['inputs']['path']}; unused: {', '.join(unused)}")
    lines.append(f"  files       {out_dir}/{{{', '.join(metrics['files'])}}}")
    form = metrics.get("op_log")
    if form:
        reps = [(form["times"], form["period"])] + [(t, m) for _, m, t in form.get("sections", [])]
        what = "; ".join(f"{t} periods of {m:,} records" for t, m in reps[:3])
        if len(reps) > 3:  # the one that leaves out the most records, and how many more
            t, m = max(reps, key=lambda r: (r[0] - 1) * r[1])
            what = f"{t} periods of {m:,} records, and {len(reps) - 1:,} more sections"
        elif len(reps) > 1:
            what = f"{len(reps)} sections: {what}"
        if form.get("nested"):
            what += f"; {form['nested']:,} more within their first periods"
        lines.append(f"  op_log      periodic: {form['records']:,} records in {form['lines']:,} lines "
                     f"({what}); python -m kbframe.report.oplog {out_dir} prints them all")
    return "\n".join(lines)
