"""orchestrator/report/forked.py: work sent to a forked child comes back whole, a failure comes back as one,
and a child the parent leaves behind is stopped."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from orchestrator.report.forked import ChildFailed, Family, Worker
from orchestrator.stats.columns import joined_row_class, row_class


def _pid_and_rows(rows):
    return os.getpid(), [dict(r.items()) for r in rows], rows


def test_the_result_comes_from_another_process_and_rows_read_as_they_did():
    Row = row_class(("run_id", "status", "reason"))
    rows = [Row(run_id=1, status="done"), Row(run_id=2, status="failed", reason="oom")]
    with Worker() as child:
        child_pid = child._pid
        pid, plain, back = child.submit(_pid_and_rows, rows).result()
    assert pid == child_pid != os.getpid()
    assert plain == [{"run_id": 1, "status": "done", "reason": None},
                     {"run_id": 2, "status": "failed", "reason": "oom"}]
    assert back == rows and back[0]["reason"] is None and back[0].get("reason") is None
    assert list(back[1]) == ["run_id", "status", "reason"]
    with pytest.raises(KeyError):
        back[0]["no such column"]


def _shapes(share):
    """What the child sees of a share: which of its lists are one object, which rows are one row, and
    each row's columns in their order."""
    fit, (keep, check), mixed = share["fit"], share["check"], share["mixed"]
    return {"fit_is_again": share["again"] is fit, "check_is_tuple": type(check) is tuple,
            "shared_rows": [any(r is f for f in fit) for r in check],
            "rows": [list(dict.items(r)) for r in fit + list(check) + mixed],
            "nones": [r["reason"] for r in fit], "keep": keep, "classes": len({type(r) for r in fit + mixed})}


def test_lists_of_rows_go_to_the_child_packed_and_arrive_as_the_same_rows_shared_as_they_were():
    Row, Other = row_class(("run_id", "status", "reason")), row_class(("job_id", "status"))
    fit = [Row(run_id=i, status="done") if i % 3 else Row(run_id=i, status="failed", reason=f"r{i}") for i in range(7)]
    check = (fit[1], fit[4], Row(run_id=99, status="done"))  # two rows of the fit's, one of its own
    mixed = [Other(job_id=5, status="done"), fit[0]]  # rows of two classes: sent one by one
    share = {"fit": fit, "again": fit, "check": ({"a"}, check), "mixed": mixed}
    with Worker() as child:
        seen = child.submit(_shapes, share).result()
    assert seen["fit_is_again"] and seen["check_is_tuple"] and seen["keep"] == {"a"}
    assert seen["shared_rows"] == [True, True, False]
    assert seen["rows"] == [list(dict.items(r)) for r in fit + list(check) + mixed]
    assert seen["nones"] == [r["reason"] for r in fit] and seen["nones"][1] is None
    assert seen["classes"] == 2


def test_runs_rows_with_their_configurations_row_arrive_whole_one_by_one_or_packed():
    """A JoinedRow (a run's row: its configuration's columns in a row shared between runs) reaches the
    child as a compact row of all its columns, alone or in a list of rows."""
    Row = joined_row_class(("run_id", "d_model", "status", "reason", "freq_mhz"), ("d_model", "freq_mhz"))
    Conf = row_class(("d_model", "freq_mhz"))
    conf = Conf(d_model=64)
    rows = [Row(run_id=i, status="done") for i in range(3)]
    for r in rows:
        r.conf = conf
    with Worker() as child:  # (a worker takes one task)
        alone, = child.submit(_pid_and_rows, [rows[0]]).result()[1]
    with Worker() as child:
        seen = child.submit(_shapes, {"fit": rows, "again": rows, "check": (None, ()), "mixed": []}).result()
    assert alone == {"run_id": 0, "d_model": 64, "status": "done", "reason": None, "freq_mhz": None}
    assert seen["rows"] == [[("run_id", i), ("status", "done"), ("d_model", 64)] for i in range(3)]
    assert seen["nones"] == [None] * 3 and seen["fit_is_again"]


def _fails():
    raise ValueError("a reason only the child knows")


def test_a_failure_in_the_child_is_raised_with_its_traceback():
    with Worker() as child, pytest.raises(ChildFailed, match="a reason only the child knows"):
        child.submit(_fails).result()


