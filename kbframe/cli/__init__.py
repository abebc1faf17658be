"""The command line: ``python -m kbframe`` (kbframe.cli.main) and what it checks.

Importing kbframe.cli.main installs kbframe.cli.hydra_guard: every config Hydra composes in
this process (the run's, a sweep's, each job's, in a launcher's worker too) is checked before
Hydra builds anything from it. This package itself imports nothing, so that the command's
entry (kbframe.cli.entry) handles Ctrl-C and SIGTERM from before Hydra is imported."""
