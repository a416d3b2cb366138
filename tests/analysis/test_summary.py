"""Summaries as statistics: the same digits on every run, intervals from engine windows."""
import subprocess

import pytest


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_summary_json_prints_the_same_digits_on_an_unchanged_database(tmp_path, specmon_cmd):
    # 200,000 steps span many row groups, so DuckDB aggregates in parallel; float sums used to differ in their
    # last digits from one run to the next (beta_lo, beta_hi, gap_z)
    # (written directly rather than by `specmon simulate`, which takes seconds to draw them: the sums' order is
    # what is tested, not the draws; beta varies per position so its sums have digits to lose)
    import numpy as np
    import orjson

    rng = np.random.default_rng(4)
    accepted = rng.binomial(4, 0.8, 200_000).tolist()
    beta = rng.uniform(0.5, 0.99, (200_000, 4)).tolist()
    log = b"".join(orjson.dumps({"request_id": f"r{i // 50}", "ts": 1.77e9 + i * 0.05, "k": 4, "template": "t",
                                 "draft_tokens": [1, 2, 3, 4], "accepted": a, "beta": b},
                                option=orjson.OPT_APPEND_NEWLINE)
                   for i, (a, b) in enumerate(zip(accepted, beta, strict=True)))
    db = str(tmp_path / "det.duckdb")
    subprocess.run([*specmon_cmd, "ingest", "--db", db, "-"], input=log, check=True, capture_output=True)
    outputs = {subprocess.run([*specmon_cmd, "summary", "--db", db, "--json"], capture_output=True, check=True,
                              text=True).stdout for _ in range(4)}
    assert len(outputs) == 1


def test_a_segment_of_one_request_has_an_interval_and_no_database_error(store):
    # one request: its CR2 weight 1 / (1 - n/N) would divide by zero (the watcher's first batch looks like this)
    import io

    import numpy as np
    from paper import PAPER_P, PAPER_Q

    from specmon.analysis import summary
    from specmon.core import sampler, stats
    from specmon.ingest.pipeline import ingest_stream

    buf = io.BytesIO()
    recs = list(sampler.simulate_fixed_pair(PAPER_P, PAPER_Q, 4, 50, np.random.default_rng(1), distributions="beta"))
    for r in recs:
        r["request_id"] = "only"
    sampler.write_step_log(recs, buf)
    buf.seek(0)
    assert ingest_stream(store, buf, "one.jsonl", run="one").status == "stored"
    (row,) = summary.summarize(store)
    assert row["requests"] == 1 and row["alpha_lo"] < row["alpha"] < row["alpha_hi"]
    assert row["interval_dof"] is None  # the normal quantile: no spread between clusters to estimate
    iv = stats.cluster_robust_interval(np.array([5.0, 0.0]), np.array([10.0, 0.0]))
    assert iv.lo < 0.5 < iv.hi


def test_the_headline_status_holds_at_break_even_where_acceptance_falls_along_the_draft(store):
    """Acceptance 0.85, 0.70, 0.55, 0.45 by position (as EAGLE-style drafts show) with c set so that L = 1 + k c
    exactly: the deployment is at break-even. The i.i.d. alpha* (about 0.727) lies above the observed alpha (about
    0.692), so alpha against it calls the segment losing, more surely the more data; L against 1 + k c, the
    headline, does not, and the break-even alpha of the measured profile sits inside alpha's interval."""
    import io

    import numpy as np
    import orjson

    from specmon.analysis import summary
    from specmon.core import segments, theory
    from specmon.ingest.pipeline import ingest_stream

    conditional = np.array([0.85, 0.70, 0.55, 0.45])
    true_tokens = 1 + np.cumprod(conditional).sum()
    c = (true_tokens - 1) / 4
    rng = np.random.default_rng(11)
    draws = rng.random((20_000, 4)) < conditional
    accepted = np.where(draws.all(axis=1), 4, draws.argmin(axis=1))  # the accepted prefix
    log = b"".join(orjson.dumps({"request_id": f"r{i // 20}", "ts": 1.77e9 + i * 0.05, "k": 4, "template": "t",
                                 "draft_tokens": [1, 2, 3, 4], "accepted": int(a)}, option=orjson.OPT_APPEND_NEWLINE)
                   for i, a in enumerate(accepted))
    ingest_stream(store, io.BytesIO(log), "profile.jsonl", run="profile")
    row = summary.summarize(store, c=float(c))[0]
    assert row["alpha_hi"] < theory.break_even_alpha(4, c) == row["break_even_alpha_iid"]
    assert row["status_iid"] == "losing"
    assert (row["status"], row["status_basis"]) == ("at risk", segments.TOKENS)
    assert row["tokens_per_step_lo"] < row["break_even_tokens"] < row["tokens_per_step_hi"]
    assert row["break_even_alpha_basis"] == segments.PROFILE
    assert row["alpha_lo"] < row["break_even_alpha"] < row["alpha_hi"]
