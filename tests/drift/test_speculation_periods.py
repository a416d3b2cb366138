"""Periods of a run served without speculation (`specmon annotate --speculation off|on`), and windows that carry
the load alone, which the drift detector leaves out."""
import subprocess

import numpy as np
import pytest
from engine_lines import REAL_V1_LOAD_ALONE, v1_line

from specmon.drift import alarms
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store


def test_annotate_records_a_period_without_speculation_and_back(tmp_path, specmon_cmd):
    db = str(tmp_path / "a.duckdb")
    log = tmp_path / "prod.log"
    log.write_text(REAL_V1_LOAD_ALONE + "\n")
    assert subprocess.run([*specmon_cmd, "ingest", "--db", db, "--run", "prod", str(log)],
                          capture_output=True).returncode == 0
    off = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "prod", "--speculation", "off", "--at",
                          "2026-07-21T12:00:00", "--note", "A/B: drafter disabled"], capture_output=True, text=True)
    assert off.returncode == 0 and "served without speculation from 2026-07-21 12:00:00 UTC" in off.stdout
    on = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "prod", "--speculation", "on", "--at",
                         "2026-07-21T13:00:00"], capture_output=True, text=True)
    assert on.returncode == 0 and "with speculation again" in on.stdout
    both = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "prod", "--speculation", "off",
                           "--template", "v2"], capture_output=True, text=True)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    neither = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "prod"], capture_output=True, text=True)
    assert neither.returncode == 2 and "one of the arguments --template --speculation is required" in neither.stderr
    missing = subprocess.run([*specmon_cmd, "annotate", "--db", db, "--run", "staging", "--speculation", "off"],
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "no run named 'staging'" in missing.stderr and "Traceback" not in missing.stderr
    with Store(db) as store:
        assert store.query("SELECT starts_at::VARCHAR, speculation, note FROM speculation_periods ORDER BY "
                           "period_id") == [("2026-07-21 12:00:00", False, "A/B: drafter disabled"),
                                            ("2026-07-21 13:00:00", True, None)]


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_the_detector_leaves_windows_with_the_load_alone_out(store, tmp_path):
    rng = np.random.default_rng(7)
    spec = []
    for i in range(240):
        drafts = int(rng.integers(60, 120))
        first = int(rng.binomial(drafts, 0.8))
        spec.append(v1_line(i // 60, i % 60, drafts, [first, int(rng.binomial(first, 0.8))]))
    # an engine of another process beside it, without speculation: windows with the load alone
    alone = [REAL_V1_LOAD_ALONE.replace("12:32:37", f"10:{i // 60:02d}:{i % 60:02d}").replace("07-21", "11-29")
             for i in range(0, 240, 3)]
    mixed = []
    for i, line in enumerate(spec):
        mixed += [line, alone[i // 3]] if i % 3 == 0 else [line]
    (tmp_path / "spec.log").write_text("\n".join(spec) + "\n")
    (tmp_path / "mixed.log").write_text("\n".join(mixed) + "\n")
    assert ingest_file(store, str(tmp_path / "spec.log"), run="spec").steps == 240
    assert ingest_file(store, str(tmp_path / "mixed.log"), run="mixed").steps == 240 + len(alone)
    plain, with_load = alarms.analyse_run(store, "spec", c=0.2), alarms.analyse_run(store, "mixed", c=0.2)
    assert plain.design is not None and plain.design == with_load.design
    assert plain.cusum["W"].tolist() == with_load.cusum["W"].tolist()
