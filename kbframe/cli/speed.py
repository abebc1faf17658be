"""The whole command's speed tricks, in one place (a command that costs little
more than its simulation).

- :func:`one_compose`: Hydra composes the config twice per run, once only to learn whether
  ``hydra.mode`` is MULTIRUN (``Hydra.get_mode``, 0.15–0.3 s). When the command line cannot
  set the mode (no ``-m``, no ``+sweep=`` / ``+search=``, whose configs set it, no
  ``hydra.mode=`` and no config directory of the user's), the mode is RUN and the first
  compose is skipped; Hydra then adds ``hydra.mode=RUN`` itself.
- :func:`exit_now`: a run that made numpy arrays of a long context spends about a second
  freeing them at interpreter exit. After the streams are flushed, logging shut down and
  the atexit handlers run (launcher pools, submitit), the process ends without that.
- :func:`tune_gc`: the cyclic garbage collector runs a young collection every 700 new
  container objects; a run makes millions (simulation events, parsed op_log records,
  critical-path rows) and the collections that reach the older generations walk them
  again: a fifth to a quarter of a long run's time (decode_opt2 timing only at a 1M-token
  context 5.6 → 4.5 s, with data at 128K tokens 4.3 → 3.1 s). Reference counting still frees
  everything not in a cycle; cycles are collected less often. (``Engine.run`` also holds
  off full collections while it simulates, for any caller.)
- :func:`~kbframe.run.memory.allow`: a run the pre-flight estimate finds large may keep
  its arrays in glibc's heap, reused rather than faulted in anew, and have it faulted in
  ahead on the idle core (kbframe.run.memory).
"""
from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager

from ..files import stdout_gone
from ..run import memory

#: young-generation threshold of :func:`tune_gc` (Python's default: 700 allocations)
GC_YOUNG = 100_000

#: config groups whose configs set hydra.mode (conf/sweep/, conf/search/)
_MODE_GROUPS = ("sweep", "search")


def mode_is_run(argv: list[str]) -> bool:
    """True when nothing on the command line can make the run a multirun."""
    for a in argv:
        if a in ("-m", "--multirun", "-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name") \
                or a.startswith(("--config-dir=", "--config-path=", "--config-name=", "-cd", "-cp", "-cn")):
            return False
        key = a.partition("=")[0].lstrip("+~")
        if key in _MODE_GROUPS or key == "hydra.mode" or key.startswith(("hydra.searchpath", "hydra/")):
            return False
    return True


@contextmanager
def one_compose(argv: list[str]):
    """Within the block, Hydra's ``get_mode`` answers "no mode set" without composing
    when :func:`mode_is_run`; otherwise Hydra's own."""
    from ..internals import hydra_class
    Hydra = hydra_class()
    original = Hydra.get_mode
    if mode_is_run(argv):
        Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = original


def exit_now(code) -> None:
    """End the process with ``code`` (SystemExit's: None → 0, text → printed, 1) after
    flushing the standard streams, shutting logging down and running the atexit handlers,
    without freeing the interpreter's objects."""
    import logging

    from ..internals import run_exitfuncs
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        logging.shutdown()
        run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more to say
                pass
        os._exit(code)


def tune_gc() -> None:
    """Collect cycles every :data:`GC_YOUNG` allocations instead of 700, and leave the
    objects that exist now (modules, classes: everything imported) out of every later
    collection (``gc.freeze``)."""
    gc.freeze()
    _, mid, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, mid, old)


def main_then_exit(main) -> None:
    """:func:`tune_gc`, :func:`~kbframe.run.memory.allow`, ``main()``, then :func:`exit_now` with its
    exit status (an exception other than SystemExit, e.g. Ctrl-C, propagates as usual)."""
    tune_gc()
    memory.allow()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    except BrokenPipeError:  # the reader of stdout went away (`... --help | head`): stop quietly
        code = stdout_gone()
    exit_now(code)
