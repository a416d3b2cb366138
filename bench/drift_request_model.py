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
--kernel says how the fitted weights of request acceptance are smoothed: "log-odds", as used (a kernel on the
log-odds of r that keeps the weights' variance there, calibration.Rates); "shift", the same kernel on the scale of a
request's shift theta under the variant's profile; "none", the weights alone.

    cd bench && nice python drift_request_model.py --out A.json
    nice python drift_request_model.py --arl0 20000 --references 20 8 --seed 18 --out B.json
    for kernel in none shift; do
      nice python drift_request_model.py --kernel $kernel --variants "as used" "true slopes and base profile" \\
          --out C_$kernel.json
      nice python drift_request_model.py --kernel $kernel --variants "as used" "true slopes and base profile" \\
          --arl0 20000 --references 20 8 --seed 18 --out D_$kernel.json
    done
    python drift_request_model.py --merge A.json B.json C_*.json D_*.json --out drift_request_model.json
    python drift_request_model.py --table drift_request_model.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import traffic_models
from _common import machine, merge_cells, run_cells

from specmon.drift import calibration, detector

BREAK_EVEN = 0.45
CELL = "position_dependent"
VARIANTS = ("as used", "true slopes", "true slopes and base profile", "true steps")
KERNELS = ("log-odds", "shift", "none")


@dataclass(frozen=True)
class ShiftRates:
    """Draws of request acceptance from the fitted weights on the grid's shifts theta, moved to
    center + scale (theta - center + b z) + shift (calibration.Rates' kernel, on theta's scale), read as r."""

    profile: calibration.Profile
    theta: np.ndarray
    weights: np.ndarray
    b: float
    center: float
    scale: float
    shift: float

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        g = rng.choice(len(self.theta), size=size, p=self.weights)
        theta = self.center + self.scale * (self.theta[g] - self.center + self.b * rng.standard_normal(size))
        return self.profile.rate(np.clip(theta + self.shift, calibration.TILT_GRID[0], calibration.TILT_GRID[-1]))


def shift_kernel(mixing: calibration.Mixing, w: np.ndarray, clusters: float) -> ShiftRates:
    """calibration.Mixing.smoothed with theta for the log-odds of r: Silverman's bandwidth from the weights' spread
    of theta, shrunk to keep their variance, then moved to keep the mean of r (Newton on Gauss-Hermite nodes)."""
    profile = mixing.profile  # type: ignore[attr-defined]
    theta = profile.theta(mixing.grid)
    mean = float(w @ theta)
    var = max(float(w @ (theta - mean) ** 2), 0.0)
    cdf = np.cumsum(w)
    iqr = theta[np.searchsorted(cdf, 0.75)] - theta[np.searchsorted(cdf, 0.25)]
    b = 0.9 * (min(math.sqrt(var), iqr / 1.34) if iqr > 0 else math.sqrt(var)) * clusters ** -0.2
    if b <= 0:
        return ShiftRates(profile, theta, w, 0.0, mean, 1.0, 0.0)
    scale = 1 / math.sqrt(1 + b * b / var)
    nodes, node_w = np.polynomial.hermite_e.hermegauss(20)
    node_w = node_w / node_w.sum()
    base = mean + scale * (theta[:, None] - mean + b * nodes[None, :])
    shift = 0.0
    for _ in range(8):
        rate, slope = (x.reshape(base.shape) for x in profile.rate_and_slope((base + shift).ravel()))
        shift += (float(w @ mixing.grid) - w @ rate @ node_w) / (w @ slope @ node_w)
    return ShiftRates(profile, theta, w, b, mean, scale, shift)


@contextlib.contextmanager
def variant(name: str, kernel: str = "log-odds") -> Iterator[None]:
    """The calibration with one part of its request model replaced by the traffic's truth, for the block, its
    request acceptance smoothed by `kernel` (KERNELS)."""
    profile, steps_tilt, rates_draw = calibration.Profile, calibration.StepProcess.tilt, calibration.Rates.draw
    smoothed, of_steps = calibration.Mixing.smoothed, vars(calibration.Mixing)["of_steps"]  # the classmethod itself
    slopes = np.array(traffic_models.DEPTH_EFFECT) / traffic_models.DEPTH_EFFECT[0]
    base = np.array(traffic_models.POSITION_ACCEPT)

    class MeasuredProfile(profile):
        def rate(self, theta: np.ndarray) -> np.ndarray:
            return self._acceptance(theta)[0]

        def rate_and_slope(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return self._acceptance(theta)

    class SlopedProfile(MeasuredProfile):
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

    def with_profile(accepted: np.ndarray, checked: np.ndarray, inverse: np.ndarray) -> calibration.Mixing:
        """The fit, with the profile its grid was read under (the pooled one, or the variant's)."""
        fitted = of_steps.__func__(calibration.Mixing, accepted, checked, inverse)
        passed, reached = calibration._position_counts(accepted, checked, inverse, max(int(checked.max()), 1))
        fitted.profile = calibration.Profile.of_counts(passed.sum(axis=0), reached.sum(axis=0))
        if not isinstance(fitted.profile, MeasuredProfile):
            fitted.profile = MeasuredProfile(fitted.profile.logodds)
        return fitted

    try:
        if kernel == "none":
            calibration.Mixing.smoothed = weights_alone  # type: ignore[method-assign]
        elif kernel == "shift":
            calibration.Mixing.of_steps = staticmethod(with_profile)  # type: ignore[method-assign,assignment]
            calibration.Mixing.smoothed = shift_kernel  # type: ignore[method-assign]
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
        calibration.Mixing.of_steps = of_steps  # type: ignore[method-assign]


def cell_figures(name: str, size: int, references: int, arl0: int, watched: int, seed: int,
                 kernel: str = "log-odds") -> dict:
    rng = np.random.default_rng(seed)
    alarms, hs = [], []
    for _ in range(references):
        a, c, req = traffic_models.steps(rng, CELL, size)
        p0 = float(a.sum() / c.sum())
        p1 = calibration.target_p1(p0, BREAK_EVEN)
        with variant(name, kernel):
            h = calibration.calibrate(a, c, req, p0, p1, arl0)
        fresh_a, fresh_c, _ = traffic_models.steps(rng, CELL, watched * arl0)
        alarms.append(len(detector.cusum(fresh_a, fresh_c, detector.Design(p0, p1, h, arl0, 1.0, 4))[1]))
        hs.append(h)
    n = np.array(alarms)
    boot = n[rng.integers(0, references, (2000, references))].sum(axis=1)
    lo, hi = np.quantile(references * watched / np.maximum(boot, 1), [0.025, 0.975])
    return {"variant": name, "kernel": kernel, "reference_steps": size, "references": references,
            "stated": arl0, "watched_steps_per_reference": watched * arl0, "alarms": int(n.sum()),
            "ratio_to_stated": references * watched / n.sum() if n.sum() else None, "ci95": [float(lo), float(hi)],
            "median_h": float(np.median(hs))}


def print_table(found: dict) -> None:
    """A row per stated figure and reference size, a column per variant and kernel (the kernel as used first)."""
    columns = [(name, kernel) for kernel in KERNELS for name in VARIANTS]
    cells = {(c["stated"], c["reference_steps"], c["variant"], c["kernel"]): c for c in found["cells"]}
    shown = [col for col in columns if any(key[2:] == col for key in cells)]
    print("| stated | reference (steps) | references | "
          + " | ".join(name + ("" if kernel == "log-odds" else f", kernel: {kernel}") for name, kernel in shown)
          + " |")
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
    ap.add_argument("--kernel", choices=KERNELS, default="log-odds", help="how request acceptance is smoothed")
    ap.add_argument("--out")
    ap.add_argument("--merge", nargs="+", help="join these JSON files (to --out) instead of running")
    ap.add_argument("--table", help="print the docs' table from this JSON instead of running")
    args = ap.parse_args()
    if args.table:
        print_table(json.load(open(args.table)))
        return
    if args.merge:
        merge_cells(args.merge, args.out)
        return
    # every variant on the same references and fresh steps
    run_cells({"machine": machine(), "calibration_version": calibration.CALIBRATION_VERSION},
              (lambda name=name, size=size, references=references: cell_figures(
                  name, size, references, args.arl0, args.watched, args.seed + size, args.kernel)
               for size, references in zip(args.sizes, args.references, strict=True) for name in args.variants),
              args.out)


if __name__ == "__main__":
    main()
