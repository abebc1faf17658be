"""``python -m kbframe``: Ctrl-C and SIGTERM are handled from before the imports
(kbframe.cli.stop)."""
from .cli.stop import entry

entry()
