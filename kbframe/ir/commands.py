"""Commands PE_CPU dispatches to PE_SCHEDULER (ADR-0065 D1–D3, DDD-0065 §4).

A :class:`PrimitiveCmd` carries one :class:`OpSpec` (a DMA load/store, one GEMM or one
MATH micro-op); a :class:`CompositeCmd` carries a flat ordered tuple of OpSpecs with at
most one GEMM. There is no head/epilogue field: an op's *position* relative to the GEMM
sets its phase and its :class:`Scope` its repetition (ADR-0065 D3).

``logical_bytes`` is the structural size that the dispatch cost ``FIXED + R × bytes``
charges (ADR-0064 D2 via DDD-0065 §4), never Python object size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .cached import cached_attr
from .handles import Completion, TensorHandle


class Scope(Enum):
    """Repetition of an op within its phase (ADR-0065 D3): KERNEL = once per command at
    its position; K_TILE = once per K tile of the GEMM; OUTPUT_TILE = once per output tile."""

    KERNEL = "kernel"
    K_TILE = "k_tile"
    OUTPUT_TILE = "output_tile"


# The frozen dataclasses below spell out __init__ (dataclass keeps a class's own): the
# generated one sets each field through object.__setattr__, several times slower, and the
# tl layer builds commands at every KV tile. Fields, defaults, repr and frozenness are
# the dataclass's.
_DEFAULT = object()


@dataclass(frozen=True, eq=False)
class OpSpec:
    """One op of a command.

    Attributes:
        kind: ``"gemm"``, ``"load"``, ``"store"`` or a MATH micro-op name (``"rmax"`` ...).
        scope: :class:`Scope`.
        operands: named input handles, e.g. ``{"a": P, "b": V_j}`` or ``{"src_a": m, ...}``.
        extra: scalars (``{"factor": 0.088}``, ``{"m": 8, "k": 64, "n": 128}``).
        out: the handle written, or None (an epilogue op writes the GEMM accumulator).
        logical_bytes: DDD-0065 §4.2: opcode + scope + count + 8/operand + 8 if out + count
            + 4/scalar (set by ``__init__``: PE_CPU and the composite cap read it for every
            op, and a property call costs more than computing it here).
    """

    kind: str
    scope: Scope
    operands: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    out: TensorHandle | None = None

    def __init__(self, kind: str, scope: Scope, operands: dict = _DEFAULT, extra: dict = _DEFAULT,
                 out: TensorHandle | None = None):
        d = self.__dict__
        d["kind"], d["scope"], d["out"] = kind, scope, out
        d["operands"] = operands = {} if operands is _DEFAULT else operands
        d["extra"] = extra = {} if extra is _DEFAULT else extra
        d["logical_bytes"] = (1 + 1 + 1 + 8 * len(operands) + (8 if out is not None else 0)
                              + 1 + 4 * len(extra))

    @cached_attr
    def shape_sig(self) -> tuple:
        """``(kind, scope, operand names, (space, shape, bytes) per operand, out's or None)``:
        all of the op a timing-only stage plan depends on (kbframe.hw.tiling.plan_key).
        Computed once: an OpSpec and its handles' sizes never change, and the tl layer
        reuses OpSpecs that repeat every KV tile."""
        out = self.out
        return (self.kind, self.scope, tuple(self.operands),
                tuple([(h.space, h.shape, h.nbytes) for h in self.operands.values()]),
                None if out is None else (out.space, out.shape, out.nbytes))

    @cached_attr
    def byte_ranges(self) -> tuple:
        """``(reads, write)``: ``(space, lo, hi)`` of each operand, and of ``out`` or None,
        what PE_SCHEDULER's hazard check compares (DDD-0065 §8). Computed once per op."""
        out = self.out
        return (tuple([(h.space, *h.byte_range) for h in self.operands.values()]),
                None if out is None else (out.space, *out.byte_range))

    @cached_attr
    def primitive_hazard_ranges(self) -> tuple[list, list]:
        """:func:`hazard_ranges` of a primitive command of this op (computed once: opt3
        issues the same MATH ops on the same handles every KV tile)."""
        reads, write = self.byte_ranges
        return list(dict.fromkeys(reads)), [] if write is None else [write]


@dataclass(frozen=True, eq=False)
class CompositeCmd:
    """A fused command: flat ordered ``ops`` (≤ 1 GEMM), ``rw_handles`` for the
    cross-composite hazard tracker (ADR-0065 D6.3). ``id`` is the PE-local command id."""

    completion: Completion
    ops: tuple
    rw_handles: tuple = ()

    def __init__(self, completion: Completion, ops: tuple, rw_handles: tuple = ()):
        d = self.__dict__
        d["completion"], d["ops"], d["rw_handles"] = completion, ops, rw_handles

    @cached_attr
    def id(self) -> int:
        return self.completion.cmd_id

    @cached_attr
    def logical_bytes(self) -> int:
        """DDD-0065 §4.1: framing 4 + op count 1 + Σ op bytes + rw count 1 + 8/rw handle."""
        return 4 + 1 + sum([op.logical_bytes for op in self.ops]) + 1 + 8 * len(self.rw_handles)


@dataclass(frozen=True, eq=False)
class PrimitiveCmd:
    """A single-op command (opt3's DMA / GEMM / MATH primitives).

    ``logical_bytes`` = framing 4 + the op's bytes: no op count, no rw list (kbframe's
    reading of ADR-0064 D2 for non-composite commands).
    """

    completion: Completion
    op: OpSpec

    def __init__(self, completion: Completion, op: OpSpec):
        d = self.__dict__
        d["completion"], d["op"] = completion, op

    @cached_attr
    def id(self) -> int:
        return self.completion.cmd_id

    @cached_attr
    def ops(self) -> tuple:
        return (self.op,)

    @property
    def rw_handles(self) -> tuple:
        return ()

    @cached_attr
    def logical_bytes(self) -> int:
        return 4 + self.op.logical_bytes


def command_kind(cmd) -> str:
    """Short label of a command for logs: ``composite`` or the primitive op's kind."""
    return "composite" if isinstance(cmd, CompositeCmd) else cmd.op.kind


def hazard_ranges(cmd) -> tuple[list, list]:
    """Byte ranges ``[(space, lo, hi)]`` a command reads and writes, for the hazard
    tracker (DDD-0065 §8): reads are every op operand; writes every op ``out`` plus
    ``rw_handles``. Each range once (a composite names the same state handles in many
    ops), in first-seen order, writes starting with ``rw_handles``. A primitive's lists
    are its op's, shared by every command of that op: read them, never change them."""
    if cmd.__class__ is PrimitiveCmd:
        return cmd.op.primitive_hazard_ranges
    reads, writes = [], [(h.space, *h.byte_range) for h in cmd.rw_handles]
    for op in cmd.ops:
        r, w = op.byte_ranges
        reads += r
        if w is not None:
            writes.append(w)
    return list(dict.fromkeys(reads)), list(dict.fromkeys(writes))
