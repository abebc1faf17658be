"""Test fixtures, not hardware: a unit that breaks one rule a unit type must keep, so the
tests can show the error reaching a CLI user as one line (docs/errors.md), e.g.::

    python -m kbframe +bench=decode_opt2 hardware.units.math._target_=kbframe.hw.faulty.MathWithoutEnergy
"""
from __future__ import annotations

from .pe_math import MathUnit


class MathWithoutEnergy(MathUnit):
    """PE_MATH's latency model without an energy rule (``energy_keys`` None: what a new
    unit type that forgot to declare what its actions cost looks like, DESIGN.md
    decision 15); a run with it is refused before it simulates (kbframe.run.energy)."""

    label = "MATH without energy"
    energy_keys = None
