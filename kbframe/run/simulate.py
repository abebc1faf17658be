"""One simulation of a bench: the engine built from the hardware config, the workload's
tensors and programs on its PEs, the run, and the sanitizer (``run.check``).

:func:`kbframe.run.bench.run_bench` runs it and then reports it; kept apart so that a run
can be simulated more than once (shortened copies of a bench, a run checked against
another) without the run shell's files.
"""
from __future__ import annotations

from dataclasses import dataclass

from threadpoolctl import threadpool_limits

from ..sim import sanitizer
from ..sim.engine import Engine
from ..sim.numerics import Numerics, NumpyNumerics
from ..sim.oplog import OpLog
from ..tl.context import TL
from . import progress


@dataclass
class Simulation:
    """What a simulation leaves: the engine (its PEs), the PE whose units the summary
    shows, the op_log's totals and wait records, the latency (ps), the sanitizer's
    verdict and the numerics (the outputs, in data mode)."""

    engine: Engine
    pe: object
    oplog: OpLog
    latency_ps: int
    sanitizer: dict | None
    numerics: Numerics
    phases: dict = None  # {pe: TL.phases}: the kernel's tl.phase annotations (kbframe.run.phases)


def simulate(cfg, wl, kernel, recipes, inp, oplog_path, check: bool, show: bool,
             units: dict | None = None, check_later: bool = False, steady=None) -> Simulation:
    """Run ``wl`` (validated from ``cfg``) with ``kernel``; op_log records go to
    ``oplog_path`` (a path or a text stream; None: nowhere, the records stay in
    ``oplog.table``); ``units``: one PE's unbound units (default: built from
    ``cfg.hardware``). With ``check_later`` the sanitizer records what it needs but the
    caller checks (``kbframe.sim.sanitizer.check(sim.engine, sim.oplog.table)``) and
    ``Simulation.sanitizer`` is None. ``steady``: a :class:`~kbframe.sim.steady.Steady` whose
    loops may leave out a steady stretch (kbframe.run.skipped). Raises what the run raises (ValidationError,
    TcmOverflowError, DeadlockError, SanitizerError)."""
    b = cfg.bench
    oplog = OpLog(oplog_path)
    numerics = NumpyNumerics(b.data_dtype) if b.data else Numerics()
    try:
        engine = Engine(cfg.hardware, numerics, oplog, units)
        if steady is not None:
            engine.steady, steady.engine = steady, engine
        if check:
            sanitizer.enable(engine)
        for name, shape in wl.tensors().items():
            value = inp.get(name) if (b.data and name not in wl.outputs) else None  # None: zeros (an output)
            engine.add_hbm_tensor(name, shape, b.dtype, value)
        tls = {}

        def make_tl(i):
            tls[i] = TL(engine.pes[i], engine.hbm, recipes, b.dtype)
            return tls[i]
        programs = wl.programs(kernel, make_tl, inp)
        pe = engine.pes[min(programs)]
        stream, rows = wl.progress_stream()
        # one BLAS thread: the simulator's matmuls are tile-sized, where threading only adds
        # hand-off cost (and noise on sim.wall_s)
        with progress.attach([engine.pes[i].cpu for i in sorted(programs)], show, engine.hbm[stream],
                             wl.n_units(), rows, unit=wl.unit), \
                threadpool_limits(1):
            latency_ps = engine.run(programs)
    finally:
        oplog.close()
    san = None if check_later else sanitizer.check(engine, oplog.table) if check else {"rules_checked": 0}
    return Simulation(engine, pe, oplog, latency_ps, san, numerics, {i: t.phases for i, t in tls.items()})
