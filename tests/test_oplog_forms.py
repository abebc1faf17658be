"""The op_log's two forms (kbframe.records): a fast-forwarded run's periodic op_log expands to
exactly the records of the full simulation, through :mod:`kbframe.report.oplog` and
:meth:`RecordTable.parse`; its trace draws the first and last periods and one slice per
repetition between them; a run that does not repeat writes record by record."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, run
from kbframe.periodic_form import find_periodic
from kbframe.record_fields import N
from kbframe.records import RecordTable
from kbframe.report import oplog

#: a small model's step over a cube's 8 PEs, unfused: its layers fast-forward
STEP = ("hardware=cube", "bench.tp=8", "bench.fusion=none", "bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16",
        "bench.F=64", "bench.S_kv=40", "bench.data=false", "run.check=false")


def _table(rows) -> RecordTable:
    return RecordTable.of_rows([(0, "cpu", "load"), (0, "dma_read", "load"), (1, "gemm", "mm")],
                               np.array(rows, dtype=np.int64).reshape(-1, N))


def _periodic_rows(times: int) -> list:
    """Two records before, ``times`` periods of three records (cmd +2, times +100 ps, the
    DMA's data phase +100, bytes fixed), one record after."""
    rows = [[0, 0, -1, 0, 5, -1, 8, -1, -1, -1], [2, 0, -1, 1, 7, -1, 0, -1, -1, -1]]
    for j in range(times):
        rows += [[0, 1 + 2 * j, -1, 10 + 100 * j, 20 + 100 * j, -1, 8, -1, -1, -1],
                 [1, 1 + 2 * j, j, 20 + 100 * j, 90 + 100 * j, 40 + 100 * j, 4096, -1, -1, -1],
                 [2, 2 + 2 * j, -1, 90 + 100 * j, 95 + 100 * j, -1, 0, -1, -1, -1]]
    return rows + [[2, 99, -1, 100 * times + 50, 100 * times + 51, -1, 0, -1, -1, -1]]


def test_a_periodic_table_is_found_written_and_read_back_exactly():
    t = _table(_periodic_rows(7))
    form = find_periodic(t, 3)
    assert (form.records, form.prefix, form.period, form.times) == (24, 2, 3, 7)
    assert {f: v.tolist() for f, v in form.shift.items() if v.any()} == \
        {"cmd": [2, 2, 2], "tile": [0, 1, 0], "t0": [100] * 3, "t1": [100] * 3, "td": [0, 100, 0]}
    full = t.text()
    t.form = form
    f = io.StringIO()
    assert t.write(f) == 2 + 2 + 3 + 1  # header, repeat line, the prefix, one period, the record after
    text = f.getvalue().splitlines()
    assert text[0] == '{"op_log": "periodic", "records": 24, "prefix": 2, "period": 3, "times": 7}'
    assert text[6] == ('{"repeat": {"records": 3, "times": 6, "shift": {"cmd": 2, "tile": [0, 1, 0], '
                       '"t_start_ns": 0.1, "t_end_ns": 0.1, "t_data_ns": 0.1}}}')
    back = RecordTable.parse(f.getvalue())
    assert back.text() == full and (back.form.records, back.form.prefix, back.form.period, back.form.times) == \
        (24, 2, 3, 7)
    assert np.array_equal(back.array()[:, 1:8], t.array()[:, 1:8])


def test_a_table_that_does_not_repeat_has_no_periodic_form():
    rows = _periodic_rows(7)
    rows[8][4] += 1  # one period's GEMM ends a ps late: the windows around it break
    assert find_periodic(_table(rows), 3).times < 7
    assert find_periodic(_table(_periodic_rows(2)), 3) is None  # two periods: not worth a form


@pytest.mark.parametrize("line, error", [
    ('{"op_log": "periodic", "records": 24, "prefix": 2, "period": 3, "times": 7}\n',
     "op_log: a periodic op_log with no repeat line"),
    ('{"repeat": {"records": 3, "times": 6, "shift": {}}}\n',
     "op_log:1: malformed op_log record (ValueError('a repeat line without the periodic header, or a second one'))"),
])
def test_a_broken_periodic_op_log_is_named(line, error):
    body = _table(_periodic_rows(3)).text()
    with pytest.raises(ValueError) as e:
        RecordTable.parse(line + body)
    assert str(e.value) == error


def _periodic_file(tmp_path, edit=lambda lines: lines):
    """The hand-made table's periodic op_log (header, 2 records, a period of 3, the repeat line,
    one record), its lines passed through ``edit``."""
    t = _table(_periodic_rows(7))
    t.form = find_periodic(t, 3)
    f = io.StringIO()
    t.write(f)
    path = tmp_path / "op_log.jsonl"
    path.write_text("".join(edit(f.getvalue().splitlines(keepends=True))))
    return path, t.text()


def _swap(i, old, new):
    return lambda ls: [line.replace(old, new) if j == i else line for j, line in enumerate(ls)]


@pytest.mark.parametrize("edit, error", [
    (lambda ls: ls[:7] + ls[6:], ":8: a second repeat line"),
    (lambda ls: ls[:6], ": a periodic op_log with no repeat line"),
    (lambda ls: ls[:-1], ": a periodic op_log of 23 records; its header says 24"),
    (lambda ls: ls[:-1] + [ls[-1].rstrip("\n")], ":8: the last line is cut short"),
    (_swap(0, '"records": 24', '"records": 25'), ": a periodic op_log of 24 records; its header says 25"),
    (_swap(0, '"times": 7', '"times": 0'), ":1: malformed periodic op_log line (the header's counts do not fit "
                                            "together (records 24, prefix 2, period 3, times 0))"),
    (_swap(6, '"cmd": 2', '"cmd": -2'), ":7: malformed periodic op_log line (the repeat line's shift of cmd is "
                                          "negative: a repetition comes after the one before)"),
    (_swap(6, '"t_start_ns": 0.1', '"t_start_ns": NaN'), ":7: malformed periodic op_log line (the repeat line's "
                                                           "shift of t_start_ns is not a finite time in ns)"),
    (_swap(6, '"times": 6', '"times": 5'), ":7: malformed periodic op_log line (the repeat line does not follow "
                                             "the header's 2 + 3 records, 7 times)"),
    (lambda ls: ["garbage\n", *ls[1:]], ":1: not an op_log record or a periodic op_log's header"),
    (lambda ls: ls[1:], ":6: a periodic op_log's line in a record-by-record one"),
])
def test_the_reader_stops_at_a_broken_periodic_op_log_with_its_line(tmp_path, edit, error):
    path, _ = _periodic_file(tmp_path, edit)
    with pytest.raises(ValueError) as e:
        list(oplog.lines(path))
    assert str(e.value) == f"{path}{error}"


def test_the_reader_streams_the_records_and_parse_refuses_what_memory_cannot_hold(tmp_path, monkeypatch):
    path, full = _periodic_file(tmp_path)
    assert "".join(oplog.lines(path)) == full and oplog.read(tmp_path).text() == full
    import kbframe.records as records
    monkeypatch.setattr(records, "_available_memory_bytes", lambda: 1000)
    with pytest.raises(ValueError) as e:
        oplog.read(path)
    assert str(e.value) == (f"{path}: a periodic op_log of 24 records needs 0.0 GiB to expand, more than the 0.0 GiB "
                            f"this machine has free; python -m kbframe.report.oplog streams it record by record")


@pytest.fixture(scope="module")
def step_runs(tmp_path_factory):
    """The 60-layer step written periodically and simulated in full, and a 120-layer one."""
    d = tmp_path_factory.mktemp("step")
    m = {"periodic": run(d / "periodic", *STEP, "bench.layers=60", "run.oplog=periodic", bench="decoder_layer"),
         "full": run(d / "full", *STEP, "bench.layers=60", "run.fast_forward=off", bench="decoder_layer"),
         "double": run(d / "double", *STEP, "bench.layers=120", "run.oplog=periodic", bench="decoder_layer")}
    return d, m


def test_expanding_a_periodic_op_log_gives_the_full_simulations_records(step_runs):
    d, m = step_runs
    assert m["periodic"]["fast_forward"]["applied"] and not m["full"]["fast_forward"]["applied"]
    full = (d / "full" / "op_log.jsonl").read_text()
    assert "".join(oplog.lines(d / "periodic")) == full
    assert oplog.read(d / "periodic").text() == full
    assert m["periodic"]["op_log"] == {"form": "periodic", "records": 155115, "lines": 1345, "prefix": 72,
                                       "period": 2584, "times": 60, "nested": 4}
    assert "op_log" not in m["full"]
    # the periodic run's results are the full simulation's, to the records
    for key in ("latency_ns", "step", "critical_path", "units"):
        assert m["periodic"].get(key) == m["full"].get(key), key


def test_a_periodic_runs_files_grow_with_distinct_work_not_repetitions(step_runs):
    """Doubling the layers adds 60 repetitions: the op_log differs in its header's and repeat
    line's counts and in the times of the three records after the repetitions alone, the
    trace by one slice a PE a repetition."""
    d, m = step_runs
    size = {k: ((d / k / "op_log.jsonl").stat().st_size, (d / k / "trace.json").stat().st_size)
            for k in ("periodic", "double", "full")}
    one, two = ((d / k / "op_log.jsonl").read_text().splitlines() for k in ("periodic", "double"))
    differ = [i for i, (a, b) in enumerate(zip(one, two)) if a != b]
    assert len(one) == len(two) == 1345 and differ == [0, 1341, 1342, 1343, 1344]
    assert m["double"]["op_log"]["times"] == 120 and m["double"]["step"]["layers"] == 120
    assert size["double"][1] < 1.2 * size["periodic"][1]
    assert size["full"][0] > 50 * size["periodic"][0] and size["full"][1] > 20 * size["periodic"][1]
    trace = json.loads((d / "periodic" / "trace.json").read_text())["traceEvents"]
    reps = [e for e in trace if e.get("cat") == "repeated"]
    layers = [e for e in reps if e["args"]["section"] == 1]  # the periods of a layer; then a layer's GEMV tiles
    assert len(layers) == 58 * 8 and {e["name"] for e in layers if e["pid"] == 3} == {
        f"section 1 period {j} of 60" for j in range(2, 60)}
    assert layers[0]["args"] == {"records": 323, "as": "period 1", "section": 1, "later_us": 4.25825}
    tiles = [e for e in reps if e["args"]["section"] > 1]  # 4 sections in the first and the last layer, 8 PEs
    assert len(tiles) == 4 * 2 * 8 and {e["args"]["every_us"] for e in tiles} == {0.0825, 0.1245}
    assert {(e["args"]["repetitions"], e["name"].split(" ", 2)[2]) for e in tiles} == {
        (4, "periods 2-5 of 6"), (5, "periods 2-6 of 7")}
    ends = {}
    for e in reps:  # one track a PE: its slices follow each other (the tiles' in the first layer
        t0, t1 = round(e["ts"] * 1e6), round((e["ts"] + e["dur"]) * 1e6)  # first), none overlaps the next
        assert t0 >= ends.get(e["pid"], 0) and t1 > t0
        ends[e["pid"]] = t1


def test_a_run_that_does_not_repeat_writes_record_by_record(tmp_path):
    m = run(tmp_path, "bench.data=false", "run.oplog=periodic")  # decode_opt2 at S_kv 4096: too short to skip
    assert not m["fast_forward"]["applied"] and "op_log" not in m
    assert (tmp_path / "op_log.jsonl").read_text().startswith('{"pe": 0, "unit": "cpu"')


def test_the_reader_prints_the_records_and_names_a_bad_file(step_runs, tmp_path):
    d, _ = step_runs
    cmd = [sys.executable, "-m", "kbframe.report.oplog"]
    out = subprocess.run([*cmd, str(d / "periodic"), str(tmp_path / "all.jsonl")], capture_output=True, text=True,
                         cwd=REPO)
    assert out.returncode == 0 and out.stdout == out.stderr == ""
    assert (tmp_path / "all.jsonl").read_text() == (d / "full" / "op_log.jsonl").read_text()
    out = subprocess.run([*cmd, str(d / "periodic"), str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert (out.returncode, out.stderr) == (1, f"kbframe: error: OUT '{tmp_path}' is a directory; name a file\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op_log": "periodic", "records": 2}\n')
    out = subprocess.run([*cmd, str(bad)], capture_output=True, text=True, cwd=REPO)
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"kbframe: error: {bad}:1: malformed periodic op_log line (no 'prefix')\n"


@pytest.mark.parametrize("sweep", [False, True])
def test_the_reader_and_the_trace_name_a_directory_without_an_op_log(tmp_path, capsys, sweep):
    from kbframe.report import trace
    if sweep:  # a sweep's directory: its runs are its job folders
        (tmp_path / "multirun.yaml").write_text("{}\n")
    jobs = "; a sweep's runs are its numbered job folders" if sweep else ""
    want = f"kbframe: error: {tmp_path} holds no op_log.jsonl: give a run's directory{jobs}\n"
    for main in (oplog.main, trace.main):
        assert main([str(tmp_path)]) == 1
        assert capsys.readouterr() == ("", want)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["multirun.yaml"] if sweep else [])


def _two_section_rows() -> list:
    """Two records before, 5 periods of three records (as :func:`_periodic_rows`), two records
    between, 4 periods of two records (cmd +1, times +50 ps), one record after."""
    rows = _periodic_rows(5)[:-1]
    rows += [[2, 20, -1, 600, 610, -1, 0, -1, -1, -1], [0, 21, -1, 610, 611, -1, 8, -1, -1, -1]]
    for j in range(4):
        rows += [[1, 30 + j, 7, 700 + 50 * j, 740 + 50 * j, 710 + 50 * j, 2048, -1, -1, -1],
                 [2, 30 + j, -1, 740 + 50 * j, 745 + 50 * j, -1, 0, -1, -1, -1]]
    return rows + [[2, 99, -1, 1000, 1001, -1, 0, -1, -1, -1]]


def test_a_table_with_two_repeating_sections_writes_each_once_and_reads_back_exactly(tmp_path):
    t = _table(_two_section_rows())
    form = find_periodic(t, 6)  # neither repeats 6 records at a time: the parts 3 and 2 of 6 do
    assert [(s.prefix, s.period, s.times) for s in form.sections] == [(2, 3, 5), (19, 2, 4)]
    full = t.text()
    t.form = form
    f = io.StringIO()
    assert t.write(f) == 13  # header, 2 records, 3, repeat line, 2 between, 2, repeat line, 1 after
    text = f.getvalue().splitlines()
    assert text[0] == ('{"op_log": "periodic", "records": 28, "prefix": 2, "period": 3, "times": 5, '
                       '"sections": [[2, 2, 4]]}')
    assert text[6].startswith('{"repeat": {"records": 3, "times": 4, ')
    assert text[11] == ('{"repeat": {"records": 2, "times": 3, "shift": {"cmd": 1, "t_start_ns": 0.05, '
                        '"t_end_ns": 0.05, "t_data_ns": 0.05}}}')
    back = RecordTable.parse(f.getvalue())
    assert back.text() == full
    assert [(s.records, s.prefix, s.period, s.times) for s in back.form.sections] == [(28, 2, 3, 5), (28, 19, 2, 4)]
    path = tmp_path / "op_log.jsonl"
    path.write_text(f.getvalue())
    assert "".join(oplog.lines(path, chunk=1)) == full


def _two_section_file(tmp_path, edit):
    t = _table(_two_section_rows())
    t.form = find_periodic(t, 6)
    f = io.StringIO()
    t.write(f)
    path = tmp_path / "op_log.jsonl"
    path.write_text("".join(edit(f.getvalue().splitlines(keepends=True))))
    return path


@pytest.mark.parametrize("edit, error", [
    (_swap(0, "[[2, 2, 4]]", "[[2, 2]]"), ":1: malformed periodic op_log line (the header's sections must be a list "
                                          "of [records before, period, times] integer triples)"),
    (_swap(0, "[[2, 2, 4]]", "[]"), ":1: malformed periodic op_log line (the header's sections must be a list "
                                    "of [records before, period, times] integer triples)"),
    (_swap(0, "[[2, 2, 4]]", "[[2, 2, 5]]"), ":1: malformed periodic op_log line (the header's counts do not fit "
                                             "together (records 28, prefix 2, period 3, times 5, sections "
                                             "[[2, 2, 5]]))"),
    (_swap(0, "[[2, 2, 4]]", "[[-1, 2, 4]]"), ":1: malformed periodic op_log line (the header's counts do not fit "
                                              "together (records 28, prefix 2, period 3, times 5, sections "
                                              "[[-1, 2, 4]]))"),
    (_swap(0, "[[2, 2, 4]]", "[[3, 2, 4]]"), ":12: malformed periodic op_log line (the repeat line does not follow "
                                             "the header's 3 + 2 records, 4 times)"),
    (_swap(0, "[[2, 2, 4]]", "[[2, 2, 3]]"), ":12: malformed periodic op_log line (the repeat line does not follow "
                                             "the header's 2 + 2 records, 3 times)"),
    (lambda ls: ls[:11] + ls[12:], ": a periodic op_log with 1 of its 2 sections' repeat lines"),
    (lambda ls: ls[:12] + ls[11:], ":13: a repeat line after the header's 2 sections' ones"),
    (_swap(0, ', "sections": [[2, 2, 4]]', ""), ":12: a second repeat line"),
])
def test_a_broken_two_section_op_log_is_named(tmp_path, edit, error):
    path = _two_section_file(tmp_path, edit)
    with pytest.raises(ValueError) as e:
        list(oplog.lines(path))
    assert str(e.value) == f"{path}{error}"


@pytest.mark.parametrize("edit, error", [
    (_swap(0, "[[2, 2, 4]]", "[[2, 2]]"), "op_log:1: malformed op_log record (ValueError(\"the header's sections must "
                                          "be a list of [records before, period, times] integer triples\"))"),
    (lambda ls: ls[:11] + ls[12:], "op_log: a periodic op_log with 1 of its 2 sections' repeat lines"),
    (lambda ls: ls[:12] + ls[11:], "op_log:13: malformed op_log record (ValueError(\"a repeat line after the "
                                   "header's 2 sections' ones\"))"),
    (lambda ls: ls[:-1], "op_log: a periodic op_log of 27 records; its header says 28"),
])
def test_parse_names_a_broken_two_section_op_log(tmp_path, edit, error):
    path = _two_section_file(tmp_path, edit)
    with pytest.raises(ValueError) as e:
        RecordTable.parse(path.read_text())
    assert str(e.value) == error


#: a PE with two items (decode_heads: 4 query heads over 2 KV heads on one PE): each item's
#: KV loop repeats, one after the other
ITEMS = ("bench.H_q=4", "bench.H_kv=2", "bench.S_kv=65536", "bench.data=false")


@pytest.fixture(scope="module")
def item_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("items")
    m = {"periodic": run(d / "periodic", *ITEMS, "run.oplog=periodic", bench="decode_heads"),
         "full": run(d / "full", *ITEMS, "run.fast_forward=off", bench="decode_heads")}
    return d, m


def test_a_run_of_several_items_writes_each_repeating_section_once(item_runs, tmp_path):
    d, m = item_runs
    assert m["periodic"]["fast_forward"]["applied"] and not m["full"]["fast_forward"]["applied"]
    assert m["periodic"]["op_log"] == {"form": "periodic", "records": 36900, "lines": 675, "prefix": 416,
                                       "period": 18, "times": 972,
                                       "sections": [[71, 18, 28], [62, 18, 990], [27, 16, 30]],
                                       "largest": {"prefix": 18549, "period": 18, "times": 990}}
    full = (d / "full" / "op_log.jsonl").read_text()
    assert len(full.splitlines()) == 36900
    assert len((d / "periodic" / "op_log.jsonl").read_text().splitlines()) == 675
    out = subprocess.run([sys.executable, "-m", "kbframe.report.oplog", str(d / "periodic"),
                          str(tmp_path / "all.jsonl")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and (tmp_path / "all.jsonl").read_text() == full
    back = RecordTable.parse(d / "periodic" / "op_log.jsonl")
    assert back.text() == full and len(back.form.sections) == 4
    for key in ("latency_ns", "critical_path", "units"):
        assert m["periodic"].get(key) == m["full"].get(key), key
    trace = json.loads((d / "periodic" / "trace.json").read_text())["traceEvents"]
    reps = [e for e in trace if e.get("cat") == "repeated"]
    # short periods: one slice for all of a section's left-out repetitions
    assert [(e["name"], e["args"]["repetitions"]) for e in reps] == [
        ("section 1 periods 2-971 of 972", 970), ("section 2 periods 2-27 of 28", 26),
        ("section 3 periods 2-989 of 990", 988), ("section 4 periods 2-29 of 30", 28)]
    ends = 0
    for e in reps:  # one track: its slices follow each other, section after section
        t0 = round(e["ts"] * 1e6)
        assert t0 >= ends
        ends = round((e["ts"] + e["dur"]) * 1e6)
    assert (d / "full" / "trace.json").stat().st_size > 10 * (d / "periodic" / "trace.json").stat().st_size


def _nested_rows(times: int) -> list:
    """Two records before, ``times`` periods of 50 records (a layer: a PE_CPU record, 24 tiles
    of two records each, repeating, and an end record; PE0's commands +25 a period, PE1's
    +26, times +1000 ps), one record after."""
    rows = [[0, 0, -1, 0, 5, -1, 8, -1, -1, -1], [2, 0, -1, 1, 7, -1, 0, -1, -1, -1]]
    for j in range(times):
        b, c0, c1 = 1000 * j + 10, 25 * j + 1, 26 * j + 1
        rows.append([0, c0, -1, b, b + 5, -1, 8, -1, -1, -1])
        for i in range(24):
            rows += [[1, c0 + 1 + i, i, b + 10 + 20 * i, b + 25 + 20 * i, b + 12 + 20 * i, 4096, -1, -1, -1],
                     [2, c1 + i, -1, b + 25 + 20 * i, b + 28 + 20 * i, -1, 0, -1, -1, -1]]
        rows.append([2, c1 + 24, -1, b + 600, b + 601, -1, 0, -1, -1, -1])
    return rows + [[2, 999, -1, 1000 * times + 50, 1000 * times + 51, -1, 0, -1, -1, -1]]


def _nested_file(tmp_path, edit=lambda lines: lines):
    t = _table(_nested_rows(4))
    t.form = find_periodic(t, 50)
    f = io.StringIO()
    assert t.write(f) == 10
    path = tmp_path / "op_log.jsonl"
    path.write_text("".join(edit(f.getvalue().splitlines(keepends=True))))
    return path, t.text()


def test_a_period_whose_tiles_repeat_is_written_with_them_nested_and_reads_back_exactly(tmp_path):
    t = _table(_nested_rows(4))
    form = find_periodic(t, 50)
    assert (form.prefix, form.period, form.times, form.nested) == (2, 50, 4, 1)
    assert [(s.prefix, s.period, s.times) for s in form.inner] == [(3, 2, 24)]
    # as drawn: the tiles within the first and the last layer
    assert [(s.prefix, s.period, s.times) for s in form.drawn()] == [(2, 50, 4), (3, 2, 24), (153, 2, 24)]
    path, full = _nested_file(tmp_path)
    text = path.read_text().splitlines()
    assert text[0] == '{"op_log": "periodic", "records": 203, "prefix": 2, "period": 50, "times": 4, "nested": 1}'
    assert text[6] == ('{"repeat": {"records": 2, "times": 23, "depth": 1, "shift": {"cmd": 1, "tile": [1, 0], '
                       '"t_start_ns": 0.02, "t_end_ns": 0.02, "t_data_ns": 0.02}}}')
    assert text[8] == ('{"repeat": {"records": 50, "times": 3, "shift": {"cmd": {"by_name": [[0, "cpu", "load", 25], '
                       '[0, "dma_read", "load", 25], [1, "gemm", "mm", 26]]}, "t_start_ns": 1.0, "t_end_ns": 1.0, '
                       '"t_data_ns": 1.0}}}')
    assert "".join(oplog.lines(path)) == full and "".join(oplog.lines(path, chunk=1)) == full
    back = RecordTable.parse(path)
    assert back.text() == full and back.form.nested == 1
    assert [(s.prefix, s.period, s.times) for s in back.form.drawn()] == [(2, 50, 4), (3, 2, 24), (153, 2, 24)]


_OUTSIDE = ("the nested repeat line's 8 records, 23 more times, do not lie in the first period of the section of "
            "50 records from record 2")
_NO_NAME = "the repeat line's shift of cmd by name has no shift for pe 1 gemm mm"
_ORPHAN = "a nested repeat line of depth 2 before this one has no depth-1 repeat line around it"
_TWICE = "the repeat line's shift of cmd by name names pe 1 gemm mm twice"
_PAST = "the repeat line's shift of cmd, 23 times, passes 2^62"


@pytest.mark.parametrize("edit, error, parse_error", [
    (_swap(0, '"nested": 1', '"nested": 2'), ": a periodic op_log with 1 nested repeat lines; its header says 2",
     ": a periodic op_log with 1 nested repeat lines; its header says 2"),
    (_swap(6, '"records": 2,', '"records": 8,'), f":7: malformed periodic op_log line ({_OUTSIDE})",
     f':7: malformed op_log record (ValueError("{_OUTSIDE}"))'),
    (lambda ls: ls[:6] + ls[7:], ":8: malformed periodic op_log line (the repeat line does not follow the header's "
                                 "2 + 50 records, 4 times)",
     ":8: malformed op_log record (ValueError(\"the repeat line does not follow the header's 2 + 50 records, "
     "4 times\"))"),
    (_swap(8, ', [1, "gemm", "mm", 26]', ""), f":9: malformed periodic op_log line ({_NO_NAME})",
     f':9: malformed op_log record (ValueError("{_NO_NAME}"))'),
    (_swap(6, '"depth": 1', '"depth": 2'), f":9: malformed periodic op_log line ({_ORPHAN})",
     f":9: malformed op_log record (ValueError('{_ORPHAN}'))"),
    (_swap(8, '26]', '26], [1, "gemm", "mm", 27]'), f":9: malformed periodic op_log line ({_TWICE})",
     f':9: malformed op_log record (ValueError("{_TWICE}"))'),
    (_swap(6, '"cmd": 1,', f'"cmd": {1 << 60},'), f":7: malformed periodic op_log line ({_PAST})",
     f':7: malformed op_log record (ValueError("{_PAST}"))'),
    (lambda ls: ls[:4] + ['{"unit": "x", "op_log": "periodic", "records": 1}\n'] + ls[5:],
     ":5: malformed periodic op_log line (not an op_log record)",
     ":5: malformed op_log record (ValueError('the header {\"op_log\": \"periodic\", ...} must be the first line'))"),
])
def test_a_broken_nested_op_log_is_named(tmp_path, edit, error, parse_error):
    path, _ = _nested_file(tmp_path, edit)
    with pytest.raises(ValueError) as e:
        list(oplog.lines(path))
    assert str(e.value) == f"{path}{error}"
    with pytest.raises(ValueError) as e:
        RecordTable.parse(path)
    assert str(e.value) == f"{path}{parse_error}"
