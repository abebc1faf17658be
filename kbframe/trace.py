"""``op_log.jsonl`` → ``trace.json`` in Chrome trace-event format (Perfetto, chrome://tracing).

Layout:
- one process (``pid``) per PE, named ``PE<n>``;
- one thread (track) per unit, named ``PE_CPU dispatch``, ``PE_SCHEDULER``, ``DMA read``,
  ``DMA write``, ``GEMM``, ``MATH`` (an unknown unit keeps its op_log name);
- one complete event (``"ph": "X"``) per op_log record, ``name`` = op_kind, ``cat`` = unit,
  ``ts``/``dur`` in µs (the format's unit), ``args`` = {op_kind, cmd, bytes, tile} (DMA adds
  ``t_data_us``, when the channel began moving the transfer's bytes);
- one flow per command (``"ph"`` ``s`` → ``t`` … → ``f``, ``id`` = pe·10⁹ + cmd, bound to the
  enclosing slices): dispatch on PE_CPU → admission in PE_SCHEDULER → each stage in time
  order, so a viewer can follow one composite from dispatch to completion.

Complete events on one thread must nest, but some spans overlap without nesting: commands
in flight in PE_SCHEDULER, DMA transfers whose setup overlaps (DESIGN.md modelling notes).
Those go to overflow lanes, extra threads next to the unit's first one and named
``PE_SCHEDULER ·2``, ``DMA read ·2`` …; a unit whose slices never overlap has one track.

The op_log is read line by line and events are written as they are made; only the commands
still in flight are held (the op_log is in completion order, and a command's
``scheduler`` record follows its stages).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

#: op_log unit → (track name, sort order)
UNIT_TRACKS = {
    "cpu": ("PE_CPU dispatch", 0),
    "scheduler": ("PE_SCHEDULER", 1),
    "dma_read": ("DMA read", 2),
    "dma_write": ("DMA write", 3),
    "gemm": ("GEMM", 4),
    "math": ("MATH", 5),
}
#: flow ids are ``pe * FLOW_ID_STRIDE + cmd``
FLOW_ID_STRIDE = 1_000_000_000
#: threads per unit reserved for overflow lanes (tid = unit slot * LANE_STRIDE + lane + 1)
LANE_STRIDE = 1000


def _ps(ns) -> int:
    """op_log ns (≤ 3 decimals, from integer ps) → the exact integer ps."""
    return round(ns * 1000)


def _us(ps: int) -> str:
    """Integer ps → µs as JSON text; ``ps / 1e6`` is the double nearest the decimal, so
    its repr is that decimal (no float noise in the file)."""
    return repr(ps / 1e6)


def write_trace(op_log: Path | str, out: Path | str) -> dict:
    """Convert ``op_log`` (op_log.jsonl) into ``out`` (trace.json), atomically (a temporary
    file, then rename).

    Returns:
        ``{"slices": {unit: count}, "flows": n_commands, "lanes": {unit@PEn: n}}``.
    Raises:
        OSError: the op_log cannot be read or the trace cannot be written.
        ValueError: a malformed op_log line (names the line number).
    """
    op_log, out = Path(op_log), Path(out)
    tmp = out.with_name(out.name + ".tmp")
    slices: dict[str, int] = {}
    lanes: dict[tuple, list] = {}        # (pe, unit) → per-lane max end (ps)
    slots: dict[str, int] = {}           # unit → slot (sets tids and sort order)
    names: dict[str, str] = {}           # op_kind / unit → its JSON string
    pending: dict[tuple, list] = {}      # (pe, cmd) → [(ps, tid)]: dispatch, then stages
    n_flows = 0
    loads, dumps = json.loads, json.dumps
    try:
        with open(op_log) as src, open(tmp, "w", buffering=1 << 20) as f:
            write = f.write
            write('{"displayTimeUnit": "ns",\n "traceEvents": [\n')
            sep = ""
            for lineno, line in enumerate(src, 1):
                try:
                    r = loads(line)
                    pe, unit, cmd = int(r["pe"]), r["unit"], int(r["cmd"])
                    p0, p1 = _ps(r["t_start_ns"]), _ps(r["t_end_ns"])
                    kind, nbytes, tile = r["op_kind"], int(r.get("bytes", 0)), int(r.get("tile", -1))
                except (ValueError, KeyError, TypeError) as e:
                    if not line.strip():
                        continue
                    raise ValueError(f"{op_log}:{lineno}: malformed op_log record ({e!r})") from None
                if unit not in slots:
                    slots[unit] = UNIT_TRACKS[unit][1] if unit in UNIT_TRACKS else \
                        len(UNIT_TRACKS) + sum(u not in UNIT_TRACKS for u in slots)
                    names[unit] = dumps(str(unit))
                nm = names.get(kind)
                if nm is None:
                    nm = names[kind] = dumps(str(kind))
                ends = lanes.get((pe, unit))
                if ends is None:
                    ends = lanes[(pe, unit)] = []
                for lane, end in enumerate(ends):   # first lane free at p0 (module doc)
                    if end <= p0:
                        if p1 > end:
                            ends[lane] = p1
                        break
                else:
                    lane = len(ends)
                    ends.append(p1)
                tid = slots[unit] * LANE_STRIDE + lane + 1
                extra = f',"t_data_us":{_us(_ps(r["t_data_ns"]))}' if "t_data_ns" in r else ""
                write(f'{sep}{{"name":{nm},"cat":{names[unit]},"ph":"X","ts":{_us(p0)},"dur":{_us(p1 - p0)},'
                      f'"pid":{pe},"tid":{tid},"args":{{"op_kind":{nm},"cmd":{cmd},"bytes":{nbytes},'
                      f'"tile":{tile}{extra}}}}}')
                sep = ",\n"
                slices[unit] = slices.get(unit, 0) + 1
                key = (pe, cmd)
                if unit == "cpu":
                    pending[key] = [(p0, tid)]
                elif unit == "scheduler":
                    steps = pending.pop(key, None) or [None]
                    chain = ([steps[0]] if steps[0] is not None else []) + [(p0, tid)] + sorted(steps[1:])
                    if len(chain) >= 2:
                        n_flows += 1
                        fid = pe * FLOW_ID_STRIDE + cmd
                        last = len(chain) - 1
                        for i, (fp, ftid) in enumerate(chain):
                            ph = "s" if i == 0 else ("f" if i == last else "t")
                            write(f',\n{{"name":"command","cat":"flow","ph":"{ph}","id":{fid},'
                                  f'"ts":{_us(fp)},"pid":{pe},"tid":{ftid},"bp":"e"}}')
                else:
                    steps = pending.get(key)
                    if steps is None:  # a stage with no dispatch record before it
                        steps = pending[key] = [None]
                    steps.append((p0, tid))
            meta = []
            for pe in sorted({p for p, _ in lanes}):
                meta.append({"name": "process_name", "ph": "M", "pid": pe, "tid": 0,
                             "args": {"name": f"PE{pe}"}})
                meta.append({"name": "process_sort_index", "ph": "M", "pid": pe, "tid": 0,
                             "args": {"sort_index": pe}})
            for (pe, unit), ends in sorted(lanes.items()):
                base = UNIT_TRACKS[unit][0] if unit in UNIT_TRACKS else str(unit)
                for lane in range(len(ends)):
                    tid = slots[unit] * LANE_STRIDE + lane + 1
                    meta.append({"name": "thread_name", "ph": "M", "pid": pe, "tid": tid,
                                 "args": {"name": base if lane == 0 else f"{base} ·{lane + 1}"}})
                    meta.append({"name": "thread_sort_index", "ph": "M", "pid": pe, "tid": tid,
                                 "args": {"sort_index": tid}})
            for ev in meta:
                write(sep + dumps(ev, ensure_ascii=False))
                sep = ",\n"
            other = {"source": op_log.name.removesuffix(".partial"), "generator": "kbframe.trace",
                     "time_unit": "us"}
            write("\n ],\n \"otherData\": " + dumps(other) + "}\n")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"slices": slices, "flows": n_flows,
            "lanes": {f"{u}@PE{p}": len(e) for (p, u), e in sorted(lanes.items())}}


def main(argv=None) -> int:
    """``python -m kbframe.trace OP_LOG [TRACE]``: (re)build a trace from an op_log."""
    import sys
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m kbframe.trace RUN_DIR|op_log.jsonl [trace.json]")
        return 0 if args else 2
    src = Path(args[0])
    if src.is_dir():
        src = src / "op_log.jsonl"
    dst = Path(args[1]) if len(args) > 1 else src.with_name("trace.json")
    try:
        info = write_trace(src, dst)
    except (OSError, ValueError) as e:
        print(f"kbframe: error: {e}", file=sys.stderr)
        return 1
    print(f"{dst}: {sum(info['slices'].values())} slices, {info['flows']} flows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
