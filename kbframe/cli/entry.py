"""The command (``python -m kbframe``, the ``kbframe`` script): Ctrl-C and SIGTERM handled
from before Hydra, numpy or kbframe's layers are imported (kbframe.cli.stop), then
kbframe's imports and main (kbframe.cli.main), and a fast exit (kbframe.cli.speed)."""
from __future__ import annotations

import os
import sys

from . import stop


def entry() -> None:
    """Run the command; a Ctrl-C or SIGTERM outside the run's own handling (the imports, the
    command's very start or end) ends it with one line and exit 130 or 143."""
    stop.install()
    try:
        from .main import main
        from .speed import main_then_exit
        main_then_exit(main)
    except KeyboardInterrupt as e:
        status = stop.outside_main(e)
        sys.stderr.flush()
        os._exit(status)
