"""Reading a run's ``op_log.jsonl`` in either of its forms (kbframe.records): record by record,
or periodic (a fast-forwarded run's: the records before the repeating part, one period, a
``repeat`` line with each field's shift, the records after it).

* :func:`read`: the whole run's :class:`~kbframe.records.RecordTable` (the periodic form
  expanded; its ``form`` says how the file was written), what the sanitizer and
  ``python -m kbframe.report.trace`` read;
* :func:`lines`: the record-by-record op_log's lines, one at a time, holding one period in
  memory: joined, they are byte for byte the op_log the run would have written record by
  record;
* ``python -m kbframe.report.oplog RUN_DIR|op_log.jsonl [OUT]``: those lines to standard
  output (or to ``OUT``), for ``grep``, ``jq`` or any reader of the record-by-record form.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from ..files import atomic_write
from ..records import Periodic, RecordTable, repeat_shift, shift_rows


def read(path) -> RecordTable:
    """The records of the op_log at ``path`` (a file, or a run directory holding
    ``op_log.jsonl``), expanded. Raises OSError, or ValueError naming the malformed line."""
    return RecordTable.parse(_file(path))


def _file(path) -> Path:
    p = Path(path)
    return p / "op_log.jsonl" if p.is_dir() else p


def lines(path, chunk: int = 1 << 14) -> Iterator[str]:
    """The op_log at ``path`` record by record: its own lines when it is written so, else
    the periodic form's lines with each repetition of its period made (``chunk`` records of
    text at a time; one period held in memory). Raises OSError, or ValueError naming a
    malformed header or ``repeat`` line."""
    p = _file(path)
    with open(p) as f:
        first = f.readline()
        if not first.startswith('{"op_log"'):
            yield first
            yield from f
            return
        head = _header(first, p)
        period: list[str] = []
        seen = 0
        for lineno, line in enumerate(f, 2):
            if not line.startswith('{"repeat"'):
                if head["prefix"] <= seen < head["prefix"] + head["period"]:
                    period.append(line)
                seen += 1
                yield line
                continue
            try:
                rep = json.loads(line)["repeat"]
                if seen != head["prefix"] + head["period"] or int(rep["times"]) != head["times"] - 1:
                    raise ValueError(f"it follows {seen} records, not the header's {head['prefix']} + {head['period']}")
                step = shift_rows(Periodic(head["records"], head["prefix"], head["period"], head["times"],
                                           repeat_shift(rep, head["period"])))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{p}:{lineno}: malformed repeat line ({e})") from None
            block = RecordTable.parse("".join(period), f"{p} (its first period)")
            first_period, n = block.array(), len(block)
            for j in range(1, head["times"]):
                block.buf[:] = (first_period + j * step).tobytes()
                for lo in range(0, n, chunk):
                    yield block.text(lo, min(n, lo + chunk))


def _header(line: str, path: Path) -> dict:
    try:
        head = json.loads(line)
        return {k: int(head[k]) for k in ("records", "prefix", "period", "times")}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:1: malformed periodic op_log header ({e!r})") from None


def _write_lines(out: Path, path) -> None:
    with open(out, "w", buffering=1 << 20) as f:
        for text in lines(path):
            f.write(text)


def main(argv=None) -> int:
    """``python -m kbframe.report.oplog RUN_DIR|op_log.jsonl [OUT]``: the op_log record by
    record, to standard output or (atomically) to ``OUT``; 1 and one line on an error."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or len(args) > 2:
        print("usage: python -m kbframe.report.oplog RUN_DIR|op_log.jsonl [OUT]  "
              "(the op_log record by record, whichever form it is written in)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    try:
        if len(args) == 2:
            atomic_write(Path(args[1]), lambda tmp: _write_lines(tmp, args[0]))
        else:
            for text in lines(args[0]):
                sys.stdout.write(text)
            sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`... | head`): as a tool killed by SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (OSError, ValueError) as e:
        print(f"kbframe: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
