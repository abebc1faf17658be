"""WaitLog.rows (kbframe.sim.waits): what each record waited for, worked out column by
column. Checked against a hand-built log whose answers are known, and against the record
by record loop it replaced (kept here as the reference) on runs of every workload."""
from __future__ import annotations

import pytest

from conftest import compose_cfg
from kbframe.run.bench import validate
from kbframe.run.simulate import simulate
from kbframe.sim.targets import resolve_kernel
from kbframe.sim.waits import _RAW_STAGE, KINDS, WAIT_CODE, WaitLog
from kbframe.tl.recipe import load_recipes


def _reference_rows(w: WaitLog) -> list:
    """The loop rows() replaced, one record at a time (its module doc is the rule)."""
    c, names = w.table.cols(), w.names()
    d = list(zip(*(c[f].tolist() for f in ("name", "cmd", "t0", "t1", "td", "why", "ref"))))
    n = len(d)
    admit_ps = {}
    for code, cmd, t0, _, _, kind, _ in d:
        if kind != _RAW_STAGE and names[code][1] == "scheduler":
            admit_ps[(names[code][0], cmd)] = t0
    ended_at, last, last_dispatch, out = {}, {}, {}, []
    for i in range(n):
        code, cmd, t0, t1, t_data, kind, ref = d[i]
        pe, unit, op_kind = names[code]
        end_ref = -1
        if kind in (_RAW_STAGE, _RAW_STAGE - 1):
            if kind == _RAW_STAGE - 1:  # a receive readied by its message: ref is the send's record
                ready, why = t0, "link"
            elif ref >= 0:
                ready, why = d[ref][3], "dep"
            else:
                ready, why, ref = admit_ps.get((pe, cmd), t0), "admit", cmd
            ends = ended_at.setdefault((pe, unit), {})
            if t0 != ready:
                why, ref = "unit", ends.get(t0, -1)
            prev = last.get((pe, unit))
            if t_data >= 0 and prev is not None and prev[0] == t_data:
                end_ref = prev[1]
            ends[t1] = i
            last[(pe, unit)] = (t1, i)
        elif unit == "cpu":
            why = KINDS[kind]
            if kind == WAIT_CODE["cpu"]:
                ref = last_dispatch.get(pe, -1)
                why = why if ref >= 0 else "start"
            last_dispatch[pe] = i
        else:
            why = KINDS[kind]
            p = out[i - 1] if i else None
            if p is not None and p[0] == pe and p[3] == cmd and p[1] not in ("cpu", "scheduler"):
                end_ref = i - 1
        out.append((pe, unit, op_kind, cmd, t0, t1, t_data, why, ref, end_ref))
    return out


def _log(records) -> WaitLog:
    """A WaitLog of ``(pe, unit, op_kind, cmd, t0, t1, t_data, kind code, ref)``."""
    w = WaitLog()
    for pe, unit, kind, cmd, t0, t1, td, why, ref in records:
        w.table.append(w.code(pe, unit, kind), cmd, -1, t0, t1, td, 0, -1, why, ref)
    return w


def test_rows_of_a_hand_built_log():
    """Two dispatches; two DMA transfers on one channel (the second's data phase starts as
    the first's ends); GEMMs readied by them but held by the unit; the completions, each
    logged right after its last stage. Command 2's admission is logged after its stages
    and still found."""
    S = _RAW_STAGE
    w = _log([
        (0, "cpu", "composite", 1, 0, 10, -1, WAIT_CODE["start"], -1),            # 0
        (0, "cpu", "composite", 2, 10, 20, -1, WAIT_CODE["cpu"], -1),             # 1
        (0, "dma_read", "dma_read", 1, 10, 50, 30, S, -1),                        # 2 admitted at 10
        (0, "gemm", "gemm", 9, 0, 60, -1, S, -1),                                  # 3 never admitted
        (0, "dma_read", "dma_read", 2, 20, 80, 50, S, -1),                        # 4 data after 2's
        (0, "gemm", "gemm", 1, 60, 90, -1, S, 2),                                  # 5 ready at 50
        (0, "scheduler", "composite", 1, 10, 90, -1, WAIT_CODE["dispatch"], 1),     # 6
        (0, "gemm", "gemm", 2, 90, 95, -1, S, 4),                                  # 7 ready at 80
        (0, "scheduler", "composite", 2, 20, 95, -1, WAIT_CODE["dispatch"], 2),     # 8
    ])
    rows = w.rows()
    assert rows == _reference_rows(w)
    assert [r[7:] for r in rows] == [
        ("start", -1, -1),
        ("cpu", 0, -1),        # PE_CPU: the previous dispatch
        ("admit", 1, -1),      # ready at its command's admission
        ("admit", 9, -1),      # no admission record: ready at its start
        ("admit", 2, 2),       # its data phase waited for record 2's
        ("unit", 3, -1),       # ready at 50, the GEMM was busy until record 3 ended at 60
        ("dispatch", 1, 5),    # completed by record 5
        ("unit", 5, -1),       # ready at 80, held by record 5 (ended at 90)
        ("dispatch", 2, 7),
    ]


def _wait_rows(bench, *overrides):
    cfg = compose_cfg(*overrides, "bench.data=false", "run.progress=false", bench=bench)
    wl = validate(cfg)
    kernel = resolve_kernel(cfg.bench.kernel, "bench.kernel", True, kwargs=tuple(wl.kernel_kwargs(None)))
    return simulate(cfg, wl, kernel, load_recipes(cfg.get("recipes")), None, None, False, False).oplog.waits


@pytest.mark.parametrize("bench, overrides", [
    ("decode_opt2", ("bench.S_kv=8192",)),
    ("decode_opt3", ("bench.S_kv=4100", "bench.tile=32")),
    ("decode_opt2", ("bench.S_kv=4100", "bench.tile=128", "++bench.s_buffers=3", "++bench.v_staging=prefetch")),
    ("decode_heads", ("+model=llama3_70b", "hardware=cube", "hardware.hbm_mode=shared", "bench.S_kv=2048")),
    ("decode_splitk", ("hardware=cube", "bench.splits=8", "bench.merge=tree", "bench.S_kv=8192")),
    ("decode_splitk", ("hardware=cube", "bench.splits=8", "bench.merge=chain", "bench.S_kv=4096")),
    ("gemm_load_ref", ()),
    ("rmsnorm_linear", ()),
])
def test_rows_equal_the_record_by_record_loop(bench, overrides):
    w = _wait_rows(bench, *overrides)
    rows = w.rows()
    assert rows == _reference_rows(w)
    kinds = {r[7] for r in rows}
    assert kinds >= {"start", "dispatch", "admit"} and kinds & {"dep", "unit"}
