"""Drift detection study: false-alarm rate and detection delay of specmon's CUSUM beside river's ADWIN and
Page-Hinkley, tuned to the same false-alarm rate, on streams with request clustering.

    python bench/drift_study.py [--arl0 5000]

Streams follow specmon.drift's beta-binomial request model: k = 4, requests of 20 steps on average, per-request
acceptance ~ Beta(alpha*m, (1-alpha)*m) with m = 8 (a design effect of about 8, as seen in the demo data).
In control alpha = 0.80; break-even alpha* = 0.45 (k = 4, c = 0.20). Changes: to 0.40 (below break-even) and to
0.60 (a drop that still pays). The baselines see each step's acceptance accepted/checked; river's detectors are
two-sided, so every detection counts as an alarm for them (that is what they do unattended).
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
from river import drift as river_drift

from _common import machine
from specmon import drift

K, P0, P1, M, STEPS_PER_REQUEST = 4, 0.80, 0.45, 8.0, 20.0
NULL_STREAMS, NULL_STEPS = 20, 50_000
CHANGE_STREAMS, CHANGE_AT, AFTER = 200, 3_000, 3_000


def streams(seed: int, n: int, steps: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    return drift.simulate_steps(np.random.default_rng(seed), n, steps, alpha, K, M, STEPS_PER_REQUEST)


def specmon_alarms(a: np.ndarray, c: np.ndarray, design: drift.Design) -> list[int]:
    return [alarm for alarm, _ in drift.cusum(a.astype(float), c.astype(float), design)[1]]


def river_alarms(make, a: np.ndarray, c: np.ndarray) -> list[int]:
    detector = make()
    found = []
    for t, x in enumerate((a / c).tolist()):
        detector.update(x)
        if detector.drift_detected:
            found.append(t)
    return found


def alarm_rate(detect, null) -> float:
    """Alarms per step on streams without change."""
    a, c = null
    return sum(len(detect(a[i], c[i])) for i in range(len(a))) / a.size


def delay(detect, changed) -> dict:
    """Steps from the change to the first alarm at or after it (streams that alarmed before the change count
    as false alarms and are left out of the delay, the usual conditional delay)."""
    a, c = changed
    delays, early, missed = [], 0, 0
    for i in range(len(a)):
        found = detect(a[i], c[i])
        if any(t < CHANGE_AT for t in found):
            early += 1
            continue
        after = [t for t in found if t >= CHANGE_AT]
        if after:
            delays.append(after[0] - CHANGE_AT)
        else:
            missed += 1
    d = np.array(delays)
    return {"mean_delay_steps": float(d.mean()) if len(d) else None,
            "median_delay_steps": float(np.median(d)) if len(d) else None,
            "alarmed_before_change": early, "missed_within_3000_steps": missed, "streams": len(a)}


def tune(make_with, target: float, null, lo: float, hi: float, log: bool) -> float:
    """The parameter value (bisection) whose alarm rate on the null streams matches target; rate must fall
    as the parameter rises."""
    for _ in range(14):
        mid = math.sqrt(lo * hi) if log else (lo + hi) / 2
        rate = alarm_rate(lambda a, c: river_alarms(lambda: make_with(mid), a, c), null)
        lo, hi = (mid, hi) if rate > target else (lo, mid)
    return hi


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arl0", type=int, default=5000, help="stated steps between false alarms")
    args = ap.parse_args()
    h = drift.calibrate_h(P0, P1, K, M, STEPS_PER_REQUEST, args.arl0)
    design = drift.Design(P0, P1, h, args.arl0, M, K)
    null = streams(1, NULL_STREAMS, NULL_STEPS, P0)
    ours = lambda a, c: specmon_alarms(a, c, design)  # noqa: E731
    rate = alarm_rate(ours, null)
    n_alarms = rate * null[0].size
    target = 1 / args.arl0
    ph_threshold = tune(lambda t: river_drift.PageHinkley(threshold=t, mode="both"), target, null, 1.0, 500.0, True)
    # ADWIN alarms less as delta falls, so tune 1/delta.
    adwin_delta = 1 / tune(lambda inv: river_drift.ADWIN(delta=1 / inv), target, null, 2.0, 1e15, True)
    detectors = {
        "specmon CUSUM": ours,
        "river PageHinkley": lambda a, c: river_alarms(lambda: river_drift.PageHinkley(threshold=ph_threshold,
                                                                                       mode="both"), a, c),
        "river ADWIN": lambda a, c: river_alarms(lambda: river_drift.ADWIN(delta=adwin_delta), a, c),
    }
    results = {"machine": machine(), "stated_false_alarm_every_steps": args.arl0, "h": h,
               "null_steps": int(null[0].size),
               "specmon_false_alarms": int(round(n_alarms)),
               "specmon_steps_per_false_alarm": 1 / rate if rate else None,
               "specmon_steps_per_false_alarm_95ci": [null[0].size / (n_alarms + 1.96 * math.sqrt(n_alarms)),
                                                      null[0].size / max(n_alarms - 1.96 * math.sqrt(n_alarms), 1)],
               "page_hinkley_threshold": ph_threshold, "adwin_delta": adwin_delta, "detectors": {}}
    for alpha_after in (0.40, 0.60):
        a0, c0 = streams(2, CHANGE_STREAMS, CHANGE_AT, P0)
        a1, c1 = streams(3, CHANGE_STREAMS, AFTER, alpha_after)
        changed = (np.concatenate([a0, a1], axis=1), np.concatenate([c0, c1], axis=1))
        for name, detect in detectors.items():
            entry = results["detectors"].setdefault(name, {})
            entry.setdefault("steps_per_false_alarm", 1 / max(alarm_rate(detect, null), 1e-12))
            entry[f"change_to_{alpha_after:.2f}"] = delay(detect, changed)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
