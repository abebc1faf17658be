"""The generic engine: builds every PE the topology declares, runs kernels on them as one
SimPy simulation, and reports time. Nothing here assumes one PE or knows any kernel.
"""
from __future__ import annotations

import copy
import gc
import operator
import time
from collections.abc import Sequence
from types import SimpleNamespace

import simpy
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from .. import internals
from ..errors import ConfigError, DeadlockError, TimeBaseError
from ..ir.handles import TensorHandle, itemsize
from ..hw.hbm import HbmPort
from ..hw.ipcq import Fabric, IpcqSend
from ..params import ParamError
from ..hw.pe import PE
from ..hw.unit import Stage
from ..timebase import LIMIT_TEXT, MAX_PS, bytes_to_ps, cycles_to_ps, ns_to_ps, ps_to_ns
from .targets import resolve_unit_class


def _check_targets(hw) -> dict:
    """Resolve every ``_target_`` in ``hardware.units`` (nested nodes too: Hydra instantiates
    them recursively) to a unit class (kbframe.sim.targets.resolve_unit_class); nothing is
    imported outside ``kbframe.`` unless ``hardware.allow_external_targets``.

    Returns:
        ``{unit name: its class}``.
    Raises:
        ConfigError: names the key path of the refused ``_target_`` and why.
    """
    allow = bool(hw.get("allow_external_targets", False))

    def walk(node, path):
        if OmegaConf.is_dict(node):
            for key in node.keys():
                if key == "_target_":
                    resolve_unit_class(node[key], f"{path}._target_", allow)
                elif key == "_partial_":
                    raise ConfigError(f"{path}._partial_ is not supported: a unit is built, not a partial")
                else:
                    walk(internals.node(node, key), f"{path}.{key}")
        elif OmegaConf.is_list(node):
            for i, child in enumerate(internals.list_nodes(node)):
                walk(child, f"{path}[{i}]")

    classes = {}
    for name in hw.units.keys():
        if not OmegaConf.is_dict(internals.node(hw.units, name)) or "_target_" not in hw.units[name]:
            raise ConfigError(f"hardware.units.{name} needs a _target_ (a kbframe unit class)")
        walk(internals.node(hw.units, name), f"hardware.units.{name}")
        classes[name] = resolve_unit_class(hw.units[name]._target_, f"hardware.units.{name}._target_", allow)
    return classes


def build_units(hw) -> dict:
    """Instantiate one PE's units from ``hardware.units``.

    Raises:
        ConfigError: a refused target, or a unit whose parameters its class rejects
            (names ``hardware.units.<name>.<parameter>`` when kbframe.params checked it,
            else ``hardware.units.<name>``, and the reason).
    """
    classes = _check_targets(hw)
    units = {}
    for name, ucfg in hw.units.items():
        try:
            units[name] = instantiate(ucfg, _convert_="all")
        except InstantiationException as e:
            cause = e.__cause__ or e
            if isinstance(cause, ParamError):  # its message starts with the parameter's name
                raise ConfigError(f"hardware.units.{name}.{cause}") from None
            raise ConfigError(f"hardware.units.{name}: {type(cause).__name__}: {cause}") from None
        if type(units[name]) is not classes[name]:  # e.g. a _target_ whose text resolved differently
            raise ConfigError(f"hardware.units.{name}: built a {type(units[name]).__name__}, "
                              f"not the {classes[name].__name__} its _target_ names")
    return units


def _params(hw, name: str) -> str:
    """A unit's numeric parameters for a message, each with the key it comes from when it
    is an interpolation (``clock_ghz=1e-300 from hardware.clock_ghz``)."""
    node = hw.units[name]
    raw = OmegaConf.to_container(node, resolve=False)
    out = []
    for key, text in raw.items():
        try:
            value = node[key]
        except Exception:  # noqa: BLE001 (an unresolvable value was reported already)
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            src = f" from {text[2:-1]}" if isinstance(text, str) and text.startswith("${") else ""
            out.append(f"{key}={value:g}{src}")
    return ", ".join(out)


