"""A record's ten fields and how the op_log spells them: the layout of
:class:`kbframe.records.RecordTable` and of ``op_log.jsonl`` lines.

Fields of a record (:data:`FIELDS`), all integers, times in ps, -1: none:

``name``   code of the record's ``(pe, unit, op_kind)`` in :attr:`RecordTable.names`
``cmd``    PE-local command id
``tile``   tile index in the command's loop (-1: none)
``t0``     start; ``t1`` end; ``td`` start of a DMA transfer's data phase
``bytes``  bytes moved or read (a dispatch: the command's logical bytes; a command: 0)
``peer``   the other PE of an IPCQ send or receive
``why``    what it waited for: a code of :data:`kbframe.sim.waits.KINDS` (dispatches and
           commands), -1 or -2 for a stage (kbframe.sim.waits)
``ref``    what ``why`` names (a record index or a command id)
"""
from __future__ import annotations

from struct import Struct

FIELDS = ("name", "cmd", "tile", "t0", "t1", "td", "bytes", "peer", "why", "ref")
N = len(FIELDS)
#: one record: ten native int64 (what numpy reads back as int64)
ROW = Struct(f"{N}q")

#: ``NS_FRAC[r]``: how Python prints the fraction of ``r / 1000`` (``".5"``, ``".001"``, ``".0"``).
NS_FRAC = tuple(repr(r / 1000)[1:] for r in range(1000))
#: Below this many ps (1000 s), ``ps // 1000`` and ``NS_FRAC[ps % 1000]`` spell exactly
#: ``repr(ps / 1000)``: a float's spacing there is far finer than 1 ps, so its shortest repr
#: is the exact decimal. Formatting floats was the op_log's largest cost.
EXACT_PS = 10 ** 15


def ns_text(ps) -> str:
    """A time in integer ps as the op_log prints it in ns: the text of ``ps / 1000``."""
    if ps.__class__ is int and 0 <= ps < EXACT_PS:
        return f"{ps // 1000}{NS_FRAC[ps % 1000]}"
    return repr(ps / 1000)


#: the fields a periodic op_log shifts per repetition, as its ``repeat`` line names them
SHIFTED = {"cmd": "cmd", "tile": "tile", "t0": "t_start_ns", "t1": "t_end_ns", "td": "t_data_ns",
           "bytes": "bytes", "peer": "peer"}
#: the fields an op_log line holds (``why`` and ``ref`` are not written)
WRITTEN = ("name", *SHIFTED)
