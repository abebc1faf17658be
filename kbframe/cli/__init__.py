"""The command line: ``python -m kbframe`` (kbframe.cli.main) and what it checks.

Importing this package installs kbframe.cli.hydra_guard: every config Hydra composes in this
process (the run's, a sweep's, each job's, in a launcher's worker too) is checked before
Hydra builds anything from it."""
from .hydra_guard import install as _install_guard

_install_guard()