#: logical bytes of a large primitive command (framing + one op is under 100, DDD-0065 §4);
#: the pre-flight dry run times every real command's dispatch exactly
_PRIMITIVE_BYTES = 256


def check_time_base(pe, hw) -> None:
    """Refuse, before a run, a unit whose longest possible stage would not fit the integer
    time base (kbframe.timebase.MAX_PS). The longest stage any kernel can give a unit moves
    or reads at most a TCM-full of bytes and elements, and at most ``2·(E/3)^1.5`` flops
    (a GEMM whose three operands share a TCM of E elements); PE_CPU's longest dispatch is
    of a command of 256 logical bytes (the pre-flight dry run times every real command).
    Each is timed by the unit's own rule (``duration_ps``), so any unit type is covered,
    except what takes its time from a link or a port: a TCM-full IPCQ message on each kind
    of link the topology has, and a TCM-full DMA transfer through a cube's shared HBM port.
    Each fixed latency is checked by its unit (its declaration, kbframe.params.duration); an IPCQ
    message's, the sum over its route, here for the longest route the topology has.

    Raises:
        ConfigError: names ``hardware.units.<name>`` (or the bandwidth's key), the stage
            and its parameters (with the keys they come from).
    """
    cap = int(pe.tcm.capacity_bytes)
    flops = int(2 * (cap / 3) ** 1.5)
    bandwidths = []  # (key, GB/s, what moves): rates a stage's time takes from its link or port
    if hw.get("hbm_mode", "partitioned") == "shared":
        bandwidths.append(("hardware.cube_hbm_gbps", float(hw.get("cube_hbm_gbps", 1638.4)), "DMA transfer"))
    for name, unit in pe.stage_units.items():
        if isinstance(unit, IpcqSend):  # its time is its link's: each kind of link the topology has
            cubes_x, cubes_y = int(hw.get("cubes_x", 1)), int(hw.get("cubes_y", 1))
            if int(hw.get("n_pes", 1)) > 1:
                bandwidths.append((f"hardware.units.{name}.intra_gbps", unit.intra_gbps, "message"))
            if cubes_x * cubes_y > 1:
                bandwidths.append((f"hardware.units.{name}.d2d_gbps", unit.d2d_gbps, "message"))
                # each latency fits (its declaration, kbframe.params.duration); the longest route's sum must too
                hops = 1 if hw.get("cube_fabric", "mesh") == "switch" else cubes_x - 1 + cubes_y - 1
                try:
                    ns_to_ps(unit.intra_latency_ns + hops * unit.d2d_latency_ns)
                except TimeBaseError as e:
                    raise ConfigError(f"hardware.units.{name}.intra_latency_ns + {hops} × hardware.units.{name}."
                                      f"d2d_latency_ns: the latency of a message on the longest route ({hops} "
                                      f"cube crossing(s)) does not fit the time base: {e}") from None
            continue
        probe = Stage(unit, "probe", None, -1, cap, flops, cap)
        try:
            unit.duration_ps(probe)
        except (TimeBaseError, OverflowError, ZeroDivisionError) as e:
            raise ConfigError(f"hardware.units.{name}: its longest possible stage (a TCM-full: {cap} B, "
                              f"{cap} elements, {flops:.3g} flop) does not fit the time base: {e} "
                              f"({_params(hw, name)})") from None
    for key, gbps, what in bandwidths:
        try:
            bytes_to_ps(cap, gbps)
        except (TimeBaseError, OverflowError, ZeroDivisionError) as e:
            raise ConfigError(f"{key}: the longest possible {what} (a TCM-full: {cap} B) does not fit the "
                              f"time base: {e}") from None
    cpu = pe.cpu
    nbytes = _PRIMITIVE_BYTES
    cycles = cpu.cost_cycles(SimpleNamespace(logical_bytes=nbytes))
    try:
        cycles_to_ps(cycles, cpu.clock_ghz)
    except (TimeBaseError, OverflowError) as e:
        raise ConfigError(f"hardware.units.cpu: dispatching a command of {nbytes} logical bytes (FIXED + R × "
                          f"bytes) does not fit the time base: {e} ({_params(hw, 'cpu')})") from None


