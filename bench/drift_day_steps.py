"""Steps per false alarm of the drift detector on step logs whose request mix follows the clock (bench/
traffic_daily.py's daily mix: chat and code requests, the chat share 0.2 at 03:00 UTC and 0.8 at 15:00) and at a
constant mix, against the stated figure. One threshold per stream, calibrated on the stream's first --reference steps
(at 1,000 requests a day, 32,000 steps span 1.6 days: the first checkpoint whose reference covers a day, from which a
rate is stated) and kept, over the --watched x the stated figure of steps after them, two ways on the same streams:
by hour of day (calibration.StepDay, in use where the reference spans a day) and with the whole reference's requests
pooled (the calibration without times). Prints a table (--out keeps the JSON); the 95% interval resamples the
streams.

    cd bench && nice python drift_day_steps.py --streams 10 --arl0 2000 20000 --out drift_day_steps.json
    python drift_day_steps.py --table drift_day_steps.json
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import production_study as ps
import traffic_daily as td
from _common import machine

from specmon.drift import calibration, detector

K = 4
BREAK_EVEN = 0.55  # p1: below every hour's acceptance (0.75-0.86), the chat requests' tail reaching it
REQUESTS_PER_DAY = 1_000
MIXES = {"constant": ps._flat, "daily": td.chat_share}
WAYS = ("by hour of day", "pooled")


def stream(rng: np.random.Generator, mix: str, steps: int) -> tuple[np.ndarray, ...]:
    """A step log of at least `steps` steps in time order: accepted, checked, request, time (us)."""
    days = steps / (REQUESTS_PER_DAY * td.MEAN_STEPS) * 1.1 + 0.1
    log = td.daily_steps(rng, int(REQUESTS_PER_DAY * days), 24 * days, K, share=MIXES[mix])
    order = np.argsort(log.ts_us, kind="stable")
    return (log.accepted[order].astype(float), log.checked[order].astype(float), log.request[order],
            log.ts_us[order])


def cell(mix: str, arl0: int, streams: int, reference: int, watched_multiple: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    watched = watched_multiple * arl0
    alarms: dict[str, list[int]] = {w: [] for w in WAYS}
    hours: dict[str, list[int]] = {w: [] for w in WAYS}
    hs: dict[str, list[float]] = {w: [] for w in WAYS}
    reference_hours = []
    for _ in range(streams):
        a, c, req, ts = stream(rng, mix, reference + watched)
        watch = slice(reference, reference + watched)
        for way in WAYS:
            design = calibration.design_for(a, c, req, K, BREAK_EVEN, arl0, reference,
                                            ts_us=ts if way == WAYS[0] else None)
            assert design is not None
            raw = detector.cusum(a[watch], c[watch], design)[1]
            alarms[way].append(len(raw))
            hours[way] += (ts[watch][raw] // td.HOUR_US % 24).tolist()
            hs[way].append(design.h)
        reference_hours.append(float(np.ptp(ts[:reference])) / td.HOUR_US)
    out = {"mix": mix, "stated": arl0, "streams": streams, "reference_steps": reference,
           "reference_hours_least": min(reference_hours), "watched_steps": streams * watched}
    for way in WAYS:
        n = np.array(alarms[way])
        total = streams * watched
        pick = rng.integers(0, streams, (2000, streams))
        boot = n[pick].sum(axis=1)
        lo, hi = np.quantile(np.where(boot > 0, total / np.maximum(boot, 1) / arl0, np.inf), [0.025, 0.975])
        out[way] = {"alarms": int(n.sum()), "ratio_to_stated": total / n.sum() / arl0 if n.sum() else None,
                    "ci95": [float(lo), float(hi)] if n.sum() else [total / 3 / arl0, math.inf],
                    "alarms_in_chat_heavy_third": (sum(1 for h in hours[way] if 11 <= h < 19) / len(hours[way])
                                                   if hours[way] else None),
                    "h_least": float(min(hs[way])), "h_most": float(max(hs[way]))}
    return out


def table(result: dict) -> str:
    rows = ["| mix | stated | streams | calibration | alarms | steps per false alarm over the stated figure [95% CI] "
            "| alarms in 11:00-19:00 UTC | h, least-most |", "|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        for way in WAYS:
            f = c[way]
            ratio = (f"{f['ratio_to_stated']:.2f} x [{f['ci95'][0]:.2f}, {f['ci95'][1]:.2f}]" if f["alarms"]
                     else f"no alarm: above {f['ci95'][0]:.1f} x")
            third = f"{f['alarms_in_chat_heavy_third']:.2f}" if f["alarms"] else "-"
            rows.append(f"| {c['mix']} | {c['stated']:,} | {c['streams']} | {way} | {f['alarms']} | {ratio} | {third} "
                        f"| {f['h_least']:.1f}-{f['h_most']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--arl0", type=int, nargs="+", default=[2000])
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    ap.add_argument("--reference", type=int, default=32_000, help="steps the threshold is calibrated on")
    ap.add_argument("--watched", type=int, default=50, help="steps watched per stream, as a multiple of the stated")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--table", metavar="JSON", help="print the table of a result")
    args = ap.parse_args()
    if args.table:
        print(table(json.load(open(args.table))))
        return
    t0 = time.perf_counter()
    result: dict = {"machine": machine(), "seed": args.seed,
                    "cells": [cell(mix, arl0, args.streams, args.reference, args.watched, args.seed + 10 * i + j)
                              for i, arl0 in enumerate(args.arl0) for j, mix in enumerate(args.mixes)]}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        open(args.out, "w").write(json.dumps(result, indent=1) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
