"""Why the drift threshold comes out high where requests do not differ: on references of
i.i.d. tokens (request correlation 0, acceptance 0.8, k = 4, geometric or lognormal request lengths, 2,000 to 32,000
steps), what spread between requests the calibration draws, and the threshold it gives at a stated 20,000 steps
per false alarm against the one its own groups give with every request at the group's pooled acceptance and the
one the true i.i.d. process gives (both watched with the reference's p0 and p1).

    nice python bench/drift_homogeneous.py [--references 8] [--out bench/drift_homogeneous.json]
    python bench/drift_homogeneous.py --table bench/drift_homogeneous.json

About 10 minutes on 2 shared cores with 8 references per row.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import streams
from _common import machine

from specmon.drift import calibration

ARL0 = 20_000
SIZES = (2_000, 8_000, 32_000)
LENGTHS = ("geometric", "lognormal")
P0, K, BREAK_EVEN = 0.80, 4, 0.45


def homogeneous_threshold(a: np.ndarray, n: np.ndarray, req: np.ndarray, p0: float, p1: float, arl0: int,
                          groups: int = calibration.CALIBRATION_GROUPS, seed: int = 0) -> float:
    """drift.calibrate with every drawn request at its group's pooled acceptance (no spread between requests): the
    same groups, lengths, per-position profile and random numbers, so the difference is the spread alone."""
    rng = np.random.default_rng(seed)
    a, n = np.asarray(a, dtype=float), np.asarray(n, dtype=float)
    _, inverse = np.unique(req, return_inverse=True)
    g = int(inverse.max()) + 1
    pa, pn = np.bincount(inverse, weights=a), np.bincount(inverse, weights=n)
    points = []
    for _ in range(groups):
        pool = rng.integers(0, g, g)
        counts = np.bincount(pool, minlength=g)
        rates = calibration.Rates.single(float(counts @ pa) / float(counts @ pn))
        points.append(calibration.StepProcess(a, n, inverse, pool, rates).draw(rng, 5, 5 * arl0))
    return calibration.solve_threshold([calibration.cumulative_increments(x, y, p0, p1) for x, y in points], arl0).h


def true_threshold(rng: np.random.Generator, lengths: str, p0: float, p1: float, arl0: int,
                   groups: int = calibration.CALIBRATION_GROUPS) -> float:
    """h at which the true process (i.i.d. tokens at 0.8) alarms once per arl0 steps, solved as calibrate solves."""
    s = []
    for _ in range(groups):
        rows = [streams.steps(rng, 5 * arl0, P0, K, 0.0, lengths)[:2] for _ in range(5)]
        s.append(calibration.cumulative_increments(np.array([r[0] for r in rows], float),
                                                   np.array([r[1] for r in rows], float),
                                   p0, p1))
    return calibration.solve_threshold(s, arl0).h


def drawn_spread(rng: np.random.Generator, a: np.ndarray, c: np.ndarray, req: np.ndarray) -> dict:
    """The calibration's groups' drawn request acceptance (its smoothed NPMLE): variance of r, share below 0.5 (the
    truth: none), and the NPMLE weight there."""
    _, inverse = np.unique(req, return_inverse=True)
    g = int(inverse.max()) + 1
    mixing = calibration.Mixing.of_steps(a, c, inverse)
    var, below, single = [], [], 0
    for _ in range(calibration.CALIBRATION_GROUPS):
        rates = mixing.fit(np.bincount(rng.integers(0, g, g), minlength=g))
        r = rates.draw(rng, 20_000)
        var.append(r.var())
        below.append((r < 0.5).mean())
        single += rates.b <= 0
    return {"var_r": float(np.mean(var)), "share_below_0.5": float(np.mean(below)),
            "npmle_weight_below_0.5": float(mixing.start[mixing.grid < 0.5].sum()),
            "groups_without_spread": single / calibration.CALIBRATION_GROUPS}


def table(rows: list[dict]) -> str:
    """The rows' summary. The implied ratio is the steps per false alarm the calibrated h would give on the true
    process over the stated figure, 1 / mean exp(h_true - h) over the references, taking the rate as exp(-h) (Wald's
    identity: an in-control log-likelihood-ratio CUSUM's alarm rate falls as exp(-h), up to a factor that does not
    depend on h to first order); it averages rates over references, as the study's cells do."""
    out = ["| lengths | reference steps | h: calibrate, mean (median) | homogeneous | true i.i.d. | calibrate > "
           "homogeneous + 0.5 | implied ratio | drawn var r | drawn share below 0.5 | NPMLE weight below 0.5 |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for lengths in LENGTHS:
        for size in SIZES:
            v = [r for r in rows if r["lengths"] == lengths and r["reference_steps"] == size]
            if not v:
                continue
            col = {name: np.array([r[name] for r in v]) for name in v[0] if name != "lengths"}
            h = col["h_calibrate"]
            implied = 1 / np.mean(np.exp(col["h_true"] - h))
            out.append(f"| {lengths} | {size:,} | {h.mean():.2f} ({np.median(h):.2f}) | "
                       f"{col['h_homogeneous'].mean():.2f} | {col['h_true'].mean():.2f} | "
                       f"{int((h > col['h_homogeneous'] + 0.5).sum())} of {len(v)} | {implied:.2f} | "
                       f"{col['var_r'].mean():.5f} | {col['share_below_0.5'].mean():.4f} | "
                       f"{col['npmle_weight_below_0.5'].mean():.4f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--references", type=int, default=8)
    ap.add_argument("--out")
    ap.add_argument("--table", metavar="JSON", help="print the table of a run's output")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as fh:
            print(table(json.load(fh)["rows"]))
        return
    t0 = time.perf_counter()
    rows = []
    rng = np.random.default_rng(11)
    spread_rng = np.random.default_rng(7)
    for lengths in LENGTHS:
        for size in SIZES:
            for _ in range(args.references):
                a, c, req = streams.steps(rng, size, P0, K, 0.0, lengths)
                p0 = float(a.sum() / c.sum())
                p1 = calibration.target_p1(p0, BREAK_EVEN)
                row = {"lengths": lengths, "reference_steps": size, "p0": p0,
                       "h_calibrate": calibration.calibrate(a, c, req, p0, p1, ARL0),
                       "h_homogeneous": homogeneous_threshold(a, c, req, p0, p1, ARL0),
                       "h_true": true_threshold(rng, lengths, p0, p1, ARL0)}
                row.update(drawn_spread(spread_rng, a, c, req))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(table(rows))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": machine(), "calibration_version": calibration.CALIBRATION_VERSION, "stated": ARL0,
                       "references_per_row": args.references, "wall_s": time.perf_counter() - t0, "rows": rows},
                      fh, indent=1)


if __name__ == "__main__":
    main()
