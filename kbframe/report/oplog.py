"""Reading a run's ``op_log.jsonl`` in either of its forms (kbframe.records): record by record,
or periodic (a fast-forwarded run's: per repeating section, the records before it, its first
period and a ``repeat`` line with each field's shift; then the records after the last).

* :func:`read`: the whole run's :class:`~kbframe.records.RecordTable` (the periodic form
  expanded; its ``form`` says how the file was written), what the sanitizer and
  ``python -m kbframe.report.trace`` read;
* :func:`lines`: the record-by-record op_log's lines, one at a time, holding one period in
  memory (with what repeats within it): joined, they are byte for byte the op_log the run
  would have written record by record;
* ``python -m kbframe.report.oplog RUN_DIR|op_log.jsonl [OUT]``: those lines to standard
  output (or to ``OUT``), for ``grep``, ``jq`` or any reader of the record-by-record form.
"""
from __future__ import annotations

import itertools
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from ..files import atomic_write, stdout_gone
from ..periodic_form import Reading, shift_rows
from ..records import RecordTable


def read(path) -> RecordTable:
    """The records of the op_log at ``path`` (a file, or a run directory holding
    ``op_log.jsonl``), expanded. Raises OSError, or ValueError naming the malformed line."""
    return RecordTable.parse(op_log_file(path))


def op_log_file(path) -> Path:
    """The op_log at ``path``: the file, or a run directory's ``op_log.jsonl``. Raises
    FileNotFoundError naming a directory that holds none (a sweep's: its jobs do)."""
    p = Path(path)
    if not p.is_dir():
        return p
    if not (p / "op_log.jsonl").exists():
        jobs = "; a sweep's runs are its numbered job folders" if (p / "multirun.yaml").exists() else ""
        raise FileNotFoundError(f"{p} holds no op_log.jsonl: give a run's directory{jobs}")
    return p / "op_log.jsonl"


def lines(path, chunk: int = 1 << 14) -> Iterator[str]:
    """The op_log at ``path`` record by record: its own lines, as written, when it is written
    so (the first must be a record; :func:`read` parses and checks every one), else the
    periodic form's lines (every one checked) with each repetition of each section's
    period made (``chunk`` records of text at a time; one period held in memory, with the
    repetitions of the sections nested in it). Raises OSError, or ValueError naming the file
    and line: a first line that is no op_log record or header, a malformed header, record
    or ``repeat`` line, a nested ``repeat`` line outside its section's first period, more or
    fewer ``repeat`` lines than sections, a count that differs from the header's, a last
    line cut short."""
    p = op_log_file(path)
    with open(p, encoding="utf-8", errors="strict") as f:
        try:
            yield from _lines(f, p, chunk)
        except UnicodeDecodeError as e:
            raise ValueError(f"{p}: not an op_log (not UTF-8 text: {e.reason})") from None


