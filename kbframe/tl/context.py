"""The tl programming model: what a kernel (a plain Python function, Triton-like, no
``yield``) calls to emit commands on its PE. The compiler analog (DESIGN.md layers): it
builds commands, lowers recipes into flat OpSpecs (:mod:`kbframe.tl.lowering`) and validates
them at emit.

Results are :class:`~kbframe.ir.handles.TensorHandle` objects whose ``pending`` completion
is the producing command (ADR-0062 lazy pattern). Kernels never wait for a value unless
they call :meth:`TL.wait`; RAW hazards between commands are PE_SCHEDULER's job.
"""
from __future__ import annotations

import itertools

from ..ir import micro_ops
from ..ir.commands import CompositeCmd, OpSpec, PrimitiveCmd, Scope
from ..errors import ValidationError, need
from ..ir.protocol import Dispatch, Wait, request
from ..ir.handles import Completion, TensorHandle, itemsize
from .lowering import Lowering


class TL:
    """The tl context of one PE.

    Args:
        pe: the PE the kernel runs on (its TCM allocator, PE_CPU cap, numerics).
        hbm: the engine's HBM tensors by name (``tl.ref`` looks them up).
        recipes: validated recipes by name (``tl.composite(prologue=...)``).
        dtype: timing dtype of TCM tensors (``float16``).
    """

    def __init__(self, pe, hbm: dict, recipes: dict | None = None, dtype: str = "float16"):
        self.pe = pe
        self.hbm = hbm
        self.recipes = recipes or {}
        self.dtype = dtype
        self.last_cmd_id = 0  # the id of the latest command this context dispatched
        self.phases: list = []  # (name, first cmd id, last cmd id, info), see phase
        self._scope_depth = 0
        self._arena_slots: dict = {}
        self._scope_scratch: dict = {}  # (key, address) -> handle; see _scope_handle
        self._math_ops: dict = {}  # (kind, out, *inputs) -> OpSpec; see math
        self._lower = Lowering(self.recipes, self._scratch)

    def steps(self, key: str, n: int, rings: tuple = ()):
        """The iterations ``0 .. n - 1`` of a loop along the workload's periodic axis
        ``key`` (a bench key: the KV length for KV tiles, ``"layers"``). A timing-only
        run that fast-forwards in one simulation (kbframe.sim.steady) may leave out a
        steady stretch of them, of a multiple of every ring size in ``rings``: the loop
        body must lower every iteration alike but for the buffers it takes by its index
        modulo those sizes."""
        steady = self.pe.steady
        return range(n) if steady is None else steady.steps(self, key, n, rings)

    # ---- handles -------------------------------------------------------------------
    def ref(self, name: str) -> TensorHandle:
        """The HBM tensor ``name`` (``space="hbm"``; streamed by DMA when used)."""
        try:
            return self.hbm[name]
        except KeyError:
            raise ValidationError(f"tl.ref: no HBM tensor '{name}' (have: {', '.join(sorted(self.hbm))})") from None

    def empty(self, shape, name: str = "t") -> TensorHandle:
        """Allocate an uninitialised TCM tensor in the active scratch_scope (or the arena).

        In a scope, a tensor of the same shape and name at the same address as one of an
        earlier scope (the next KV tile's) is the same memory, so it gets the same handle
        (:meth:`_scope_handle`); uninitialised, it holds what that memory last held."""
        return self._alloc(tuple(map(int, shape)), name)

    def _alloc(self, shape: tuple, name: str) -> TensorHandle:
        """:meth:`empty` for a shape that is already a tuple of ints."""
        addr = self.pe.tcm.alloc(_nbytes(shape, self.dtype), name)
        if self._scope_depth > 0:
            return self._scope_handle(("empty", shape, name), shape, name, addr)
        return self._handle(shape, name, addr)

    def _scope_handle(self, key: tuple, shape: tuple, name: str, addr: int) -> TensorHandle:
        """The handle of a scope allocation: scopes of successive KV tiles allocate the same
        tensors at the same addresses, and reusing their handles lets the ops naming them
        be reused too (:meth:`math`, :meth:`Lowering.expand_recipe`), with their sizes,
        byte ranges and stage plans. Hazards compare addresses, so this changes no order."""
        key = (key, addr)
        h = self._scope_scratch.get(key)
        if h is None:
            if len(self._scope_scratch) >= 1024:
                self._scope_scratch.clear()
            h = self._scope_scratch[key] = self._handle(shape, name, addr)
        return h

    def _handle(self, shape: tuple, name: str, addr: int) -> TensorHandle:
        """A new TCM handle for an allocation at ``addr``, with its storage in data mode."""
        h = TensorHandle(name, shape, self.dtype, "tcm", addr, f"tcm{self.pe.index}.{next(_buf_ids)}", shape)
        self.pe.numerics.allocate(h)
        return h

    def zeros(self, shape, name: str = "zeros") -> TensorHandle:
        """A TCM tensor filled with 0 (one MATH ``fill`` command)."""
        return self.full(shape, 0.0, name)

    def full(self, shape, value: float, name: str = "full") -> TensorHandle:
        """A TCM tensor filled with ``value`` (one MATH ``fill`` command)."""
        h = self.empty(shape, name)
        self._primitive(OpSpec("fill", Scope.KERNEL, {}, {"value": float(value)}, h), h)
        return h

    def scratch_scope(self) -> "_ScratchScope":
        """``with tl.scratch_scope():`` — TCM allocations inside are freed when the scope
        exits (ADR-0063)."""
        return _ScratchScope(self)

    def wait(self, h: TensorHandle) -> TensorHandle:
        """Block PE_CPU until ``h``'s producing command completes."""
        if h.pending is not None and not h.pending.done:
            request(Wait(h.pending))
        return h

    def value(self, h: TensorHandle):
        """Wait for ``h`` and return its numbers (data mode only)."""
        self.wait(h)
        return self.pe.numerics.read(h).copy()

    # ---- primitive commands ----------------------------------------------------------
    def _completion(self, label: str) -> Completion:
        self.last_cmd_id += 1
        return Completion(self.last_cmd_id, label)

    # ---- annotations -----------------------------------------------------------------
    def phase(self, name: str, **info) -> "_Phase":
        """``with tl.phase("qkv"):`` — the commands dispatched inside are one occurrence of
        phase ``name`` (like an NVTX range); ``info`` is kept with it (plain values). The
        run reports each phase's span from its commands' records (kbframe.run.phases).
        Phases may nest; they never change what is dispatched."""
        return _Phase(self, name, info)

    def link_figures(self, src_pe: int, dst_pe: int) -> tuple[int, float]:
        """``(latency_ps, gbps)`` of the IPCQ link from PE ``src_pe`` to PE ``dst_pe`` (the
        config's link figures, kbframe.hw.ipcq): what an α-β model of a collective uses."""
        fabric = self.pe.fabric
        for pe in (src_pe, dst_pe):
            if not (isinstance(pe, int) and 0 <= pe < fabric.n_pes):
                raise ValidationError(f"tl.link_figures: PE{pe} is not a PE of this hardware (PEs 0..{fabric.n_pes - 1})")
        latency_ps, gbps, _ = fabric.figures(src_pe, dst_pe)
        return latency_ps, gbps

    def math_ps(self, n_elements: int) -> int:
        """Duration of one MATH stage over ``n_elements`` on this PE, ps (its unit's rule)."""
        unit = self.pe.by_role["math"]
        return unit.duration_ps(_Sized(n_elements))

    def reshape(self, h: TensorHandle, shape) -> TensorHandle:
        """The same bytes as ``h`` (a whole, untransposed tensor) seen with another shape of
        as many elements (row-major, as a contiguous buffer reshapes for free): e.g. the
        QKV projection's ``(B, heads·d)`` as ``(B·heads, d)``. Writes through either handle
        are seen by the other; hazards compare bytes, so they order both.

        Raises:
            ValidationError: a row window or transposed view, or a different element count.
        """
        shape = tuple(int(s) for s in shape)
        if h.rows is not None or h.trans:
            raise ValidationError(f"tl.reshape: {h} must be a whole tensor (not a row window or a transpose)")
        n = 1
        for s in shape:
            n *= s
        if n != h.n_elements or min(shape, default=0) < 1:
            raise ValidationError(f"tl.reshape: {h} has {h.n_elements} elements, shape {shape} has {n}")
        out = TensorHandle(f"{h.name}{list(shape)}", shape, h.dtype, h.space, h.addr, f"{h.buf}~{shape}", shape,
                           None, False, h.pending)
        self.pe.numerics.alias(out, h)
        return out

    def _dispatch(self, cmd) -> None:
        request(Dispatch(cmd))

    def _primitive(self, op: OpSpec, out: TensorHandle) -> TensorHandle:
        c = self._completion(op.kind)
        self._dispatch(PrimitiveCmd(c, op))
        out.pending = c
        return out

    def load(self, src: TensorHandle, out: TensorHandle | None = None) -> TensorHandle:
        """DMA ``src`` (HBM) into TCM; returns the TCM handle (new unless ``out``)."""
        if src.space != "hbm":
            raise ValidationError(f"tl.load: source {src} must be in HBM")
        out = out if out is not None else self.empty(src.shape, f"{src.name}@tcm")
        _same_shape("tl.load", src, out)
        return self._primitive(OpSpec("load", Scope.KERNEL, {"src": src}, {}, out), out)

    def store(self, dst: TensorHandle, src: TensorHandle) -> TensorHandle:
        """DMA ``src`` (TCM) to ``dst`` (HBM)."""
        if not (dst.space == "hbm" and src.space == "tcm"):
            raise ValidationError(f"tl.store: needs TCM {src} → HBM {dst}")
        _same_shape("tl.store", src, dst)
        return self._primitive(OpSpec("store", Scope.KERNEL, {"src": src}, {}, dst), dst)

    # ---- PE↔PE queues (IPCQ, kbframe.hw.ipcq) ------------------------------------------------
    def _peer(self, what: str, role: str, pe: int) -> int:
        fabric = self.pe.fabric
        if not (isinstance(pe, int) and 0 <= pe < fabric.n_pes) or pe == self.pe.index:
            raise ValidationError(f"{what}: PE{pe} is not another PE of this hardware (PEs 0..{fabric.n_pes - 1}, "
                                  f"this is PE{self.pe.index})")
        if role not in self.pe.by_role:
            raise ValidationError(f"{what}: PE{self.pe.index} has no unit serving role '{role}' "
                                  f"(a hardware with IPCQ, e.g. hardware=cube)")
        return pe

    def send(self, h: TensorHandle, dst_pe: int) -> None:
        """Send TCM tensor ``h`` to PE ``dst_pe`` (one command; it completes when the data has
        left; a full link queue blocks it). Raises ValidationError: not TCM, no such PE."""
        self._peer("tl.send", "ipcq_send", dst_pe)
        if h.space != "tcm":
            raise ValidationError(f"tl.send: {h} must be in TCM (tl.load it first)")
        op = OpSpec("send", Scope.KERNEL, {"src": h}, {"peer": int(dst_pe)}, None)
        self._dispatch(PrimitiveCmd(self._completion("send"), op))

    def recv_async(self, shape, src_pe: int, name: str = "recv", out: TensorHandle | None = None) -> TensorHandle:
        """Receive the next message from PE ``src_pe`` (FIFO per link) into a new TCM tensor of
        ``shape`` (or into ``out``, a TCM tensor or window of that shape); the kernel goes
        on, and commands reading the result wait for it."""
        self._peer("tl.recv", "ipcq_recv", src_pe)
        if out is None:
            out = self.empty(shape, name)
        elif out.space != "tcm" or tuple(out.shape) != tuple(shape):
            raise ValidationError(f"tl.recv: out {out} must be a TCM tensor of shape {tuple(shape)}")
        return self._primitive(OpSpec("recv", Scope.KERNEL, {}, {"peer": int(src_pe)}, out), out)

    def recv(self, shape, src_pe: int, name: str = "recv") -> TensorHandle:
        """:meth:`recv_async`, then block the kernel until the data has arrived."""
        return self.wait(self.recv_async(shape, src_pe, name))

    def dot(self, a: TensorHandle, b: TensorHandle, out: TensorHandle | None = None) -> TensorHandle:
        """GEMM ``a (M, K) @ b (K, N)`` → ``(M, N)``; ``b`` may be a transposed view."""
        M, K = a.shape
        K2, N = b.shape
        if K != K2:
            raise ValidationError(f"tl.dot: inner dimensions differ: {a} @ {b}")
        out = out if out is not None else self.empty((M, N), "dot")
        if out.shape != (M, N):
            raise ValidationError(f"tl.dot: out {out} must have shape {(M, N)}")
        op = OpSpec("gemm", Scope.KERNEL, {"a": a, "b": b}, {"m": M, "k": K, "n": N}, out)
        return self._primitive(op, out)

    def math(self, kind: str, *inputs: TensorHandle, out: TensorHandle | None = None, **extra) -> TensorHandle:
        """One MATH micro-op from :mod:`kbframe.ir.micro_ops` as a primitive command."""
        try:
            spec = micro_ops.get(kind)
        except KeyError as e:
            raise ValidationError(f"tl.math: {e.args[0]}") from None
        if len(inputs) != len(spec.slots):
            raise ValidationError(f"tl.{kind}: takes {len(spec.slots)} inputs, got {len(inputs)}")
        if spec.extras:
            missing = [k for k in spec.extras if k not in extra]
            if missing:
                raise ValidationError(f"tl.{kind}: missing scalar(s) {missing}")
        try:
            shape = spec.shape(*[h.shape for h in inputs])
        except ValueError as e:
            raise ValidationError(f"tl.{kind}: {e}") from None
        out = out if out is not None else self.empty(shape, kind)
        if out.space != "tcm":
            raise ValidationError(f"tl.{kind}: MATH output must be TCM, got {out}")
        if tuple(out.shape) != tuple(shape):
            raise ValidationError(f"tl.{kind}: out {out} must have shape {shape}")
        if extra:
            # ``extra`` is this call's own ``**`` dict: the OpSpec keeps it without a copy
            op = OpSpec(kind, Scope.KERNEL, dict(zip(spec.slots, inputs)), extra, out)
        else:  # the same op on the same handles (each KV tile's, _scope_handle) is one OpSpec
            key = (kind, out, *inputs)
            op = self._math_ops.get(key)
            if op is None:
                if len(self._math_ops) >= 1024:
                    self._math_ops.clear()
                op = self._math_ops[key] = OpSpec(kind, Scope.KERNEL, dict(zip(spec.slots, inputs)), {}, out)
        return self._primitive(op, out)

    def rmax(self, x, out=None):
        """Row max ``(rows, N) → (rows, 1)``."""
        return self.math("rmax", x, out=out)

    def rsum(self, x, out=None):
        """Row sum ``(rows, N) → (rows, 1)``."""
        return self.math("rsum", x, out=out)

    def maximum(self, a, b, out=None):
        """Elementwise max."""
        return self.math("max_elem", a, b, out=out)

    def exp_diff(self, a, b, out=None):
        """``exp(a − b)`` with broadcasting (``b`` may be a ``(rows, 1)`` row vector)."""
        return self.math("exp_diff", a, b, out=out)

    def fma(self, a, b, c, out=None):
        """``a · b + c``."""
        return self.math("fma", a, b, c, out=out)

    def mul_bcast(self, a, b, out=None):
        """``a · b`` with broadcasting."""
        return self.math("mul_bcast", a, b, out=out)

    def div_bcast(self, a, b, out=None):
        """``a / b`` with broadcasting."""
        return self.math("div_bcast", a, b, out=out)

    def add(self, a, b, out=None):
        """``a + b``."""
        return self.math("add", a, b, out=out)

    def copy(self, src, out=None):
        """Copy ``src`` into ``out``."""
        return self.math("copy", src, out=out)

    def scale(self, x, factor: float, out=None):
        """``x · factor``."""
        return self.math("scale", x, out=out, factor=float(factor))

    # ---- composite (ADR-0065 D1–D8, DDD-0065 §6) ---------------------------------------
    def composite(self, op: str | None = "gemm", a: TensorHandle | None = None,
                  b: TensorHandle | None = None, out: TensorHandle | None = None,
                  out_ptr: str | None = None, prologue=(), epilogue=()) -> TensorHandle | None:
        """Emit one :class:`CompositeCmd` (DDD-0065 §6 steps 1–10) and return its output.

        Args:
            op: ``"gemm"`` (head GEMM ``a @ b``) or None (a composite of prologue ops only).
            a, b: GEMM operands; ``a`` is auto-bound to a prologue recipe's primary_out.
            out: output handle (HBM → DMA_WRITE, TCM → stays on chip); ``out_ptr`` names an
                HBM tensor as shorthand; omitted → auto-allocated in TCM.
            prologue: ``[{"op": recipe, <operand>: handle, ...}]`` run before the GEMM.
            epilogue: ``[{"op": kind, "other": handle, <scalar>: value, "scope": ...}]``.
        Returns:
            The output handle (pending on this command), chainable like ``tl.dot``'s.
        Raises:
            ValidationError: unknown recipe or epilogue op, missing/extra recipe operand,
                HBM recipe operand ("MATH operand must be TCM", D6.7), explicit ``a`` with a
                primary_out recipe ("auto-bind conflict", D6.6), two GEMMs (D6.1), over
                the size cap (ADR-0064 D7).
        """
        ops, rw, produced = [], [], []
        primary = None
        n_gemm = 0
        for item in prologue:
            p_ops, p_rw, p_out, p_gemm = self._lower.expand_recipe(item if type(item) is dict else dict(item))
            ops += p_ops
            rw += p_rw
            n_gemm += p_gemm
            produced.append(p_out)
            if p_out is not None:
                primary = p_out
        if op == "gemm":
            if a is not None and primary is not None:
                raise ValidationError(
                    f"auto-bind conflict: prologue recipe declares primary_out '{primary.name}', "
                    f"which binds to the GEMM's a, but a={a} was also given (ADR-0065 D6.6)")
            a = a if a is not None else primary
            need(a is not None and b is not None, "tl.composite: op='gemm' needs a and b (or a primary_out)")
            M, K = a.shape
            if b.shape[0] != K:
                raise ValidationError(f"tl.composite: GEMM inner dimensions differ: {a} @ {b}")
            N = b.shape[1]
            if out is None and out_ptr is not None:
                out = self.ref(out_ptr)
            if out is None:
                out = self.empty((M, N), "composite_out")
            if tuple(out.shape) != (M, N):
                raise ValidationError(f"tl.composite: out {out} must have shape {(M, N)}")
            ops.append(OpSpec("gemm", Scope.KERNEL, {"a": a, "b": b}, {"m": M, "k": K, "n": N}, out))
            n_gemm += 1
            for item in epilogue:
                e_op, accumulates = self._lower.epilogue(item if type(item) is dict else dict(item), out)
                ops.append(e_op)
                if accumulates:
                    rw.append(out)  # accumulate into out (DDD-0065 §6 step 7)
        elif op is None:
            need(not epilogue, "tl.composite: an epilogue needs a GEMM (op='gemm')")
            need(bool(prologue), "tl.composite: nothing to do (no op, no prologue)")
        else:
            raise ValidationError(f"tl.composite: op must be 'gemm' or None, got '{op}'")
        if n_gemm > 1:  # epilogue kinds are never "gemm": prologue GEMMs plus the head one
            raise ValidationError(f"two GEMMs in one composite ({n_gemm} gemm ops in "
                                  f"[{', '.join(o.kind for o in ops)}]); at most one (ADR-0065 D6.1)")
        rw_handles = tuple(dict.fromkeys(rw))
        cmd = CompositeCmd(self._completion("composite"), tuple(ops), rw_handles)
        self.pe.cpu.check_cap(cmd)
        self._dispatch(cmd)
        done = cmd.completion
        for h in rw_handles:
            h.pending = done
        for h in produced:
            if h is not None:
                h.pending = done
        if out is not None:
            out.pending = done
        return out if op == "gemm" else primary

    def _scratch(self, name: str, arena_key: tuple, shape: tuple) -> TensorHandle:
        """Recipe scratch: in the active scratch_scope, else a persistent arena slot reused
        by every call with the same recipe, slot and shape (ADR-0065 open item 2)."""
        if self._scope_depth > 0:
            # the recipe check makes every scratch slot written before it is read, so a
            # reused handle (the same address) never shows an earlier tile's numbers
            addr = self.pe.tcm.alloc(_nbytes(shape, self.dtype), name)
            return self._scope_handle(arena_key, shape, name, addr)
        h = self._arena_slots.get(arena_key)
        if h is None:
            h = self._arena_slots[arena_key] = self._alloc(shape, name)
        return h


