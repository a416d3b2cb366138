"""The processes calibrations run in end with the process that started them, even when that one is killed outright
(a watcher or an ingest killed mid-calibration): real processes, SIGKILL."""
import os
import subprocess
import sys

from waiting import running, until

CALLER = r"""
import os, time
from specmon.drift import alarms
with alarms.calibration_pool(2) as pool:
    pids = {pool.submit(os.getpid).result() for _ in range(8)}
    print(" ".join(map(str, sorted(pids))), flush=True)
    pool.submit(time.sleep, 600).result()
"""


def test_calibration_workers_end_with_a_caller_killed_outright():
    caller = subprocess.Popen([sys.executable, "-c", CALLER], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in caller.stdout.readline().split()]
        assert workers and caller.pid not in workers and all(running(pid) for pid in workers)
    finally:
        caller.kill()
        caller.wait()
    until(lambda: not any(running(pid) for pid in workers), 30, "the calibration workers to end with their caller")
    assert os.getpid() not in workers