def _sleeps():
    time.sleep(60)


@pytest.mark.parametrize("given", [True, False])
def test_leaving_the_block_stops_a_child_still_running_or_still_waiting(given):
    with pytest.raises(RuntimeError):
        with Worker() as child:
            pid = child._pid
            if given:
                child.submit(_sleeps)
            assert psutil.pid_exists(pid)
            raise RuntimeError("the parent failed first")
    assert not psutil.pid_exists(pid)


def test_a_worker_forked_later_does_not_hold_back_an_earlier_ones_task():
    """Each child inherits the open ends of the pipes of those forked before it: a task read to the
    end of its pipe would wait for every later child to exit (here: forever)."""
    import signal

    def timeout(*_):
        raise TimeoutError("the first worker never got its task")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    try:
        with Worker() as first, Worker() as second:  # the second waits for a task it never gets
            pid = first._pid
            assert first.submit(os.getpid).result() == pid
            assert second._pid is not None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _niceness():
    return os.nice(0)


def test_a_child_asked_to_yield_the_cpu_runs_at_a_lower_priority_than_its_parent():
    with Worker(nice=5) as child:
        assert child.submit(_niceness).result() == min(19, os.nice(0) + 5)
    with Worker() as child:
        assert child.submit(_niceness).result() == os.nice(0)


def _warm():
    os.environ["CPUBENCH_WARMED_IN"] = str(os.getpid())


def _children() -> set[int]:
    """This process's children now (the suite's own, a resource tracker say, live beside a test's)."""
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _who():
    return os.getpid(), os.getppid(), os.environ.get("CPUBENCH_WARMED_IN"), os.nice(0)


def test_a_familys_workers_share_one_warm_up_and_each_runs_its_own_task_at_its_own_priority():
    """Family: one child warms, then forks the workers; each comes back with its own result, a
    failure as ChildFailed, and nothing is left running or unreaped after the block."""
    before = _children()
    with Family(_warm, [0, 0, 5]) as family:
        got = [w.submit(_who).result() for w in family.workers[:3]]
    assert len({pid for pid, *_ in got}) == 3 and os.getpid() not in {pid for pid, *_ in got}
    warmed = {warmed_in for _, _, warmed_in, _ in got}
    assert len(warmed) == 1 and {parent for _, parent, _, _ in got} == {int(warmed.pop())}  # forked after the warm-up
    assert [nice for *_, nice in got] == [os.nice(0), os.nice(0), min(19, os.nice(0) + 5)]
    with Family(_warm, [0]) as family, pytest.raises(ChildFailed, match="a reason only the child knows"):
        family.workers[0].submit(_fails).result()
    assert _children() == before


def test_leaving_a_familys_block_stops_its_workers_still_running_or_still_waiting():
    before = _children()
    with pytest.raises(RuntimeError):
        with Family(_warm, [0, 0]) as family:
            family.workers[0].submit(_sleeps)
            pids = [family.pid_of(0), family.pid_of(1)]
            assert all(psutil.pid_exists(pid) for pid in pids)
            raise RuntimeError("the parent failed first")
    assert not any(psutil.pid_exists(pid) for pid in pids)
    assert _children() == before


def _pid_and_sum(values):
    return os.getpid(), sum(values)


def _sends(worker, values):
    worker.submit(_pid_and_sum, values)
    return os.getpid()


def test_a_task_given_at_the_fork_runs_at_once_on_what_the_parent_held_and_may_send_another_its_task():
    """Worker(task=...) runs the callable in the child with no pickling of its arguments (a closure, a
    lambda's data); that child can send a worker forked before it its task (sent_elsewhere: this process
    closes its end), whose result comes back here."""
    values = list(range(1000))
    with Worker() as later, Worker(task=lambda: _sends(later, values)) as sender:
        later.sent_elsewhere()
        sender_pid = sender.result()
        pid, total = later.result()
    assert sender_pid not in (os.getpid(), pid) and total == sum(values)


def test_a_worker_whose_sender_fails_first_ends_without_a_result():
    with Worker() as later, Worker(task=_fails) as sender:
        later.sent_elsewhere()
        with pytest.raises(ChildFailed, match="a reason only the child knows"):
            sender.result()
        with pytest.raises(ChildFailed, match="without a result"):
            later.result()
