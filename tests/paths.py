"""Where things are in the repository, for the tests in every folder."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
APP = ROOT / "app.py"  # the dashboard from a checkout
DATA = ROOT / "tests" / "data"
