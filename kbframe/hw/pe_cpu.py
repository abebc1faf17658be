"""PE_CPU: runs the kernel program and dispatches its commands (ADR-0064 Rev2 cost model).

The kernel is a plain Python function (no ``yield``); it runs in a greenlet. Each command
it emits switches back here, PE_CPU holds for ``FIXED + R × logical_bytes`` cycles of its
own time, then hands the command to PE_SCHEDULER. PE_CPU blocks only when the kernel
needs a value (``tl.wait``) or when PE_SCHEDULER's queue is full (DESIGN.md modelling
notes); read-after-write ordering between commands is the scheduler's job.
"""
from __future__ import annotations

import numpy as np

from ..errors import ValidationError
from ..ir.protocol import Dispatch, requests
from ..timebase import cycles_to_ps, ns_to_ps
from dataclasses import dataclass

from ..params import duration, param
from .unit import PeUnit


@dataclass
class CpuParams:
    """PE_CPU's parameters (ADR-0064 Rev2 cost model)."""

    fixed_cycles: float = param(doc="FIXED: PE_CPU cycles per command (ADR-0064 D1; calibration.FIXED)",
                                unit="cycles", lo=0)
    r_cycles_per_byte: float = param(doc="R: cycles per logical byte (calibration.R)", unit="cycles/byte", lo=0)
    composite_cap_bytes: int = param(doc="largest composite's logical bytes (ADR-0064 D7; calibration.cap_bytes)",
                                     unit="bytes", lo=1)
    clock_ghz: float = param(doc="PE_CPU clock", unit="GHz", lo=0, lo_open=True)
    launch_ns: float = duration(0.0, doc="the kernel's launch cost: PE_CPU starts the kernel this long after the "
                                         "run's start (a GPU's kernel launch, DESIGN.md decision 14)")


class PeCpu(PeUnit):
    """PE_CPU of one PE; its parameters: :class:`CpuParams` (kbframe.hw.unit.PeUnit)."""

    Params = CpuParams

    roles = ("dispatch",)
    label = "PE_CPU"
    energy_keys = ("pj_per_cycle",)

    def energy_actions(self, work) -> list:
        """Every dispatch cycle it spent (``FIXED + R × logical_bytes`` per command, the
        ADR-0064 cost model): PE_CPU's energy scales with the dispatch cost."""
        return [("cycles", "pj_per_cycle", self.cycles)]

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.launch_ps = ns_to_ps(self.launch_ns)
        self.pe = None
        self.n_commands = 0
        self.cycles = 0.0
        self.busy_ps = 0
        self.waiting_for = None
        self.finished = False
        self.progress = None  # optional callable(cmd) after each dispatch (kbframe.run.progress)
        self._cost_cache: dict = {}  # logical_bytes -> (cycles, ps): commands repeat a few sizes

    def cost_cycles(self, cmd) -> float:
        """Dispatch cost of ``cmd`` in PE_CPU cycles: ``FIXED + R × logical_bytes``."""
        return self.cycles_for(cmd.logical_bytes)

    def cycles_for(self, logical_bytes: int) -> float:
        """Dispatch cost of a command of ``logical_bytes`` in PE_CPU cycles (ADR-0064 D1)."""
        return self.fixed_cycles + self.r_cycles_per_byte * logical_bytes

    def restore(self, n_commands: int, busy_ps: int, logical_bytes) -> None:
        """Stand for a run that dispatched commands of ``logical_bytes`` (an int64 array, in
        dispatch order) in ``n_commands`` dispatches over ``busy_ps`` (a run made, not
        simulated: kbframe.run.fastforward). Its cycles are summed in dispatch order, as
        dispatching sums them (a running sum: the same float)."""
        self.n_commands, self.busy_ps = n_commands, busy_ps
        nb = np.asarray(logical_bytes, dtype=np.float64)  # exact: far below 2**53 bytes
        self.cycles = float(np.cumsum(self.fixed_cycles + self.r_cycles_per_byte * nb)[-1]) if len(nb) else 0.0

    def check_cap(self, cmd) -> None:
        """Raise :class:`ValidationError` if a composite exceeds the cap (ADR-0064 D7)."""
        nbytes = cmd.logical_bytes
        if nbytes > self.composite_cap_bytes:
            kinds = ",".join(op.kind for op in cmd.ops)
            raise ValidationError(
                f"composite over the size cap: {nbytes} logical bytes > cap "
                f"{self.composite_cap_bytes} (calibration.cap_bytes); ops [{kinds}]; "
                f"split it (no silent segmentation, ADR-0064 D7)")

    def bind(self, pe) -> None:
        self.pe = pe
        self.env = pe.env

    def start(self, program) -> None:
        """Run ``program()`` (a kernel bound to its tl context) as this PE's kernel."""
        self.env.process(self._run(program))

    def _run(self, program):
        env, sched, oplog, idx = self.env, self.pe.scheduler, self.pe.oplog, self.pe.index
        # what the next dispatch waits for (kbframe.sim.waits): the previous dispatch
        # (``cpu``), the kernel's start, room made by admitting command ``ref``, or a
        # ``tl.wait`` on command ``ref``
        why, ref = "start", -1
        if self.launch_ps:
            yield env.timeout(self.launch_ps)
        for req in requests(program):
            if type(req) is Dispatch:
                obj = req.cmd
                while not sched.has_room():
                    ev = env.event()
                    sched.room_waiters.append(ev)
                    self.waiting_for = f"room in PE_SCHEDULER's queue for command {obj.id}"
                    ref = yield ev
                    why = "room"
                cost = self._cost_cache.get(obj.logical_bytes)
                if cost is None:
                    cycles = self.cost_cycles(obj)
                    cost = self._cost_cache[obj.logical_bytes] = (cycles, cycles_to_ps(cycles, self.clock_ghz))
                cycles, dt = cost
                t0 = env.now
                yield env.timeout(dt)
                self.waiting_for = None
                self.n_commands += 1
                self.cycles += cycles
                self.busy_ps += dt
                oplog.dispatch(idx, obj, t0, env.now, why, ref)
                why, ref = "cpu", -1
                sched.submit(obj)
                if self.progress is not None:
                    self.progress(obj)
            else:  # Wait
                obj = req.completion
                if not obj.done:
                    ev = env.event()
                    self.waiting_for = repr(obj)
                    obj.on_done(lambda _c, ev=ev: ev.succeed())
                    yield ev
                    self.waiting_for = None
                    why, ref = "wait", obj.cmd_id
        self.finished = True
