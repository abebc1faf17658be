"""kbframe's error types. Every user mistake raises a subclass of :class:`KbframeError`;
the CLI prints its message on one line and exits non-zero (DESIGN.md decision 6)."""


class KbframeError(Exception):
    """Base of every error kbframe raises for bad input or an impossible run."""


class ConfigError(KbframeError):
    """A config value is missing, of the wrong type or out of range; names the key."""


class InputsError(KbframeError):
    """An inputs file is missing, unreadable or has inconsistent shapes; names the file."""


class ValidationError(KbframeError):
    """A command violates an emit-time invariant (ADR-0065 D6); names the op and the limit."""


class RecipeError(KbframeError):
    """A recipe descriptor is invalid; names the recipe file and the step."""


class TcmOverflowError(KbframeError):
    """A TCM allocation does not fit; names the request, the free bytes and the capacity."""


class DeadlockError(KbframeError):
    """The simulation ran out of events while a PE still waits; names the PE and the wait."""
