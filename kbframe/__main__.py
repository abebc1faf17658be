"""``python -m kbframe``: Ctrl-C and SIGTERM are handled from before the imports
(kbframe.cli.entry, kbframe.cli.stop)."""
from .cli.entry import entry

entry()
