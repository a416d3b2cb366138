"""Summaries as statistics: the same digits on every run, intervals from engine windows."""
import subprocess


def test_summary_json_prints_the_same_digits_on_an_unchanged_database(tmp_path, specmon_cmd):
    # 200,000 steps span many row groups, so DuckDB aggregates in parallel; float sums used to differ in their
    # last digits from one run to the next (beta_lo, beta_hi, gap_z)
    db = str(tmp_path / "det.duckdb")
    sim = subprocess.run([*specmon_cmd, "simulate", "--cycles", "200000", "--distributions", "beta"],
                         capture_output=True, check=True).stdout
    subprocess.run([*specmon_cmd, "ingest", "--db", db, "-"], input=sim, check=True, capture_output=True)
    outputs = {subprocess.run([*specmon_cmd, "summary", "--db", db, "--json"], capture_output=True, check=True,
                              text=True).stdout for _ in range(4)}
    assert len(outputs) == 1
