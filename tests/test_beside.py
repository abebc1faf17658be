"""kbframe.run.beside.Forked: a job in a forked child gives what the same call gives in the
parent — its value, or its exception with the exception's fields — and the job runs in the
parent when the child cannot answer."""
import os
import signal

import pytest

from kbframe.errors import SanitizerError
from kbframe.run.beside import Forked


def _pid_and(x):
    return os.getpid(), x * 2


def test_the_value_comes_from_the_child():
    pid, value = Forked(_pid_and, 21).result()
    assert value == 42 and pid != os.getpid()


def _violate():
    raise SanitizerError("sanitizer: rule data_dependencies violated: RAW: stage gemm …", "data_dependencies")


def test_an_exception_comes_back_with_its_rule():
    with pytest.raises(SanitizerError) as ei:
        Forked(_violate).result()
    assert ei.value.rule == "data_dependencies"
    assert str(ei.value) == "sanitizer: rule data_dependencies violated: RAW: stage gemm …"


def _die_in_child(parent):
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return "made in the parent"


def test_a_child_that_dies_leaves_the_job_to_the_parent():
    assert Forked(_die_in_child, os.getpid()).result() == "made in the parent"


def _unpicklable():
    return lambda: None  # a result pickle refuses


def test_a_result_that_does_not_pickle_is_made_in_the_parent():
    assert callable(Forked(_unpicklable).result())


def test_cancel_kills_and_reaps_the_child(tmp_path):
    flag = tmp_path / "finished"
    job = Forked(lambda: (__import__("time").sleep(30), flag.write_text("x")))
    pid = job._pid
    job.cancel()
    with pytest.raises(ChildProcessError):  # reaped: no such child any more
        os.waitpid(pid, os.WNOHANG)
    assert not flag.exists()
    job.cancel()  # a second cancel does nothing
