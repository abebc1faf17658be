"""Energy of a finished run (DESIGN.md decision 15; Accelergy's per-action tables): each
unit's actions, counted from the run's records by the unit's own rule
(:meth:`kbframe.hw.unit.PeUnit.energy_actions`), times the ``energy`` config group's table
for the unit's role, plus each unit's static power over the run's latency.

Units: energies in pJ, latencies in ns, power in W; ``static_mw × latency_ns`` is pJ.

The table of a unit is ``energy.<role>`` (``<role>``: the unit's first role). It holds the
keys the unit declares (``energy_keys``) and ``static_mw``; the TCM's actions are the bytes
the PE's other units read and write there (their ``tcm_traffic``). Nothing here touches
timing: energy is computed from the op_log's totals after the simulation, so a
fast-forwarded run (whose totals are extrapolated exactly) has the full simulation's
energy.

Order of the sums (so an independent recomputation gets the same floats): per PE in index
order, per unit in config order, per action in the order the unit lists them; a unit's
pJ is its dynamic then its static; the run's totals add the PEs in order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..timebase import ps_to_ns

#: bytes of an element of each timing dtype (``bench.dtype``)
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@dataclass
class Work:
    """What one unit did in a run, from its op_log totals: ``count`` records, ``bytes``
    (moved or read; a dispatch's logical bytes), ``flops``, ``kinds`` (``{op_kind:
    (stages, elements)}``), the run's ``dtype`` and its ``itemsize`` (bytes), and for the
    TCM the bytes the PE's other units read and wrote there."""

    count: int = 0
    bytes: int = 0
    flops: int = 0
    kinds: dict = field(default_factory=dict)
    dtype: str = "float16"
    itemsize: int = 2
    tcm_read_bytes: int = 0
    tcm_write_bytes: int = 0


def _role(unit) -> str:
    return unit.roles[0] if unit.roles else ""


#: the largest energy value taken: 10¹² pJ (a joule) per action, or 10¹² mW static; far above
#: any unit's, and small enough that a run's totals and EDP stay finite
MAX_VALUE = 1e12
_WHAT_MAX = {False: "a joule per action", True: "a gigawatt"}


def check(energy, units: dict) -> None:
    """Refuse, before a run, an energy table the hardware cannot be charged by: a unit with
    no energy rule, a role with no table, a key missing or unknown, a value that is not a
    finite number ≥ 0, or one over :data:`MAX_VALUE`.

    Args:
        energy: the ``energy`` config node (kbframe.run.schema.EnergyConfig).
        units: one PE's units by config name (kbframe.sim.engine.build_units).
    Raises:
        ConfigError: names the unit, the key and the limit.
    """
    for name, unit in units.items():
        role = _role(unit)
        if unit.energy_keys is None:
            raise ConfigError(f"hardware.units.{name}: {type(unit).__name__} ({unit.label or name}) serves role "
                              f"'{role}' but declares no energy rule for its actions (energy_keys and "
                              f"energy_actions, kbframe.hw.unit.PeUnit)")
        need = (*unit.energy_keys, "static_mw")
        table = energy.get(role)
        if not table:
            raise ConfigError(f"energy.{role}: no table for role '{role}', which hardware.units.{name} "
                              f"({unit.label or name}) serves (it needs {', '.join(need)})")
        for key in table:
            if key not in need:
                raise ConfigError(f"unknown key 'energy.{role}.{key}' (known for hardware.units.{name}, "
                                  f"{unit.label or name}: {', '.join(need)})")
        for key in need:
            if key not in table:
                raise ConfigError(f"energy.{role}.{key} is missing (hardware.units.{name}, {unit.label or name}, "
                                  f"is charged by {', '.join(need)})")
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ConfigError(f"energy.{role}.{key} must be a finite number ≥ 0, got {value}")
            if value > MAX_VALUE:
                raise ConfigError(f"energy.{role}.{key} must be at most {MAX_VALUE:g} ({_WHAT_MAX[key == 'static_mw']}), "
                                  f"got {value:g}: a run's total would overflow")


def _work(pe, name: str, oplog, dtype: str) -> Work:
    t = oplog.unit_totals(pe.index, name)
    if t is None:
        return Work(dtype=dtype, itemsize=ITEMSIZE[dtype])
    return Work(count=t[0], bytes=t[1], flops=t[2], kinds=oplog.kinds(pe.index, name), dtype=dtype,
                itemsize=ITEMSIZE[dtype])


def _op_log_name(pe, name: str) -> str:
    """The op_log's name of a unit's records: ``cpu`` and ``scheduler`` for PE_CPU's and
    PE_SCHEDULER's (kbframe.sim.oplog), else the unit's config name."""
    return "cpu" if pe.units[name] is pe.cpu else "scheduler" if pe.units[name] is pe.scheduler else name


