"""Which part of the calibration's picture of a request costs the stated false-alarm rate on position-dependent
traffic (traffic_models.py: acceptance falling along the draft, requests differing the more the deeper the
position). Each reference is calibrated once and kept (no checkpoints), then the plain CUSUM watches --watched x the
stated figure of fresh steps of the same traffic; references of each size are independent draws, so a figure is
taken over the references' luck, which one reference alone (drift_likelihood.py) leaves in.

Variants, each replacing one part of the model by the truth it estimates (oracles: the traffic's own parameters):
- as used: the per-position profile pooled over the reference's steps, every position's log-odds shifted alike by a
  request's shift, the shift's distribution fitted (calibration.Mixing);
- true slopes: position i's log-odds moved by the traffic's own DEPTH_EFFECT[i] / DEPTH_EFFECT[0] times the shift,
  the distribution still fitted under that model;
- true slopes and base profile: that, around the traffic's profile at a request effect of 0 instead of the pooled
  one (the pooled rates of deep positions are those of the better requests, which reach them more often);
- true steps: each simulated request's steps drawn from the traffic's own model (a standard normal request effect),
  only the lengths and the reference's p0 taken from the reference.
--unsmoothed draws request acceptance from the fitted weights alone, without the kernel (calibration.Rates, b = 0).

    cd bench && nice python drift_request_model.py --out A.json
    nice python drift_request_model.py --arl0 20000 --references 20 8 --seed 18 --out B.json
    nice python drift_request_model.py --unsmoothed --variants "as used" "true slopes and base profile" --out C.json
    nice python drift_request_model.py --unsmoothed --variants "as used" "true slopes and base profile" \\
        --arl0 20000 --references 20 8 --seed 18 --out D.json
    python drift_request_model.py --merge A.json B.json C.json D.json --out drift_request_model.json
    python drift_request_model.py --table drift_request_model.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator

import numpy as np
import traffic_models
from _common import machine

from specmon.drift import calibration, detector

BREAK_EVEN = 0.45
CELL = "position_dependent"
VARIANTS = ("as used", "true slopes", "true slopes and base profile", "true steps")


@contextlib.contextmanager
def variant(name: str, unsmoothed: bool = False) -> Iterator[None]:
    """The calibration with one part of its request model replaced by the traffic's truth, for the block; its
    request acceptance drawn without the kernel where unsmoothed."""
    profile, steps_tilt, rates_draw = calibration.Profile, calibration.StepProcess.tilt, calibration.Rates.draw
    smoothed = calibration.Mixing.smoothed
    slopes = np.array(traffic_models.DEPTH_EFFECT) / traffic_models.DEPTH_EFFECT[0]
    base = np.array(traffic_models.POSITION_ACCEPT)

    class SlopedProfile(profile):
        def accept(self, theta: np.ndarray) -> np.ndarray:
            s = slopes[:len(self.logodds)]
            return 1 / (1 + np.exp(-(self.logodds[:, None] + s[:, None] * theta[None, :])))

    class BaseProfile(SlopedProfile):
        @classmethod
        def of_counts(cls, passed: np.ndarray, reached: np.ndarray) -> calibration.Profile:
            return cls(np.log(base / (1 - base)))

    def weights_alone(self: calibration.Mixing, w: np.ndarray, clusters: float) -> calibration.Rates:
        found = smoothed(self, w, clusters)
        return calibration.Rates(found.grid, found.weights, 0.0, found.center, 1.0, 0.0)

    try:
        if unsmoothed:
            calibration.Mixing.smoothed = weights_alone  # type: ignore[method-assign]
        if name == "true slopes":
            calibration.Profile = SlopedProfile  # type: ignore[misc]
        elif name == "true slopes and base profile":
            calibration.Profile = BaseProfile  # type: ignore[misc]
        elif name == "true steps":
            calibration.StepProcess.tilt = lambda self, z: 1 - np.cumprod(  # type: ignore[method-assign]
                traffic_models.position_accept(z).T, axis=0)
            calibration.Rates.draw = lambda self, rng, size: rng.standard_normal(size)  # type: ignore[method-assign]
        yield
    finally:
        calibration.Profile = profile  # type: ignore[misc]
        calibration.StepProcess.tilt = steps_tilt  # type: ignore[method-assign]
        calibration.Rates.draw = rates_draw  # type: ignore[method-assign]
        calibration.Mixing.smoothed = smoothed  # type: ignore[method-assign]


def cell_figures(name: str, size: int, references: int, arl0: int, watched: int, seed: int,
                 unsmoothed: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    alarms, hs = [], []
    for _ in range(references):
        a, c, req = traffic_models.steps(rng, CELL, size)
        p0 = float(a.sum() / c.sum())
        p1 = calibration.target_p1(p0, BREAK_EVEN)
        with variant(name, unsmoothed):
            h = calibration.calibrate(a, c, req, p0, p1, arl0)
        fresh_a, fresh_c, _ = traffic_models.steps(rng, CELL, watched * arl0)
        alarms.append(len(detector.cusum(fresh_a, fresh_c, detector.Design(p0, p1, h, arl0, 1.0, 4))[1]))
        hs.append(h)
    n = np.array(alarms)
    boot = n[rng.integers(0, references, (2000, references))].sum(axis=1)
    lo, hi = np.quantile(references * watched / np.maximum(boot, 1), [0.025, 0.975])
    return {"variant": name, "unsmoothed": unsmoothed, "reference_steps": size, "references": references,
            "stated": arl0, "watched_steps_per_reference": watched * arl0, "alarms": int(n.sum()),
            "ratio_to_stated": references * watched / n.sum() if n.sum() else None, "ci95": [float(lo), float(hi)],
            "median_h": float(np.median(hs))}


def print_table(found: dict) -> None:
    """A row per stated figure and reference size, a column per variant (with the kernel, then without)."""
    columns = [(name, False) for name in VARIANTS] + [(name, True) for name in VARIANTS]
    cells = {(c["stated"], c["reference_steps"], c["variant"], c.get("unsmoothed", False)): c for c in found["cells"]}
    shown = [col for col in columns if any(key[2:] == col for key in cells)]
    print("| stated | reference (steps) | references | "
          + " | ".join(name + (", unsmoothed" if flat else "") for name, flat in shown) + " |")
    print("|---" * (3 + len(shown)) + "|")
    for stated, size in sorted({key[:2] for key in cells}):
        row = [cells.get((stated, size, *col)) for col in shown]
        references = next(c["references"] for c in row if c)
        print(f"| {stated:,} | {size:,} | {references} | " + " | ".join(
            "-" if c is None else f"{c['ratio_to_stated']:.2f} x [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]"
            for c in row) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--sizes", nargs="+", type=int, default=[16_000, 100_000])
    ap.add_argument("--references", nargs="+", type=int, default=[40, 12],
                    help="references per size, in the order of --sizes")
    ap.add_argument("--arl0", type=int, default=2000)
    ap.add_argument("--watched", type=int, default=20, help="watched steps per reference, x the stated figure")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--unsmoothed", action="store_true", help="request acceptance from the fitted weights alone")
    ap.add_argument("--out")
    ap.add_argument("--merge", nargs="+", help="join these JSON files (to --out) instead of running")
    ap.add_argument("--table", help="print the docs' table from this JSON instead of running")
    args = ap.parse_args()
    if args.table:
        print_table(json.load(open(args.table)))
        return
    if args.merge:
        parts = [json.load(open(path)) for path in args.merge]
        joined = parts[0] | {"cells": [cell for part in parts for cell in part["cells"]]}
        with open(args.out, "w") as f:
            json.dump(joined, f, indent=1)
        return
    out = {"machine": machine(), "calibration_version": calibration.CALIBRATION_VERSION, "cells": []}
    for size, references in zip(args.sizes, args.references, strict=True):
        for name in args.variants:  # every variant on the same references and fresh steps
            t0 = time.time()
            figures = cell_figures(name, size, references, args.arl0, args.watched, args.seed + size,
                                   args.unsmoothed)
            figures["wall_s"] = round(time.time() - t0, 1)
            out["cells"].append(figures)
            print(json.dumps(figures), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
