"""The case the load view exists for, through the command line as a user meets it: a vLLM deployment whose
acceptance stays flat from 2 to 32 running requests while its payoff against an engine without speculation goes
from a gain to a loss. The batch-1 status calls it healthy; `check` must exit 1 at high load, and `recommend` must
say where to turn speculation off.

The log lines are vLLM V1's own, copied from tests/data/engines/vllm-v1-load-1.log (a user's server log), with the
figures changed: the load line of each 10-second interval and the SpecDecoding line of the same engine."""
import json
import subprocess
from datetime import datetime, timedelta

import pytest
from paths import DATA

LOAD = (DATA / "engines" / "vllm-v1-load-1.log").read_text().splitlines()
ENGINE_LINE = next(line for line in LOAD if "Engine 000: Avg prompt throughput" in line)
SPEC_LINE = next(line for line in LOAD if "SpecDecoding metrics" in line)
# The public paired runs' payoff (vLLM 0.6.3, Qwen2.5-7B, AWQ draft, k = 1) at 2 (read off the batch 1-4 gain), 8,
# 16 and 32 running requests.
PAYOFF = {2: 1.2, 8: 1.03, 16: 0.91, 32: 0.84}


def _stamp(line: str, ts: datetime) -> str:
    head, rest = line.split(" INFO ", 1)
    return f"{head} INFO {ts:%m-%d %H:%M:%S} [{rest.split('[', 1)[1]}"


def _load_line(ts: datetime, running: int, throughput: float) -> str:
    line = _stamp(ENGINE_LINE, ts)
    left, _, right = line.partition("Avg generation throughput: ")
    line = left + f"Avg generation throughput: {throughput:.1f} tokens/s," + right.split(",", 1)[1]
    left, _, right = line.partition("Running: ")
    return left + f"Running: {running} reqs," + right.split(",", 1)[1]


def _spec_line(ts: datetime, drafts: int) -> str:
    """k = 1 at acceptance 0.88 whatever the load: Accepted and Drafted of the interval, the rates to match."""
    line = _stamp(SPEC_LINE, ts)
    accepted = round(0.88 * drafts)
    prefix = line.split("SpecDecoding metrics: ", 1)[0]
    return (prefix + f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, Accepted "
            f"throughput: {accepted / 10:.2f} tokens/s, Drafted throughput: {drafts / 10:.2f} tokens/s, Accepted: "
            f"{accepted} tokens, Drafted: {drafts} tokens, Per-position acceptance rate: {accepted / drafts:.3f}, "
            f"Avg Draft acceptance rate: {100 * accepted / drafts:.1f}%")


def write_logs(tmp_path, hours: int = 3) -> tuple[str, str]:
    """A speculative engine's log and a plain engine's, the load stepping through 2, 8, 16, 32 every 20 minutes,
    ending at 32; each interval's throughput carries 3% of noise that persists about a minute."""
    import numpy as np

    rng = np.random.default_rng(3)
    start = datetime(datetime.now().year, 1, 5, 8, 0, 0)
    spec, plain = [], []
    noise = 0.0
    levels = list(PAYOFF)
    for i in range(hours * 360):
        ts = start + timedelta(seconds=10 * i)
        n = levels[(i // 120) % len(levels)] if i < hours * 360 - 120 else 32
        noise = 0.85 * noise + 0.53 * rng.standard_normal()
        base = 100 * n ** 0.8 * (1 + 0.03 * noise)
        plain.append(_load_line(ts, n, base))
        spec.append(_load_line(ts, n, base * PAYOFF[n] * (1 + 0.01 * rng.standard_normal())))
        spec.append(_spec_line(ts, 40 * n))
    (tmp_path / "prod.log").write_text("\n".join(spec) + "\n")
    (tmp_path / "prod-plain.log").write_text("\n".join(plain) + "\n")
    return str(tmp_path / "prod.log"), str(tmp_path / "prod-plain.log")


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_flat_acceptance_under_a_falling_payoff_fails_check_at_high_load(tmp_path, specmon_cmd):
    spec, plain = write_logs(tmp_path)
    db = str(tmp_path / "load.duckdb")

    def specmon(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*specmon_cmd, *args, "--db", db], capture_output=True, text=True, timeout=600)

    assert specmon("ingest", "--run", "prod", spec).returncode == 0
    assert specmon("ingest", "--run", "prod-plain", "--baseline-of", "prod", plain).returncode == 0
    summary = json.loads(specmon("summary", "--json", "--c", "0.05").stdout)
    prod = next(r for r in summary if r["run"] == "prod")
    assert prod["status"] == "healthy" and 0.86 < prod["alpha"] < 0.9  # acceptance alone says all is well
    assert prod["running_requests"] is not None and prod["generation_throughput"] is not None

    check = specmon("check", "--c", "0.05")
    assert check.returncode == 1, check.stdout + check.stderr
    [line] = [line for line in check.stdout.splitlines() if line.startswith("LOSING AT LOAD")]
    assert "run 'prod'" in line and "N = 32 running requests" in line and "pays up to 8, loses from 16" in line

    rec = json.loads(specmon("recommend", "--json").stdout)
    [doc] = [d for d in rec if d["run"] == "prod"]
    assert doc["baseline"] == "the windows of 'prod-plain', declared its baseline"
    assert doc["status_at_load"] == "loses" and doc["current_concurrency"] == 32
    assert [(p["concurrency"], p["alpha"] is not None) for p in doc["points"]] == [
        (2, True), (8, True), (16, True), (32, True)]
    assert all(abs(p["alpha"] - 0.88) < 0.01 for p in doc["points"])  # flat acceptance, beside the speedup
    assert doc["policy"] == [{"max_concurrency": 8, "k": 1}, {"max_concurrency": None, "k": 0}]
