"""kbframe's error types. Every user mistake raises a subclass of :class:`KbframeError`;
the CLI prints its message on one line and exits non-zero (DESIGN.md decision 6)."""


class KbframeError(Exception):
    """Base of every error kbframe raises for bad input or an impossible run. Its message
    is always one line: a multi-line cause (e.g. from an import) is joined with "; "."""

    def __str__(self) -> str:
        text = super().__str__()
        return "; ".join(ln.strip() for ln in text.splitlines() if ln.strip()) if "\n" in text else text


class ConfigError(KbframeError):
    """A config value is missing, of the wrong type or out of range; names the key."""


class TimeBaseError(ConfigError):
    """A duration or simulated time beyond the integer time base (kbframe.timebase.MAX_PS);
    raised by the conversions, reported naming the unit or key that made it."""


class HbmCapacityError(ConfigError):
    """A run's HBM tensors (weights, KV cache, ...) exceed the HBM they must fit: the
    topology's or one cube's. ``need_bytes`` and ``have_bytes`` give both counts."""

    def __init__(self, msg: str, need_bytes: int, have_bytes: int):
        super().__init__(msg)
        self.need_bytes, self.have_bytes = int(need_bytes), int(have_bytes)


class RecordBudgetError(ConfigError):
    """A run would hold more op_log records than ``run.max_records`` (or this machine's
    memory); names the count and how to raise the budget or shrink the run."""


class InputsError(KbframeError):
    """An inputs file is missing, unreadable or has inconsistent shapes; names the file."""


class ValidationError(KbframeError):
    """A command violates an emit-time invariant (ADR-0065 D6); names the op and the limit."""


def need(cond: bool, msg: str) -> None:
    """Raise ValidationError(msg) unless ``cond`` (for constant messages: an f-string
    argument would be formatted on every call, also when nothing is wrong)."""
    if not cond:
        raise ValidationError(msg)


class RecipeError(KbframeError):
    """A recipe descriptor is invalid; names the recipe file and the step."""


class TcmOverflowError(KbframeError):
    """A TCM allocation does not fit; names the request, the free bytes and the capacity."""


class DeadlockError(KbframeError):
    """The simulation ran out of events while a PE still waits; names the PE and the wait."""


class SanitizerError(KbframeError):
    """The simulation sanitizer (``run.check``) found a schedule real hardware could not
    have run; names the rule, the commands and the simulated times (kbframe.sim.sanitizer)."""

    def __init__(self, message: str, rule: str = ""):
        super().__init__(message)
        self.rule = rule

    def __reduce__(self):  # pickled with its rule (a sweep's worker process sends it back)
        return type(self), (str(self), self.rule)


class OutputError(KbframeError):
    """The run directory or one of its files cannot be written; names the path."""


class NumericsError(KbframeError):
    """A number the data mode needs cannot be represented (e.g. beyond fp16's range) or a
    result is not finite; names the array or op and the limit."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, a batch system's time limit), handled as Ctrl-C is: the run records
    ``interrupted``; the command exits 143 rather than 130."""

    def __str__(self) -> str:
        return "terminated (SIGTERM)"


def raise_interrupt_behind(e: BaseException) -> None:
    """Raise the Ctrl-C (KeyboardInterrupt) or SIGTERM (:class:`Terminated`) that ``e``
    was raised while unwinding from, if any (its ``__context__`` chain): a cleanup that
    fails on the half-made state an interrupt left (a ``with`` block's exit) must not turn
    the interrupt into an error, or into nothing where that error is expected and caught."""
    seen = set()
    c = e.__context__
    while c is not None and id(c) not in seen:
        if isinstance(c, KeyboardInterrupt):
            raise c
        seen.add(id(c))
        c = c.__context__
