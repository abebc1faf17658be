"""A tqdm progress bar for a long simulation, counted in the workload's units of progress.

PE_CPU calls ``cpu.progress(cmd)`` after each dispatch when the attribute is set (one
``is not None`` test per dispatch when it is not). :class:`TileProgress` looks at the
command's HBM operands and output and advances to the rows of the workload's progress
tensor the commands have covered (``Workload.progress_stream``: K for decode), so the bar
reads "KV tile j of n" for any kernel that streams it in row windows; a kernel that does
not just sees the bar jump to done at the end. On many PEs every PE's PE_CPU reports, and
the bar counts the rows each PE covered (from the first row it named to the furthest),
summed over the PEs.

The bar is shown only on a terminal (stdout and stderr both ttys) and when
``run.progress`` is true; it is written to stderr and removed when the run ends, so the
printed summary and redirected output stay clean.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager


def enabled(flag: bool, stream=None) -> bool:
    """Whether to show a bar: ``run.progress`` and stdout (and ``stream``, stderr by
    default) are terminals."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(flag) and sys.stdout.isatty() and stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class TileProgress:
    """Callable hook for PE_CPU: advances a tqdm bar to the unit of progress the kernel reached.

    Args:
        stream_buf: storage key (``TensorHandle.buf``) of the progress tensor.
        n_units: units of progress in the run; rows: rows of that tensor per unit.
        unit: the unit's name (the bar's label).
        file: where tqdm writes (stderr); leave: keep the bar after close.
    """

    def __init__(self, stream_buf: str, n_units: int, rows: int, unit: str = "tile", file=None,
                 leave: bool = False, desc: str = "simulating"):
        from tqdm import tqdm
        self.buf = stream_buf
        self.tile = max(1, int(rows))
        self.total = int(n_units)
        self.rows = 0      # rows covered, summed over the PEs
        self.span: dict = {}  # pe -> (first row it named, furthest row end)
        self.commands = 0
        self.bar = tqdm(total=self.total, unit=unit, desc=desc, file=file or sys.stderr,
                        leave=leave, dynamic_ncols=True, mininterval=0.2)

    def __call__(self, cmd, pe: int = 0) -> None:
        self.commands += 1
        lo, hi = span = self.span.get(pe, (None, 0))
        buf = self.buf
        for op in getattr(cmd, "ops", ()):
            for h in (*op.operands.values(), op.out):
                if h is not None and getattr(h, "buf", None) == buf and h.rows is not None:
                    r0, r1 = h.rows
                    if r1 > hi:
                        hi = r1
                    if lo is None or r0 < lo:
                        lo = r0
        if (lo, hi) != span:
            self.rows += (hi - lo) - (span[1] - span[0] if span[0] is not None else 0)
            self.span[pe] = (lo, hi)
            n = min(self.total, -(-self.rows // self.tile))
            if n > self.bar.n:
                self.bar.update(n - self.bar.n)

    def close(self) -> None:
        if self.bar.n < self.total:
            self.bar.update(self.total - self.bar.n)
        self.bar.close()


@contextmanager
def attach(cpus, flag: bool, stream_handle, n_units: int, rows: int, **kw):
    """Set ``cpu.progress`` of ``cpus`` (one PE_CPU, or every PE's) to a :class:`TileProgress`
    for the duration of the block when :func:`enabled`; otherwise leave it None (no cost).
    The bar is closed on the way out, also on an error or Ctrl-C."""
    if not enabled(flag, kw.get("file")):
        yield None
        return
    from functools import partial
    prog = TileProgress(stream_handle.buf, n_units, rows, **kw)
    many = isinstance(cpus, (list, tuple))
    cpus = list(cpus) if many else [cpus]
    for i, cpu in enumerate(cpus):
        cpu.progress = partial(prog, pe=i) if many and len(cpus) > 1 else prog
    try:
        yield prog
    finally:
        for cpu in cpus:
            cpu.progress = None
        prog.close()