def _lines(f, p: Path, chunk: int) -> Iterator[str]:
    first = f.readline()
    if not first:  # an empty op_log: a run of no records
        return
    if not first.startswith('{"op_log"'):
        if first and not first.startswith('{"pe"'):
            raise ValueError(f"{p}:1: not an op_log record or a periodic op_log's header")
        for lineno, line in enumerate(itertools.chain([first], f), 1):
            if not line.endswith("\n") or line.startswith(('{"op_log"', '{"repeat"')):
                raise ValueError(f"{p}:{lineno}: " + ("the last line is cut short" if not line.endswith("\n")
                                                      else "a periodic op_log's line in a record-by-record one"))
            yield line
        return
    reading = _parsed(first, p, 1, Reading)
    secs = reading.head["sections"]
    held = RecordTable()  # the records of the first period being read (repetitions of nested ones included)
    scratch = RecordTable()
    seen = 0
    for lineno, line in enumerate(f, 2):
        if not line.endswith("\n"):
            raise ValueError(f"{p}:{lineno}: the last line is cut short")
        if not line.strip():  # as RecordTable.parse reads it
            continue
        if not line.lstrip().startswith('{"repeat"'):
            if line.lstrip().startswith('{"op_log"'):
                raise ValueError(f"{p}:{lineno}: a second header")
            if len(reading.forms) < len(secs) and seen >= secs[len(reading.forms)][0]:  # in a section's first period
                _parsed(line, p, lineno, lambda r: held._add(_record(r)))
            else:  # checked as RecordTable.parse reads it (the written records are few)
                _parsed(line, p, lineno, lambda r: scratch._add(_record(r)))
                del scratch.buf[:]
            seen += 1
            yield line
            continue
        codes = lambda m: held.column("name", len(held) - m) if 0 < m <= len(held) else None  # noqa: E731
        taken = _parsed(line, p, lineno, lambda r: None if reading.surplus(r) else
                        reading.repeat(r, seen, codes, held.names))
        if taken is None:
            raise ValueError(f"{p}:{lineno}: " + ("a second repeat line" if len(secs) == 1 else
                                                  f"a repeat line after the header's {len(secs)} sections' ones"))
        form, depth = taken
        if depth:  # its repetitions are part of the enclosing first period: held
            n = len(held)
            held._repeat(form)
            for lo in range(n, len(held), chunk):
                yield held.text(lo, min(len(held), lo + chunk))
            seen += len(held) - n
            continue
        first_period, n = held.array(), len(held)  # one repetition at a time: one period in memory
        step = shift_rows(form, first_period)
        for j in range(1, form.times):
            held.buf[:] = (first_period + j * step).tobytes()
            for lo in range(0, n, chunk):
                yield held.text(lo, min(n, lo + chunk))
        seen += n * (form.times - 1)
        held = RecordTable()
    try:
        reading.finish(seen)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None


def _record(r: dict) -> dict:
    """``r``, an op_log record (a periodic op_log's header or repeat line is none here)."""
    if not isinstance(r, dict) or "pe" not in r:
        raise ValueError("not an op_log record")
    return r


def _parsed(line: str, p: Path, lineno: int, take):
    """``take(the line's JSON object)``, its errors as one ValueError naming the line."""
    try:
        return take(json.loads(line))
    except (ValueError, KeyError, TypeError, OverflowError, AttributeError, RecursionError) as e:
        why = (f"no {e.args[0]!r}" if isinstance(e, KeyError) else
               "nested too deep" if isinstance(e, RecursionError) else str(e))
        raise ValueError(f"{p}:{lineno}: malformed periodic op_log line ({why})") from None


def _write_lines(out: Path, path) -> None:
    with open(out, "w", buffering=1 << 20) as f:
        for text in lines(path):
            f.write(text)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # unwinds through atomic_write, which removes its temporary file


def main(argv=None) -> int:
    """``python -m kbframe.report.oplog RUN_DIR|op_log.jsonl [OUT]``: the op_log record by
    record, to standard output or (atomically: all or nothing, also on Ctrl-C or SIGTERM) to
    ``OUT``; 1 and one line on an error, 130 when interrupted."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or len(args) > 2:
        print("usage: python -m kbframe.report.oplog RUN_DIR|op_log.jsonl [OUT]  "
              "(the op_log record by record, whichever form it is written in)",
              file=sys.stdout if args and args[0] in ("-h", "--help") else sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if len(args) == 2:
            out = Path(args[1])
            if out.is_dir():
                raise ValueError(f"OUT '{out}' is a directory; name a file")
            atomic_write(out, lambda tmp: _write_lines(tmp, args[0]))
        else:
            for text in lines(args[0]):
                sys.stdout.write(text)
            sys.stdout.flush()
    except BrokenPipeError:  # the reader went away (`... | head`)
        return stdout_gone()
    except KeyboardInterrupt:
        print("kbframe: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError) as e:
        print(f"kbframe: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