#: most PEs a topology may declare (2^20: a 4×4 mesh of 8-PE cubes is 128, so room for
#: thousands of such trays); PEs are built only when a run uses them, so this refuses
#: absurd values, it is not a memory budget
MAX_PES = 1 << 20


def check_topology(hw) -> tuple:
    """``hardware.n_pes`` must be the topology's PEs, ``pes_per_cube × cubes_x × cubes_y``:
    more would have no cube, and fewer would leave declared cubes (or a cube's PEs) out of
    the run while its links and HBM ports are still laid out for them.

    Returns:
        ``(cubes_x, cubes_y)``.
    Raises:
        ConfigError: names the four keys, their values and the product.
    """
    n, ppc = int(hw.n_pes), int(hw.get("pes_per_cube", 8))
    cubes_x, cubes_y = int(hw.get("cubes_x", 1)), int(hw.get("cubes_y", 1))
    total = ppc * cubes_x * cubes_y
    if n != total:  # a count below 1 is refused before this (bench.validate names it)
        raise ConfigError(f"hardware.n_pes={n} does not match the topology: hardware.pes_per_cube={ppc} × "
                          f"hardware.cubes_x={cubes_x} × hardware.cubes_y={cubes_y} = {total} PE(s); set "
                          f"hardware.n_pes={total}, or the cube keys so that their product is {n}")
    return cubes_x, cubes_y


