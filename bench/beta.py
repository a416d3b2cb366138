"""beta = sum min(p, q) over dense rows (4,096 x 32,000 float32): specmon.core.theory.beta against the one-liner.

    python bench/beta.py [--repeats 5]        # prints JSON; docs/benchmarks.md's is bench/beta.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from _common import machine

from specmon.core import theory


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    p = rng.random((4096, 32000), dtype=np.float32)
    q = rng.random((4096, 32000), dtype=np.float32)
    p /= p.sum(axis=1, keepdims=True)
    q /= q.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(theory.beta(p, q), np.minimum(p, q).sum(axis=1), rtol=1e-4)
    # Interleave the two so machine noise hits both alike.
    ours, naive = [], []
    for _ in range(args.repeats):
        ours.append(best_of(lambda: theory.beta(p, q), 1))
        naive.append(best_of(lambda: np.minimum(p, q).sum(axis=1), 1))
    print(json.dumps({"machine": machine(), "rows": 4096, "vocab": 32000, "specmon_beta_s": min(ours),
                      "numpy_minimum_sum_s": min(naive), "ratio_numpy_over_specmon": min(naive) / min(ours)}, indent=2))


if __name__ == "__main__":
    main()
