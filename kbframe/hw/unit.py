"""Base classes of a PE's units: :class:`PeUnit` (every unit: the roles it serves and its
display label, DESIGN.md decision 8) and :class:`Unit`, the units that execute stages
(PE_DMA channels, PE_GEMM, PE_MATH).

Roles are the planner's vocabulary: ``dispatch`` (PE_CPU), ``admission`` (PE_SCHEDULER),
``tcm``, and the stage roles ``dma_read``, ``dma_write``, ``gemm``, ``math``. The PE asks
for the unit that serves a role; roofline, trace, sanitizer and metrics iterate over the
PE's units by what they declare, so a new unit type is a class and a config entry.

Units also declare what their actions cost (DESIGN.md decision 15, Accelergy's per-action
tables): :attr:`PeUnit.energy_keys` names the keys of its role's table in the ``energy``
config group, :meth:`PeUnit.energy_actions` counts its actions from the run's records and
:meth:`PeUnit.tcm_traffic` the TCM bytes its stages read and write. kbframe.run.energy
multiplies them after the run; nothing of it enters timing.

A unit takes a stage, holds it for its duration and hands it on, in arrival order (FIFO).
Subclasses supply only the duration rule (:meth:`Unit.duration_ps`); the DMA channel also
overrides :meth:`Unit.reserve` to overlap fixed latency across transfers in flight.

Reservation is analytic: a stage that arrives at ``now`` starts at ``max(now, free)``
and the unit schedules one SimPy timeout for its end. Arrivals are handled in simulated
time order, so this is exactly a FIFO server with one event per stage.
"""
from __future__ import annotations

import dataclasses

from ..params import check


class Stage:
    """One unit of work for one unit: an op kind, its sizes, and a numeric effect.

    Attributes (all times integer ps):
        unit: the :class:`Unit` that runs it.
        op_kind: label for logs; units never branch on it (DESIGN.md boundary).
        cmd: the command it belongs to. tile: tile index in the command's tile loop or -1.
        nbytes: bytes moved (DMA) or read (GEMM/MATH). flops: GEMM flops.
        n_elements: elements a MATH stage produces.
        effect: callable applying the numeric effect in data mode, or None.
        succs: stages waiting on this one; deps: how many stages this one still waits on.
        seq: the stage's op_log record index, set when it is logged.
        ready_by: ``seq`` of the predecessor whose end made this stage ready (-1: ready
            at its command's admission), for kbframe.sim.waits.
        peer: the other PE of an IPCQ send or receive (-1 for other stages).
    """

    __slots__ = ("unit", "op_kind", "cmd", "tile", "nbytes", "flops", "n_elements",
                 "effect", "succs", "deps", "t_start", "t_end", "t_data", "seq", "ready_by", "peer")

    def __init__(self, unit, op_kind, cmd, tile=-1, nbytes=0, flops=0, n_elements=0, effect=None, peer=-1):
        self.unit = unit
        self.op_kind = op_kind
        self.cmd = cmd
        self.tile = tile
        self.nbytes = nbytes
        self.flops = flops
        self.n_elements = n_elements
        self.effect = effect
        self.succs = []
        self.deps = 0
        self.t_start = self.t_end = self.t_data = -1
        self.peer = peer  # the other PE of an IPCQ send or receive, else -1
        self.seq = 0
        self.ready_by = -1

    def after(self, *preds) -> "Stage":
        """Make this stage wait for each stage in ``preds`` (None entries ignored)."""
        for p in preds:
            if p is not None:
                p.succs.append(self)
                self.deps += 1
        return self