class _Phase:
    """The context manager of :meth:`TL.phase`."""

    __slots__ = ("tl", "name", "info", "first")

    def __init__(self, tl: TL, name: str, info: dict):
        self.tl, self.name, self.info = tl, name, info

    def __enter__(self) -> None:
        self.first = self.tl.last_cmd_id + 1

    def __exit__(self, *exc) -> None:
        if self.tl.last_cmd_id >= self.first:
            self.tl.phases.append((self.name, self.first, self.tl.last_cmd_id, self.info))


class _Sized:
    """A stand-in stage of ``n_elements`` for :meth:`TL.math_ps` (a unit's rule reads its size)."""

    __slots__ = ("n_elements", "nbytes", "flops")

    def __init__(self, n: int):
        self.n_elements, self.nbytes, self.flops = int(n), 0, 0


class _ScratchScope:
    """The context manager of :meth:`TL.scratch_scope` (a class: kernels open one per KV
    tile, and a generator-based one costs several times more)."""

    __slots__ = ("tl",)

    def __init__(self, tl: TL):
        self.tl = tl

    def __enter__(self) -> None:
        self.tl.pe.tcm.push_scope()
        self.tl._scope_depth += 1

    def __exit__(self, et, *exc) -> None:
        if et is None:  # an error or an interrupt abandons the kernel and its TCM: nothing to free
            self.tl._scope_depth -= 1
            self.tl.pe.tcm.pop_scope()


_buf_ids = itertools.count(1)


def _nbytes(shape, dtype) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * itemsize(dtype)


def _same_shape(what: str, x: TensorHandle, y: TensorHandle) -> None:
    if tuple(x.shape) != tuple(y.shape):
        raise ValidationError(f"{what}: shapes differ: {x} vs {y}")