class PEs(Sequence):
    """``engine.pes``: the ``hardware.n_pes`` PEs, each built (its units copied and bound)
    the first time it is used, so a run on PE 0 of ``n_pes=100000`` builds one PE.
    :meth:`built` lists those built so far; iterating builds them all."""

    def __init__(self, engine, n: int, units: dict, hw):
        self._engine, self._n, self._units, self._hw = engine, n, units, hw
        self._built: dict[int, PE] = {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        i = operator.index(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"PE {i} of {self._n}")
        pe = self._built.get(i)
        if pe is None:
            eng = self._engine
            # one instantiate (hydra's is slow); a second PE gets a copy of the units, made
            # from the template before any PE binds it
            units = self._units if self._n == 1 else copy.deepcopy(self._units)
            pe = self._built[i] = PE(eng.env, i, units, eng.numerics, eng.oplog)
            pe.fabric = eng.fabric
            pe.steady = eng.steady
            pe.scheduler.share_plans(eng.shape_plans)  # copies of one PE's units: one plan per shape for all
            if eng.shared_hbm:  # one data server per cube (kbframe.hw.hbm)
                port = eng.hbm_ports.get(i // eng.ppc)
                if port is None:
                    port = eng.hbm_ports[i // eng.ppc] = HbmPort(eng.cube_hbm_gbps, eng.hbm_arrival)
                for unit in pe.units_serving("dma_read", "dma_write"):
                    unit.port = port
            if len(self._built) == 1:
                check_time_base(pe, self._hw)  # every PE's units are copies of these
            if eng.keep_stage_records:
                pe.scheduler.record = []
        return pe

    def built(self) -> list:
        """The PEs built so far, by index."""
        return [self._built[i] for i in sorted(self._built)]


class Engine:
    """A simulation of ``hardware.n_pes`` PEs sharing one HBM.

    Args:
        hw: the ``hardware`` config node.
        numerics: a :class:`~kbframe.sim.numerics.Numerics` (timing only) or NumpyNumerics.
        oplog: the :class:`~kbframe.sim.oplog.OpLog` records stream into.
    Raises:
        ConfigError: ``hardware.n_pes`` outside 1..MAX_PES or not the topology's PEs
            (check_topology), or a unit refused (build_units, check_time_base).
    """

    def __init__(self, hw, numerics, oplog, units: dict | None = None):
        self.env = simpy.Environment()
        self.numerics = numerics
        self.oplog = oplog
        self.keep_stage_records = False  # set by kbframe.sim.sanitizer.enable
        self.steady = None  # a kbframe.sim.steady.Steady: loops may skip a steady stretch (set before run)
        self.shape_plans: dict = {}  # timing-only stage plans, shared by the PEs (kbframe.hw.tiling.PlanCache)
        n = int(hw.n_pes)
        if not 1 <= n <= MAX_PES:
            raise ConfigError(f"hardware.n_pes must be 1 to {MAX_PES}, got {n}")
        self.ppc = int(hw.get("pes_per_cube", 8))
        cubes_x, cubes_y = check_topology(hw)
        self.shared_hbm = hw.get("hbm_mode", "partitioned") == "shared"
        self.cube_hbm_gbps = float(hw.get("cube_hbm_gbps", 1638.4))
        self.hbm_arrival = hw.get("hbm_arbitration", "submission") == "arrival"  # kbframe.hw.hbm
        self.hbm_ports: dict = {}  # cube -> HbmPort (shared HBM, kbframe.hw.hbm)
        # units: one PE's unit objects, not yet bound (build_units(hw), or a copy of them: a
        # caller that builds many engines of one hardware instantiates them once)
        self.pes = PEs(self, n, units if units is not None else build_units(hw), hw)
        self.fabric = Fabric(self.pes, self.ppc, cubes_x, hw.get("cube_fabric", "mesh") == "switch")
        self.hbm: dict[str, TensorHandle] = {}
        self._hbm_top = 0
        self.wall_s = 0.0

    def add_hbm_tensor(self, name: str, shape, dtype: str, value=None) -> TensorHandle:
        """Place an HBM tensor (its numbers in data mode: ``value``, else zeros) and return
        its handle."""
        shape = tuple(int(s) for s in shape)
        nbytes = itemsize(dtype)
        for s in shape:
            nbytes *= s
        h = TensorHandle(name, shape, dtype, "hbm", self._hbm_top, f"hbm.{name}", shape)
        self._hbm_top += -(-nbytes // 4096) * 4096
        self.numerics.allocate(h, value)
        self.hbm[name] = h
        return h

    def run(self, programs: dict) -> int:
        """Run ``programs[pe_index]()`` on each PE until every event is done.

        Returns:
            Simulated latency, integer ps (the time the last event happened).
        Raises:
            DeadlockError: events ran out while a PE_CPU still waits or a command is stuck.
            Whatever a kernel raises (e.g. ValidationError at emit).
        """
        for i, prog in programs.items():
            self.pes[i].cpu.start(prog)
        t0 = time.perf_counter()
        # No full collections during the run: they rescan everything alive (the setup, and
        # with run.check every stage kept for the sanitizer), ever more as the run grows,
        # and find next to nothing; young cyclic garbage is still collected.
        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
        try:
            self.env.run()
        finally:
            gc.set_threshold(*thresholds)
            self.wall_s = time.perf_counter() - t0
        for (src, dst), link in sorted(self.fabric.links.items()):
            if link.waiting:
                raise DeadlockError(f"deadlock at {ps_to_ns(self.env.now)} ns: PE{dst} waits to receive from PE{src}, "
                                    f"which sends it nothing more ({link.sent} message(s) sent, "
                                    f"{link.received} received)")
        for i in programs:
            pe = self.pes[i]
            if not pe.cpu.finished:
                raise DeadlockError(f"deadlock at {ps_to_ns(self.env.now)} ns: PE{i} PE_CPU waits for "
                                    f"{pe.cpu.waiting_for or 'nothing that can complete'}")
        if self.env.now >= MAX_PS:  # each stage fits (check_time_base), but not their sum
            raise TimeBaseError(f"the simulation reached {self.env.now:.4g} ps; {LIMIT_TEXT}: use a shorter "
                                f"run (a smaller shape) or faster units")
        for pe in self.pes.built():
            sched = pe.scheduler
            if sched.queue or sched.inflight:
                blocked = sched.blocked_on
                what = (f"command {blocked[0].id} waits for {blocked[1]!r}" if blocked else
                        f"{len(sched.inflight)} command(s) in flight never completed")
                raise DeadlockError(f"deadlock at {ps_to_ns(self.env.now)} ns: PE{pe.index} PE_SCHEDULER: {what}")
        return self.env.now
