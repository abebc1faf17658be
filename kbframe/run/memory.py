"""The process's memory, in one place: glibc's heap kept (:func:`tune_malloc`) and faulted
in ahead of a large run on the other core (:func:`prefault`), both by :func:`ahead` for a
run the pre-flight estimate finds large, in a process that :func:`allow` ed it (the
command's). Neither changes a result.

A model step's analyses make and free arrays of millions of records one after another. By
default glibc serves every allocation over 32 MiB with its own ``mmap`` and unmaps it when
freed, so each such array is new memory the kernel must zero page by page when it is first
touched (slowly on a virtual machine whose host reclaims free guest pages). Served from
the heap and never trimmed, freed arrays are reused; and the heap a run will need can be
touched once, by a thread on the core the simulation leaves idle, while it simulates.
Small runs are left to glibc's defaults: served from the heap, their arrays would fragment
it and raise a small run's peak (a data-mode rmsnorm_linear's by about a quarter).
"""
from __future__ import annotations

import ctypes
import threading

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
#: heap bytes :func:`prefault` touches per record a fast-forwarded run may hold: less than
#: such a run's analyses allocate at their peak (the held records, their moves and waits,
#: the critical path's and the op_log form's columns; Llama-3-70B's step at 32768 tokens
#: and batch 8, bounded at 14.0 million records, peaks at 4.1 GiB), so the heap touched
#: ahead is reused, not added to the peak
PEAK_BYTES_PER_HELD_RECORD = 200
#: :func:`prefault` touches at most this share of the memory the system has available
AVAILABLE_SHARE = 0.5
_CHUNK = 256 << 20  # one malloc, then its pages touched: the arena lock held only for the call

_libc = None  # glibc, once tune_malloc applied its options
_allowed = False  # this process may tune its memory for a large run (allow)


def allow() -> None:
    """Let :func:`ahead` tune this process's memory (the command's own process: not a
    library caller's, nor a test's)."""
    global _allowed
    _allowed = True


def ahead(nbytes: int) -> threading.Thread | None:
    """For a run the pre-flight estimate finds large (``nbytes``: the heap to touch), in a
    process that :func:`allow` ed it: :func:`tune_malloc`, then :func:`prefault`. None when
    nothing was started."""
    if not _allowed or nbytes < _CHUNK or not tune_malloc():
        return None
    return prefault(nbytes)


def tune_malloc() -> bool:
    """With glibc: serve large allocations from the heap, not one ``mmap`` each
    (``M_MMAP_MAX`` 0), never give the heap's free top back (``M_TRIM_THRESHOLD``
    ``(size_t) -1``), and one arena for every thread (``M_ARENA_MAX`` 1: what
    :func:`prefault`'s thread touches is the heap the run allocates from). The process
    keeps its peak until it exits. Returns whether it was applied (False: not glibc)."""
    global _libc
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc's alone
    except (OSError, AttributeError):
        return False
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, -1) and libc.mallopt(_M_ARENA_MAX, 1)):
        return False
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    libc.memset.restype, libc.memset.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    _libc = libc
    return True


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def prefault(nbytes: int) -> threading.Thread | None:
    """Touch ``nbytes`` of heap (at most :data:`AVAILABLE_SHARE` of the available memory)
    on a daemon thread and free it again, so the arrays the run makes later find it
    faulted in. Only after :func:`tune_malloc` (else None, nothing done); the thread, to
    join if one must. It never raises: a malloc that fails ends it early."""
    have = available_bytes()
    if _libc is None or have is None:
        return None
    nbytes = min(int(nbytes), int(have * AVAILABLE_SHARE))
    if nbytes < _CHUNK:
        return None
    t = threading.Thread(target=_touch, args=(_libc, nbytes), name="kbframe-prefault", daemon=True)
    t.start()
    return t


def _touch(libc, nbytes: int) -> None:
    held = []
    try:
        while nbytes > 0:
            n = min(_CHUNK, nbytes)
            p = libc.malloc(n)
            if not p:
                break
            held.append(p)
            libc.memset(p, 0, n)  # the pages faulted in here, the GIL released
            nbytes -= n
    finally:
        for p in held:
            libc.free(p)
