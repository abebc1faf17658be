"""A tqdm progress bar for a long simulation, counted in the workload's units of progress.

PE_CPU calls ``cpu.progress(cmd)`` after each dispatch when the attribute is set (one
``is not None`` test per dispatch when it is not). :class:`TileProgress` looks at the
command's HBM operands and output and advances to the furthest row of the workload's
progress tensor a command names (``Workload.progress_stream``: K for decode), so the bar
reads "KV tile j of n" for any kernel that streams it in row windows; a kernel that does
not just sees the bar jump to done at the end.

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
        self.rows = 0
        self.commands = 0
        self.bar = tqdm(total=self.total, unit=unit, desc=desc, file=file or sys.stderr,
                        leave=leave, dynamic_ncols=True, mininterval=0.2)

    def __call__(self, cmd) -> None:
        self.commands += 1
        rows = self.rows
        for op in getattr(cmd, "ops", ()):
            for h in op.operands.values():
                if getattr(h, "buf", None) == self.buf and h.rows is not None and h.rows[1] > rows:
                    rows = h.rows[1]
            out = op.out
            if out is not None and getattr(out, "buf", None) == self.buf and out.rows is not None \
                    and out.rows[1] > rows:
                rows = out.rows[1]
        if rows > self.rows:
            self.rows = rows
            n = min(self.total, -(-rows // self.tile))
            if n > self.bar.n:
                self.bar.update(n - self.bar.n)

    def close(self) -> None:
        if self.bar.n < self.total:
            self.bar.update(self.total - self.bar.n)
        self.bar.close()


@contextmanager
def attach(cpu, flag: bool, stream_handle, n_units: int, rows: int, **kw):
    """Set ``cpu.progress`` to a :class:`TileProgress` for the duration of the block when
    :func:`enabled`; otherwise leave it None (no cost). The bar is closed on the way out,
    also on an error or Ctrl-C."""
    if not enabled(flag, kw.get("file")):
        yield None
        return
    prog = TileProgress(stream_handle.buf, n_units, rows, **kw)
    cpu.progress = prog
    try:
        yield prog
    finally:
        cpu.progress = None
        prog.close()
