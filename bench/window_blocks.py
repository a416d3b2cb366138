"""Whether the variance of engine windows is right: the spread of standardized errors (1 where it is) and the
coverage on engine windows over overlapping requests (bench/traffic_daily.py), for the interval of alpha over a day's
log with 10-minute and one-hour blocks as clusters and with specmon's variance pairing neighbouring minutes
(stats.SerialSums; --spans: also over 30 minutes to 6 hours and for shorter and longer requests), and for the
matched-hours template test on no-op rollouts over 72 hours at a constant and a daily mix, with the hours as the
observations (as specmon compares engine windows).

    cd bench && nice python window_blocks.py [--reps 100] [--seed 9] [--spans]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import production_study as ps
import traffic_daily as td

from specmon.core import stats
from specmon.drift import detector


def interval_spread(rng: np.random.Generator, reps: int, k: int = 4, hours: float = 24.0,
                    median_s: float = td.REQUEST_MEDIAN_S) -> dict:
    """alpha's interval on `hours` of windows over requests of a median_s median duration (lognormal, sigma 1;
    arrivals scaled so as many requests run at once as at the model's 40 s), with blocks as clusters (none where
    the span holds fewer than two) and with specmon's variance."""
    truth = td.truth(k, 0.5)["alpha"]
    z: dict[str, list[float]] = {"10 minutes": [], "1 hour": [], "specmon": []}
    arrivals = 0.2 * td.REQUEST_MEDIAN_S / median_s
    for _ in range(reps):
        w = td.engine_windows(rng, arrivals, hours, k, share=ps._flat, median_s=median_s)
        for name, block_us in (("10 minutes", ps.BLOCK_US), ("1 hour", 6 * ps.BLOCK_US), ("specmon", None)):
            if block_us is None:
                acc_pos, drafts = ps.bin_counts(w)
                iv = stats.cluster_interval(ps.serial_sums(acc_pos.sum(axis=0), drafts + acc_pos[:-1].sum(axis=0)))
            else:
                _, block = np.unique(w.end_us // block_us, return_inverse=True)
                if block.max() < 1:
                    continue
                iv = stats.cluster_robust_interval(np.bincount(block, w.accepted), np.bincount(block, w.checked))
            t = stats.t_quantile(0.95, iv.dof)
            z[name].append(((iv.estimate - truth) * 2 * t / (iv.hi - iv.lo), iv.lo <= truth <= iv.hi))
    return {"hours": hours, "median_s": median_s} | {
        name: {"z_spread": float(np.std([x[0] for x in v])), "coverage": float(np.mean([x[1] for x in v])),
               "se_coverage": ps._se(float(np.mean([x[1] for x in v])), len(v))} for name, v in z.items() if v}


def template_spread(rng: np.random.Generator, reps: int, k: int = 4) -> dict:
    out = {}
    for name, share in (("constant mix", ps._flat), ("daily mix", td.chat_share)):
        z, flagged = [], 0
        for _ in range(reps):
            w = td.engine_windows(rng, 0.05, 72, k, float(rng.uniform(6, 66)), 0.0, share)
            c = detector.compare(ps._window_cells(w, ~w.v2), ps._window_cells(w, w.v2), by_stratum=True)
            z.append(c.z)
            flagged += c.verdict in ("hurt", "helped")
        out[name] = {"z_spread": float(np.nanstd(z)), "flagged": flagged / reps}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--spans", action="store_true", help="also alpha's interval over 30 minutes, 1 and 6 hours of "
                    "windows over requests of a 20, 40 and 120 s median duration")
    ap.add_argument("--independent-bins", action="store_true", help="specmon's variance with independent bins as "
                    "the working model of its corrections (stats.MAX_BIN_CORRELATION 0), as it was before")
    args = ap.parse_args()
    if args.independent_bins:
        stats.MAX_BIN_CORRELATION = 0.0
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    result = {"reps": args.reps, "seed": args.seed, "independent_bins": args.independent_bins,
              "interval_24h": interval_spread(rng, args.reps),
              "template_72h": template_spread(rng, args.reps)}
    if args.spans:  # last: the parts above keep their figures
        result["interval_spans"] = [interval_spread(rng, args.reps, hours=h, median_s=m)
                                    for m in (20.0, td.REQUEST_MEDIAN_S, 120.0) for h in (0.5, 1.0, 6.0)]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