def pe_energy(pe, oplog, energy, dtype: str, latency_ps: int) -> dict:
    """One PE's energy: ``{unit name: {"label", "role", "actions": {action: quantity},
    "pj_by_action": {action: pJ}, "dynamic_pj", "static_pj", "pj"}}`` in config order; a
    unit whose stages touch TCM also has ``tcm_pj``, the part of the TCM's energy its
    traffic makes (at the TCM's read and write prices; already in the TCM's ``pj``).

    Raises:
        ConfigError: a unit's rule names a key its table does not have (e.g. a GEMM at a
            dtype with no ``<dtype>_pj_per_mac``), or a micro-op with no energy class.
    """
    lat_ns = ps_to_ns(latency_ps)
    works = {name: _work(pe, _op_log_name(pe, name), oplog, dtype) for name in pe.units}
    traffic = {name: unit.tcm_traffic(works[name]) for name, unit in pe.units.items() if unit is not pe.tcm}
    tcm_name = next(n for n, u in pe.units.items() if u is pe.tcm)
    works[tcm_name].tcm_read_bytes = sum(r for r, _ in traffic.values())
    works[tcm_name].tcm_write_bytes = sum(w for _, w in traffic.values())
    tcm_table = energy[_role(pe.tcm)]
    out = {}
    for name, unit in pe.units.items():
        role = _role(unit)
        table = energy[role]
        actions, pj_by = {}, {}
        dynamic = 0.0
        for action, key, qty in unit.energy_actions(works[name]):
            if key not in table:
                raise ConfigError(f"energy.{role}.{key} is missing: hardware.units.{name} ({unit.label}) "
                                  f"charges its {action} at it")
            pj = qty * float(table[key])
            actions[action], pj_by[action] = qty, pj
            dynamic += pj
        static = float(table["static_mw"]) * lat_ns
        out[name] = {"label": unit.label or name, "role": role, "actions": actions, "pj_by_action": pj_by,
                     "dynamic_pj": dynamic, "static_pj": static, "pj": dynamic + static}
        r, w = traffic.get(name, (0, 0))
        if r or w:  # the TCM energy its traffic makes (counted in the TCM's figures)
            out[name]["tcm_pj"] = r * float(tcm_table.get("read_pj_per_byte", 0.0)) + \
                w * float(tcm_table.get("write_pj_per_byte", 0.0))
    return out


def run_energy(energy, pes: list, oplog, dtype: str, latency_ps: int, unit: str, n_units: int,
               tokens: int = 0) -> dict:
    """``metrics.json`` ``energy`` of a run on ``pes`` (the PEs that made records).

    Returns:
        ``total_pj``, ``dynamic_pj``, ``static_pj``; ``by_unit`` (per PE: its pJ and each
        unit's pJ, actions and their pJ); ``by_action`` (``"<role>.<action>"``: quantity and
        pJ over all PEs); ``by_role`` (dynamic pJ per role, and ``static``);
        ``per_unit_pj`` (per unit of progress, named by ``unit``); ``per_token_pj`` when
        the workload makes tokens; ``avg_power_w``; ``edp`` (pJ·ns: total × latency);
        ``node``.
    """
    by_unit, by_action, by_role = [], {}, {}
    dynamic = static = 0.0
    for pe in pes:
        units = pe_energy(pe, oplog, energy, dtype, latency_ps)
        pe_dyn = pe_static = 0.0
        for name, u in units.items():
            pe_dyn += u["dynamic_pj"]
            pe_static += u["static_pj"]
            by_role[u["role"]] = by_role.get(u["role"], 0.0) + u["dynamic_pj"]
            for action, qty in u["actions"].items():
                a = by_action.setdefault(f"{u['role']}.{action}", {"count": 0, "pj": 0.0})
                a["count"] += qty
                a["pj"] += u["pj_by_action"][action]
        by_unit.append({"pe": pe.index, "pj": pe_dyn + pe_static, "dynamic_pj": pe_dyn, "static_pj": pe_static,
                        "units": units})
        dynamic += pe_dyn
        static += pe_static
    by_role["static"] = static
    total = dynamic + static
    lat_ns = ps_to_ns(latency_ps)
    out = {"total_pj": total, "dynamic_pj": dynamic, "static_pj": static,
           "unit": unit, "per_unit_pj": total / n_units if n_units else 0.0,
           "avg_power_w": total / lat_ns * 1e-3 if lat_ns else 0.0, "edp": total * lat_ns,
           "node": str(energy.node), "table": str(energy.name),
           "by_role": by_role, "by_action": by_action, "by_unit": by_unit}
    if tokens:
        out["per_token_pj"] = total / tokens
    return out


def largest(metrics_energy: dict, n: int = 3) -> list:
    """The ``n`` largest consumers over all PEs, ``[(label, pJ), ...]``: each unit label's
    dynamic pJ, and ``static`` (all units' static pJ together)."""
    per: dict = {}
    for pe in metrics_energy["by_unit"]:
        for u in pe["units"].values():
            per[u["label"]] = per.get(u["label"], 0.0) + u["dynamic_pj"]
    if metrics_energy["static_pj"]:
        per["static"] = metrics_energy["static_pj"]
    return sorted(per.items(), key=lambda kv: -kv[1])[:n]


def _pj(x: float) -> str:
    """An energy with its SI prefix (pJ, nJ, µJ, mJ, J)."""
    for scale, name in ((1e12, "J"), (1e9, "mJ"), (1e6, "µJ"), (1e3, "nJ")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {name}"
    return f"{x:.3g} pJ"


def summary_line(e: dict) -> str:
    """The console's ``energy`` line: total, per unit of progress, average power and the
    three largest consumers with their share."""
    total = e["total_pj"]
    top = ", ".join(f"{label} {pj / total:.0%}" if total else f"{label} 0%" for label, pj in largest(e))
    return (f"  energy      {_pj(total)} ({e['node']}); per {e['unit']} {_pj(e['per_unit_pj'])}; "
            f"avg {e['avg_power_w']:.3g} W; largest: {top}")