class PeUnit:
    """Anything a PE is built from. A subclass names its default ``roles`` and ``label``;
    a config entry may override both (e.g. one DMA channel class serving ``dma_read`` or
    ``dma_write``). Its parameters are declared once, in :attr:`Params` (a dataclass of
    kbframe.params fields: unit, range, description): the constructor takes them (by
    position in declaration order, or by name), checks them with kbframe.params.check
    and sets each as an attribute of the unit; a subclass's ``__init__`` only derives
    what it needs from them.

    Args:
        *params / **params: the values of :attr:`Params`' fields.
        description: one line on what the unit models (shown in docs and errors).
        roles: the roles this unit serves (default: the class's).
        label: its name in summaries and traces (default: the class's).
    Raises:
        TypeError: a parameter the unit does not declare, or a required one missing.
        kbframe.params.ParamError: a value outside its declaration (the message starts
            with the parameter's name).
        ValueError: ``roles`` not a list of names.
    """

    #: the unit's parameters (a dataclass of kbframe.params fields); None: it takes none
    Params = None

    #: roles served (see the module doc)
    roles: tuple = ()
    #: display label in the summary table and the trace
    label: str = ""
    #: the keys of ``energy.<role>`` (``<role>``: its first role) its actions are charged at,
    #: each ``<what>_pj_per_<action>``; None: the unit declares no energy rule (a run with it
    #: is refused, kbframe.run.energy)
    energy_keys: tuple | None = None

    def energy_actions(self, work) -> list:
        """The unit's actions in a finished run: ``[(action, energy key, quantity), ...]``,
        ``quantity`` in the unit the key names (bits, bytes, MACs, cycles ...).

        Args:
            work: kbframe.run.energy.Work: the unit's records (``count``, ``bytes``,
                ``flops``, ``kinds``: ``{op_kind: (count, elements)}``), the run's
                ``dtype`` and, for the TCM, the bytes the other units read and wrote.
        """
        return []

    def tcm_traffic(self, work) -> tuple:
        """``(read_bytes, write_bytes)`` of the PE's TCM that this unit's stages make."""
        return 0, 0

    def __init__(self, *args, **kw):
        names = [f.name for f in dataclasses.fields(self.Params)] if self.Params else []
        given, where = {}, f"{type(self).__name__}.__init__()"
        for key, value in zip([*names, "description", "roles", "label"], args):
            given[key] = value
        if len(args) > len(names) + 3:
            raise TypeError(f"{where} takes {len(names) + 3} positional arguments but {len(args)} were given")
        for key, value in kw.items():
            if key not in names and key not in ("description", "roles", "label"):
                raise TypeError(f"{where} got an unexpected keyword argument '{key}'")
            if key in given:
                raise TypeError(f"{where} got multiple values for argument '{key}'")
            given[key] = value
        if self.Params:
            fields = dataclasses.fields(self.Params)
            missing = [f.name for f in fields if f.name not in given and f.default is dataclasses.MISSING]
            if missing:
                raise TypeError(f"{where} missing required argument(s): {', '.join(missing)}")
            values = {f.name: given.get(f.name, f.default) for f in fields}
            for key, value in check(values, self.Params, "", typed=False).items():
                setattr(self, key, value)
        self._init_common(given.get("description", ""), given.get("roles"), given.get("label"))

    def _init_common(self, description: str, roles, label) -> None:
        self.description = description
        if roles is not None:
            if isinstance(roles, str) or not all(isinstance(r, str) and r for r in roles):
                raise ValueError(f"roles must be a list of role names, got {roles!r}")
            self.roles = tuple(roles)
        if label is not None:
            self.label = str(label)
        self.name = ""


class Unit(PeUnit):
    """A PE unit that runs stages one at a time in arrival order (arguments: :class:`PeUnit`)."""

    #: number of stages that may overlap on this unit (the sanitizer checks it).
    channels = 1

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.pe = None
        self.env = None
        self.free_ps = 0
        self.busy_ps = 0
        self.n_stages = 0
        self._on_done = None
        self._fire_cb = self._fire  # one bound method for every stage's end event

    def bind(self, pe, name: str, on_done) -> None:
        """Attach to PE ``pe`` as unit ``name``; ``on_done(stage)`` is called at each end."""
        self.pe, self.env, self.name, self._on_done = pe, pe.env, name, on_done

    def duration_ps(self, stage: Stage) -> int:
        """Integer ps the stage occupies the unit. Subclasses define it."""
        raise NotImplementedError

    def reserve(self, now: int, stage: Stage) -> None:
        """Set ``stage.t_start`` / ``t_end`` for a FIFO single server."""
        start = now if now > self.free_ps else self.free_ps
        end = start + self.duration_ps(stage)
        self.free_ps = end
        self.busy_ps += end - start
        stage.t_start, stage.t_end = start, end

    def submit(self, stage: Stage) -> None:
        """Accept a ready stage now; it ends (and ``on_done`` fires) at ``stage.t_end``."""
        env = self.env
        now = env.now
        self.reserve(now, stage)
        self.n_stages += 1
        env.timeout(stage.t_end - now, stage).callbacks.append(self._fire_cb)

    def _fire(self, ev) -> None:
        self._on_done(ev.value)
