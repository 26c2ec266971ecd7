"""orchestrator/forked.py: work in a forked child comes back whole, a failure comes back as one."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from orchestrator.forked import ChildFailed, Forked
from orchestrator.rows import row_class


def _pid_and_rows(rows):
    return os.getpid(), [dict(r.items()) for r in rows], rows


def test_the_result_comes_from_another_process_and_rows_read_as_they_did():
    Row = row_class(("run_id", "status", "reason"))
    rows = [Row(run_id=1, status="done"), Row(run_id=2, status="failed", reason="oom")]
    with Forked(_pid_and_rows, rows) as child:
        pid, plain, back = child.result()
    assert pid != os.getpid()
    assert plain == [{"run_id": 1, "status": "done", "reason": None}, {"run_id": 2, "status": "failed", "reason": "oom"}]
    assert back == rows and back[0]["reason"] is None and back[0].get("reason") is None
    assert list(back[1]) == ["run_id", "status", "reason"]
    with pytest.raises(KeyError):
        back[0]["no such column"]


def _fails():
    raise ValueError("a reason only the child knows")


def test_a_failure_in_the_child_is_raised_with_its_traceback():
    with Forked(_fails) as child, pytest.raises(ChildFailed, match="a reason only the child knows"):
        child.result()


def _sleeps():
    time.sleep(60)


def test_leaving_the_block_stops_a_child_still_running():
    with pytest.raises(RuntimeError):
        with Forked(_sleeps) as child:
            pid = child._pid
            assert psutil.pid_exists(pid)
            raise RuntimeError("the parent failed first")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
