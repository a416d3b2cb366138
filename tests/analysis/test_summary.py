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
    # a timeline's buckets (the Drift page's break-even line) read the profile's counts without their intervals
    (bucket,) = summary.summarize(store, c=float(c), bucket="day", per_position=False)
    assert bucket["break_even_alpha_basis"] == segments.PROFILE
    assert bucket["break_even_alpha"] == pytest.approx(row["break_even_alpha"])
    assert [p["checked"] for p in bucket["per_position"]] == [p["checked"] for p in row["per_position"]]
    assert all(p["conditional_lo"] is None for p in bucket["per_position"])
    # the Economics page judges a row at another c by the same rule
    same = segments.at_cost(row, float(c))
    assert (same.status, same.break_even_tokens, same.break_even_alpha, same.break_even_alpha_iid) == (
        row["status"], row["break_even_tokens"], row["break_even_alpha"], row["break_even_alpha_iid"])
    assert segments.at_cost(row, 0.8 * c).status == "healthy" and segments.at_cost(row, 1.2 * c).status == "losing"


def test_each_position_has_its_own_interval_with_requests_as_clusters(store):
    """A position's interval is alpha's interval on that position's own per-request counts: here requests differ
    only deep in the draft, so position 1's interval is as narrow as its binomial one while position 4's is wide."""
    import numpy as np
    import orjson

    from specmon.analysis import summary
    from specmon.core import stats

    rng = np.random.default_rng(3)
    rows, per_request = [], []
    for r in range(30):
        q = np.array([0.8, 0.8, 0.8, rng.choice([0.1, 0.95])])  # the last position: hard or easy by request
        draws = rng.random((40, 4)) < q
        accepted = np.where(draws.all(axis=1), 4, draws.argmin(axis=1))
        per_request.append([[int((accepted >= i).sum()), int((np.minimum(accepted + 1, 4) >= i).sum())]
                            for i in range(1, 5)])
        rows += [orjson.dumps({"request_id": f"r{r}", "ts": 1.77e9 + 40 * r + s, "k": 4, "template": "t",
                               "draft_tokens": [1, 2, 3, 4], "accepted": int(a)}, option=orjson.OPT_APPEND_NEWLINE)
                 for s, a in enumerate(accepted)]
    ingest_stream_of(store, b"".join(rows))
    counts = np.array(per_request, dtype=float)  # (request, position, [accepted, checked])
    positions = summary.summarize(store)[0]["per_position"]
    for i, p in enumerate(positions):
        want = stats.cluster_robust_interval(counts[:, i, 0], counts[:, i, 1])
        assert (p["conditional_lo"], p["conditional_hi"]) == pytest.approx((want.lo, want.hi), rel=1e-9)
    assert want.design_effect > 5 * stats.cluster_robust_interval(counts[:, 0, 0], counts[:, 0, 1]).design_effect


def ingest_stream_of(store, log: bytes) -> None:
    import io

    from specmon.ingest.pipeline import ingest_stream

    assert ingest_stream(store, io.BytesIO(log), "positions.jsonl", run="positions").status == "stored"


def test_per_position_intervals_cover_where_requests_differ_most_deep_in_the_draft():
    """Coverage of each position's interval on requests whose effect on the log-odds grows with depth (0.2 to 1.0
    per unit of a normal request effect): 400 segments of 200 requests of lognormal length. A design effect shared by
    every position (alpha's) covered about 1.000 at the shallow positions here."""
    import numpy as np

    from specmon.core import segments, stats

    rng = np.random.default_rng(8)
    base = np.log(np.array([0.85, 0.70, 0.55, 0.45]) / (1 - np.array([0.85, 0.70, 0.55, 0.45])))
    depth = np.array([0.2, 0.4, 0.7, 1.0])

    def accept(z):
        return 1 / (1 + np.exp(-(base + depth * z[:, None])))

    reach = np.cumprod(accept(np.random.default_rng(0).standard_normal(1_000_000)), axis=1).mean(axis=0)
    truth = reach / np.concatenate([[1.0], reach[:-1]])
    hits, borrowed, reps = np.zeros(4), np.zeros(4), 400
    for _ in range(reps):
        sizes = np.maximum(1, np.round(rng.lognormal(np.log(20) - 0.72, 1.2, 200))).astype(int)
        request = np.repeat(np.arange(200), sizes)
        draws = rng.random((len(request), 4)) < accept(rng.standard_normal(200))[request]
        accepted = np.where(draws.all(axis=1), 4, draws.argmin(axis=1))
        acc_pos = np.stack([np.bincount(request, accepted >= i + 1) for i in range(4)])
        reached = np.vstack([sizes, acc_pos[:-1]]).astype(float)
        alpha = stats.cluster_robust_interval(acc_pos.sum(axis=0), reached.sum(axis=0))
        for i in range(4):
            held = reached[i] > 0
            sums = stats.ClusterSums.of(acc_pos[i][held], reached[i][held])
            p = segments.position_summary(i + 1, sums.n, sums.a, float(sizes.sum()), sums=sums)
            hits[i] += p.conditional_lo <= truth[i] <= p.conditional_hi
            n_eff = reached[i].sum() / alpha.design_effect
            lo, hi = stats.wilson_interval(acc_pos[i].sum() / reached[i].sum() * n_eff, n_eff, 0.95, alpha.dof)
            borrowed[i] += lo <= truth[i] <= hi
    coverage = hits / reps  # Monte-Carlo standard error about 0.011 at 0.95
    assert ((0.92 <= coverage) & (coverage <= 0.985)).all(), coverage
    assert (borrowed / reps)[:2].min() > 0.99, borrowed / reps  # what the shared design effect gave
