"""Another process holding a database: a writer with one transaction open, as a long publish would, until told to
let go (a line on stdin) or for a given time."""
import subprocess
import sys

_HOLD = """
import select, sys, time
from specmon.store.database import Store
s = Store(sys.argv[1])
with s.transaction() as cur:
    cur.execute("SELECT count(*) FROM runs").fetchall()
    print("holding", flush=True)
    select.select([sys.stdin], [], [], float(sys.argv[2]))
"""


def hold_database(db: str, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, db, str(seconds)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc
