"""Every process a command starts ends with it: after ``attnflow reproduce`` with two worker
processes has exited, nothing of its session is left (no pool worker, no resource tracker)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest


def _session_members(sid: int) -> list[str]:
    rows = subprocess.run(["ps", "-e", "-o", "pid=,sid=,args="], capture_output=True, text=True).stdout
    return [row for row in rows.splitlines() if row.split()[1:2] == [str(sid)]]


def test_a_process_left_behind_is_seen():
    """The check can fail: a command that leaves a child running is caught by its session id."""
    process = subprocess.Popen(["sh", "-c", "sleep 3 & exit 0"], start_new_session=True)
    process.wait(timeout=10)
    assert any("sleep 3" in row for row in _session_members(process.pid))


@pytest.mark.slow
def test_reproduce_with_worker_processes_leaves_no_process_behind(tmp_path):
    command = [sys.executable, "-m", "attnflow", "reproduce", "--quick", "--only", "E0,E1", "--workers", "2",
               "--out", str(tmp_path / "out")]  # fmt: skip
    # a session of its own: every process it starts (workers, trackers) carries its session id
    process = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    left = _session_members(process.pid)
    for _ in range(20):  # a process that is ending may take a moment to be reaped
        if not left:
            break
        time.sleep(0.25)
        left = _session_members(process.pid)
    assert left == []
