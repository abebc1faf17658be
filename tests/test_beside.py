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


def test_a_fork_that_fails_leaves_the_job_to_the_parent(monkeypatch):
    """A pids limit or no memory to spare (os.fork raises): the run goes on, the job is
    made by result() in the parent."""
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(os, "fork", no_fork)
    assert Forked(_pid_and, 21).result() == (os.getpid(), 42)


def _bug():
    return {}["missing key"]


def test_a_bug_in_the_child_says_where_it_was():
    """An exception that is not a user error comes back with the text of the child's
    traceback as a note (the frame that raised it, not only Forked.result); a user error
    comes back as it is."""
    with pytest.raises(KeyError) as ei:
        Forked(_bug).result()
    (note,) = ei.value.__notes__
    assert "in _bug" in note and 'return {}["missing key"]' in note and note.endswith("KeyError: 'missing key'")
    with pytest.raises(SanitizerError) as ei:
        Forked(_violate).result()
    assert not getattr(ei.value, "__notes__", None)


def _locks_held():
    from kbframe import files
    return len(files._held)


def test_the_child_holds_no_run_directory_lock(tmp_path):
    """The child closes its copies of the parent's directory locks: if the parent dies,
    the next run is not refused by an orphan."""
    from kbframe.files import dir_lock
    with dir_lock(tmp_path):
        assert Forked(_locks_held).result() == 0
        assert _locks_held() == 1  # the parent still holds it


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_child_dies_with_its_parent(tmp_path):
    """A parent killed (SIGKILL, the OOM killer) takes its forked child with it."""
    import subprocess
    import sys
    import time
    code = ("import time; from kbframe.run.beside import Forked\n"
            "job = Forked(time.sleep, 60)\n"
            "print(job._pid, flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    p.kill()
    p.wait()
    def alive(pid):  # a zombie (dead, not yet reaped by its new parent) counts as dead
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False
    for _ in range(100):
        if not alive(child):
            break
        time.sleep(0.02)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its parent")


def test_tensors_file_without_a_thread_writes_the_same(tmp_path, monkeypatch):
    """No thread to spare (RuntimeError at start): the arrays are written by results(),
    in the same order, with the same values."""
    import threading
    import numpy as np
    from kbframe.run.beside import TensorsFile

    def no_thread(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    a = np.arange(6.0).reshape(2, 3)
    t = TensorsFile(tmp_path / "t.npz", lambda: {"a": a}, lambda: {"ref": a * 2})
    assert t.results()["ref"].tolist() == (a * 2).tolist()
    t.finish({"out": a + 1})
    with np.load(tmp_path / "t.npz") as z:
        assert z.files == ["a", "ref", "out"]
        assert z["out"].tolist() == (a + 1).tolist()


def test_abandoning_a_busy_thread_does_not_wait_for_it(tmp_path):
    """Ctrl-C while the thread computes the reference: abandon() returns at once and the
    thread stops and closes the file itself."""
    import threading
    import numpy as np
    from kbframe.run.beside import TensorsFile
    go = threading.Event()

    def slow_reference():
        go.wait(10)
        return {"ref": np.zeros(3)}
    t = TensorsFile(tmp_path / "t.npz", lambda: {"a": np.ones(3)}, slow_reference)
    t.abandon()
    assert t._thread.is_alive()  # abandon() returned while the thread still waits to compute
    go.set()
    t._thread.join(10)
    assert not t._thread.is_alive() and t._zip.fp is None  # closed by the thread


def _bug_in_the_report():
    return {"metrics": 1 / 0}


def test_a_kept_bug_shows_its_traceback_once_here_or_after_a_fork():
    """An exception kept to be raised later (Outcome: a report's, a sanitizer half's) shows
    the traceback it was raised with once: its own in this process, and, sent back by a
    forked process (pickled, its traceback lost), the child's as a note."""
    from kbframe.run.beside import Outcome
    here = Outcome(_bug_in_the_report)
    with pytest.raises(ZeroDivisionError) as e:
        here.result()
    assert not getattr(e.value, "__notes__", None)
    assert e.traceback[-1].name == "_bug_in_the_report"
    sent = Forked(Outcome, _bug_in_the_report).result()
    with pytest.raises(ZeroDivisionError) as e:
        sent.result()
    assert len(e.value.__notes__) == 1
    assert 'in _bug_in_the_report\n    return {"metrics": 1 / 0}' in e.value.__notes__[0]
    assert e.value.__notes__[0].endswith("ZeroDivisionError: division by zero")
    with pytest.raises(ZeroDivisionError) as e:  # raised again: still one note
        sent.result()
    assert len(e.value.__notes__) == 1


def test_ctrl_c_during_the_fork_is_taken_after_it():
    """A SIGINT that comes while the run forks (here sent by an at-fork handler, where
    logging's own run) reaches the parent as KeyboardInterrupt just after the fork, not
    inside the at-fork handlers, where Python would drop it with an "Exception ignored"
    message and the run would go on; the child it forked is ended and reaped first (the
    parent never learned of it)."""
    import subprocess
    import sys
    script = (
        "import os, signal\n"
        "from kbframe.run.beside import Forked\n"
        "os.register_at_fork(after_in_parent=lambda: [os.kill(os.getpid(), signal.SIGINT), sum(range(10**5))])\n"
        "try:\n"
        "    Forked(abs, -3).result()\n"
        "    print('not interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    try:\n"
        "        os.waitpid(-1, os.WNOHANG)\n"
        "        print('interrupted after the fork, a child left')\n"
        "    except ChildProcessError:\n"
        "        print('interrupted after the fork')\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert (p.stdout, p.stderr) == ("interrupted after the fork\n", "")
