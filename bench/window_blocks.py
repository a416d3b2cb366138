"""Whether blocks of engine windows are independent enough for their variance: the spread of standardized errors
(1 where the variance is right) on engine windows over overlapping requests (bench/traffic_daily.py), for the
interval of alpha over a day's log with 10-minute blocks, one-hour blocks and specmon's choice (block_seconds), and
for the matched-hours template test on no-op rollouts over 72 hours at a constant and a daily mix, with the hours
as the observations (as specmon compares engine windows).

    cd bench && nice python window_blocks.py [--reps 100] [--seed 9]
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


def interval_spread(rng: np.random.Generator, reps: int, k: int = 4) -> dict:
    truth = td.truth(k, 0.5)["alpha"]
    z: dict[str, list[float]] = {"10 minutes": [], "1 hour": [], "specmon": []}
    for _ in range(reps):
        w = td.engine_windows(rng, 0.2, 24.0, k, share=ps._flat)
        for name, block_us in (("10 minutes", ps.BLOCK_US), ("1 hour", 6 * ps.BLOCK_US),
                               ("specmon", ps.interval_block_us(w.end_us))):
            _, block = np.unique(w.end_us // block_us, return_inverse=True)
            iv = stats.cluster_robust_interval(np.bincount(block, w.accepted), np.bincount(block, w.checked))
            se = (iv.hi - iv.lo) / (2 * stats.t_quantile(0.95, iv.dof))
            z[name].append((iv.estimate - truth) / se)
    return {name: {"z_spread": float(np.std(v)), "coverage": float(np.mean(np.abs(v) < 1.96))}
            for name, v in z.items()}


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
    args = ap.parse_args()
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    result = {"reps": args.reps, "seed": args.seed, "interval_24h": interval_spread(rng, args.reps),
              "template_72h": template_spread(rng, args.reps)}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
