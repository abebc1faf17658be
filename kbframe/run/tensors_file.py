"""``tensors.npz`` of a data-mode run, written beside its simulation (issue 16).

The inputs and the float64 reference are known before the simulation starts; writing
them (``np.lib.format.write_array`` into an uncompressed zip, as ``np.savez`` does) and
computing the reference are numpy work that releases the GIL, so a thread does both on
the second core while the main thread simulates, sanitizes and writes the trace. The
kernel's outputs are added last. The file holds the same arrays in the same order as
``np.savez(inputs…, references…, scalars…, outputs…)``.

BLAS: the caller holds ``threadpool_limits(1)`` for the whole time the thread runs (the
limit is process-wide; a second, nested limit in the thread could restore the other's
setting out of order).
"""
from __future__ import annotations

import threading
import zipfile

import numpy as np


class TensorsFile:
    """Writes ``path`` (a staged temporary): ``first`` (name → array) and then the arrays
    ``compute()`` returns (the references), in a thread started here; :meth:`finish` adds
    the ``last`` arrays and closes the file. :meth:`abandon` (also on leaving a ``with``
    block) stops the thread after the entry being written and closes the file (the caller
    removes it).

    Raises (from :meth:`results` or :meth:`finish`): whatever ``compute`` or the writing
    raised in the thread (OSError for a full disk, KeyboardInterrupt…), re-raised in the
    caller's thread.
    """

    def __init__(self, path, first: dict, compute):
        self.path = path
        self._zip = zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._first, self._compute = first, compute
        self._stop = False
        self._error: BaseException | None = None
        self._computed: dict | None = None
        self._thread = threading.Thread(target=self._body, name="tensors.npz", daemon=True)
        self._thread.start()

    def _add(self, name: str, array) -> None:
        with self._zip.open(name + ".npy", "w", force_zip64=True) as f:
            np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)

    def _body(self) -> None:
        try:
            for name, array in self._first.items():
                if self._stop:
                    return
                self._add(name, array)
            computed = self._compute()
            for name, array in computed.items():
                if self._stop:
                    return
                self._add(name, array)
            self._computed = computed
        except BaseException as e:  # handed to the caller's thread
            self._error = e

    def results(self) -> dict:
        """What ``compute`` returned, once it and its entries are written."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._computed

    def finish(self, last: dict):
        """Add ``last`` after the thread's entries, close the file and return its path."""
        self.results()
        for name, array in last.items():
            self._add(name, array)
        self._zip.close()
        return self.path

    def __enter__(self) -> "TensorsFile":
        return self

    def __exit__(self, *exc) -> None:
        """Whatever happened: the thread is stopped and joined, the file closed."""
        self.abandon()

    def abandon(self) -> None:
        """Stop the thread after its current entry and close the file (no error raised)."""
        self._stop = True
        self._thread.join()
        try:
            self._zip.close()  # a second close does nothing
        except (OSError, ValueError):  # a full disk or an entry cut short: the file is dropped anyway
            pass
