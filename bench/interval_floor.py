"""Which quantile alpha's interval should take where the requests' variance is at or below the binomial one (the
design effect's floor): coverage of the 95% interval at 3 to 20 requests, on the study's model (bench/streams.py:
each request its own acceptance, a beta whose correlation within a request is --rhos, lognormal lengths, k = 4,
alpha 0.70), three ways on the same replicates, set through stats.BINOMIAL_FLOOR_MIN_CLUSTERS:
- "t at the floor": the t quantile at the requests' degrees of freedom wherever the floor holds;
- "z at the floor": the normal quantile wherever it holds, however few the requests;
- "as used": the normal quantile from BINOMIAL_FLOOR_MIN_CLUSTERS requests, t below.
Also the share of replicates where the floor holds. Prints a table; --out keeps the JSON.

    cd bench && nice python interval_floor.py --out interval_floor.json
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import streams
from _common import machine, run_cells

from specmon.core import stats

ALPHA, K = 0.70, 4
WAYS = {"t at the floor": 10**9, "z at the floor": 2, "as used": stats.BINOMIAL_FLOOR_MIN_CLUSTERS}


def cell(rho: float, requests: int, reps: int, seed: int) -> dict:
    """Coverage of each way, and how often the floor holds, on the same replicates."""
    rng = np.random.default_rng(seed)
    mean = streams.mean_for_alpha(ALPHA, rho, K)
    samples = []
    for _ in range(reps):
        sizes, passed = streams.request_counts(rng, requests, mean, rho, K, "lognormal")
        samples.append((passed.sum(axis=0), sizes + passed[:-1].sum(axis=0)))
    out: dict = {"rho": rho, "requests": requests, "replicates": reps,
                 "mc_se_at_0.95": math.sqrt(0.95 * 0.05 / reps)}
    kept = stats.BINOMIAL_FLOOR_MIN_CLUSTERS
    try:
        for way, least in WAYS.items():
            stats.BINOMIAL_FLOOR_MIN_CLUSTERS = least
            intervals = [stats.cluster_robust_interval(a, n) for a, n in samples]
            out[way] = sum(iv.lo <= ALPHA <= iv.hi for iv in intervals) / reps
        out["floor_holds"] = sum(iv.design_effect == 1.0 for iv in intervals) / reps
    finally:
        stats.BINOMIAL_FLOOR_MIN_CLUSTERS = kept
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rhos", type=float, nargs="+", default=[0.0, 0.05, 0.2, 0.3])
    ap.add_argument("--requests", type=int, nargs="+", default=[3, 5, 10, 20])
    ap.add_argument("--reps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    found = run_cells({"machine": machine(), "as_used_from_requests": stats.BINOMIAL_FLOOR_MIN_CLUSTERS},
                      (lambda rho=rho, g=g: cell(rho, g, args.reps, args.seed)
                       for rho in args.rhos for g in args.requests), None)
    print("\n| correlation | requests | floor holds | " + " | ".join(WAYS) + " |\n|---|---|---|"
          + "---|" * len(WAYS))
    for c in found["cells"]:
        print(f"| {c['rho']} | {c['requests']} | {c['floor_holds']:.2f} | "
              + " | ".join(f"{c[way]:.3f}" for way in WAYS) + " |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(found, fh, indent=1)


if __name__ == "__main__":
    main()
