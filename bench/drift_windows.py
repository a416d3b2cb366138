"""Windows per false alarm of the drift detector on engine windows over overlapping requests (bench/traffic_daily.py:
10-second windows, requests lasting a lognormal time of median 40 s, so a request spans several windows), against the
stated figure, counted only while the design in force states one; at a constant mix of request types and under a
daily mix (the chat share following the clock). Each stream is a fresh run: the detector calibrated on its first
REFERENCE_WINDOWS windows, its reference growing at the checkpoints as in use (BlockProcess calibrates every design),
the run long enough for a checkpoint's reference to state a rate (a day of blocks and WINDOW_REFERENCE_MULTIPLE x the
stated figure) and then to watch 10 x the stated figure of windows. Prints tables (--out keeps the JSON); the 95%
interval resamples the streams. --references measures one threshold kept, by the length of its reference.

    cd bench && nice python drift_windows.py --streams 20 --arl0 2000 --out A.json
    nice python drift_windows.py --references 7680 15360 30720 --streams 8 --arl0 2000 --out B.json
    python drift_windows.py --merge A.json B.json --out drift_windows.json
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import production_study as ps
import traffic_daily as td
from _common import episode_starts, machine

from specmon.core.settings import WINDOW_BLOCK_SECONDS
from specmon.drift import calibration, detector

K = 4
BREAK_EVEN = 0.55  # p1: a deployment whose break-even lies well below every hour's acceptance
ARRIVALS_PER_S = 0.2
MIXES = {"constant": ps._flat, "daily": td.chat_share}


def stated_from(windows_per_hour: float, arl0: int) -> int:
    """The first checkpoint whose reference holds a day of windows and WINDOW_REFERENCE_MULTIPLE x the stated figure
    (and so states a rate)."""
    least = max(24 * windows_per_hour + 1, detector.WINDOW_REFERENCE_MULTIPLE * arl0)
    return next(c for c in detector.checkpoints(detector.REFERENCE_WINDOWS, "windows") if c >= least)


def points(w: td.Windows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A run's windows as the detector takes them: accepted, checked, 10-minute block and end time (us)."""
    ts = w.end_us.astype(np.int64)
    return (w.accepted.astype(float), w.checked.astype(float), ts // int(WINDOW_BLOCK_SECONDS * td.US), ts)


def watch(a: np.ndarray, c: np.ndarray, blocks: np.ndarray, ts: np.ndarray, arl0: int) -> tuple[list[int], list]:
    """A run watched from its first window as in use, the reference growing at the checkpoints: its alarms, and
    every design in force as (its first window, design)."""
    first = detector.REFERENCE_WINDOWS
    design = calibration.design_for(a, c, blocks, K, BREAK_EVEN, arl0, first, unit="windows", ts_us=ts)
    grow = calibration.redesigner(lambda _: (a, c, blocks, ts), K, BREAK_EVEN, arl0, "windows")
    _, raw, _, taken = detector.run_cusum(a[first:], c[first:], first, detector.CusumState.start(design), grow)
    return raw, [(first, design), *taken]


def stream_figures(rng: np.random.Generator, mix: str, arl0: int) -> dict:
    """One run: windows watched and alarms counted while a rate is stated, and the designs' figures."""
    per_hour = 3600 / td.WINDOW_S
    span_h = (stated_from(per_hour, arl0) + 10 * arl0) / per_hour + 1
    a, c, blocks, ts = points(td.engine_windows(rng, ARRIVALS_PER_S, span_h, K, share=MIXES[mix]))
    raw, spans = watch(a, c, blocks, ts, arl0)
    stated_at = next((t for t, d in spans if d.states_a_rate), None)
    watched = len(a) - stated_at if stated_at is not None else 0
    alarms = [t for t in raw if stated_at is not None and t >= stated_at]
    hours = (ts[alarms] // td.HOUR_US % 24).tolist()
    return {"watched": watched, "alarms": len(alarms),
            "episodes": len(episode_starts(alarms, detector.EPISODE_GAP)),
            "alarm_hours": hours, "h": [d.h for _, d in spans], "stated_at": stated_at,
            "last_reference_hours": spans[-1][1].reference_hours}


def fixed_reference(reference: int, streams: int, arl0: int, seed: int, watched: int,
                    in_sample: bool = False) -> dict:
    """Windows per false alarm of one threshold, calibrated on the first `reference` windows and kept (no
    checkpoints), over the `watched` windows after them (in_sample: over the reference itself), at a constant mix:
    how long a reference must be before the threshold it gives keeps the stated figure."""
    rng = np.random.default_rng(seed)
    alarms, hs = 0, []
    per_hour = 3600 / td.WINDOW_S
    for _ in range(streams):
        span = reference if in_sample else reference + watched
        a, c, blocks, ts = points(td.engine_windows(rng, ARRIVALS_PER_S, span / per_hour + 1, K,
                                                    share=MIXES["constant"]))
        design = calibration.design_for(a, c, blocks, K, BREAK_EVEN, arl0, reference, unit="windows", ts_us=ts)
        watch = slice(0, reference) if in_sample else slice(reference, reference + watched)
        alarms += len(detector.cusum(a[watch], c[watch], design)[1])
        hs.append(design.h)
    seen = streams * (reference if in_sample else watched)
    return {"reference": reference, "stated": arl0, "streams": streams, "in_sample": in_sample,
            "watched_windows": seen, "alarms": alarms, "ratio_to_stated": seen / max(alarms, 1) / arl0,
            "h_min": float(min(hs)), "h_max": float(max(hs))}


def unstated_figures(hours: float, streams: int, arl0: int, seed: int, drops: list[float]) -> list[dict]:
    """Runs of `hours` hours too short for a stated rate, at a constant mix, watched from their first window as in use
    (the reference growing at the checkpoints): alarm episodes per day on runs where nothing changes, and on runs
    whose requests' mean acceptance drops by each of `drops` halfway through, the share of runs alarmed within an hour
    of the drop and the median windows from the drop to the first alarm. Each run is watched twice on the same
    windows: with h as used, and with the block bootstrap's h alone (calibration.least_h taken away)."""
    rng = np.random.default_rng(seed)
    per_hour = 3600 / td.WINDOW_S
    first = detector.REFERENCE_WINDOWS
    least_h = calibration.least_h
    cells = []
    for drop in [0.0, *drops]:
        counts: dict[str, list] = {"as used": [], "bootstrap alone": []}
        for _ in range(streams):
            w = td.engine_windows(rng, ARRIVALS_PER_S, hours, K, share=MIXES["constant"],
                                  rollout_h=hours / 2 if drop else None, drop=drop)
            a, c, blocks, ts = points(w)
            at = int(np.searchsorted(ts, int(hours / 2 * td.HOUR_US)))
            for name in counts:
                calibration.least_h = least_h if name == "as used" else (lambda *_: calibration.Floor(0.0, 0.0, 1, 0.0))
                raw, spans = watch(a, c, blocks, ts, arl0)
                episodes = episode_starts(raw, detector.EPISODE_GAP)
                after = [t for t in raw if t >= at] if drop else []
                counts[name].append((len([t for t in episodes if not drop or t < at]),
                                     after[0] - at if after else None, spans[0][1].h))
        calibration.least_h = least_h
        for name, runs in counts.items():
            delays = [d for _, d, _ in runs if d is not None and d <= per_hour]
            cells.append({"hours": hours, "stated": arl0, "drop": drop, "h": name, "streams": streams,
                          "episodes_per_day_before_any_drop": sum(e for e, _, _ in runs) / (
                              streams * (hours / 2 if drop else hours) - streams * first / per_hour) * 24,
                          "runs_with_a_false_episode": sum(1 for e, _, _ in runs if e) / streams,
                          "found_within_an_hour": len(delays) / streams if drop else None,
                          "median_delay_windows": float(np.median(delays)) if delays else None,
                          "first_h_median": float(np.median([h for _, _, h in runs]))})
    return cells


def mix_figures(mix: str, streams: int, arl0: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    runs = [stream_figures(rng, mix, arl0) for _ in range(streams)]
    n = np.array([r["alarms"] for r in runs])
    watched = np.array([r["watched"] for r in runs])
    total = int(watched.sum())
    if n.sum():
        pick = rng.integers(0, streams, (2000, streams))
        boot_n, boot_w = n[pick].sum(axis=1), watched[pick].sum(axis=1)
        ratios = np.where(boot_n > 0, boot_w / np.maximum(boot_n, 1) / arl0, np.inf)
        lo, hi = np.quantile(ratios, [0.025, 0.975])
        ratio, ci = total / n.sum() / arl0, [float(lo), float(hi)]
    else:
        ratio, ci = None, [total / 3 / arl0, math.inf]
    hours = [h for r in runs for h in r["alarm_hours"]]
    episodes = sum(r["episodes"] for r in runs)
    return {"mix": mix, "stated": arl0, "streams": streams, "watched_windows": total, "alarms": int(n.sum()),
            "ratio_to_stated": ratio, "ci95": ci, "windows_per_episode": total / episodes if episodes else None,
            "alarms_in_chat_heavy_third": (sum(1 for h in hours if 11 <= h < 19) / len(hours)) if hours else None,
            "median_h": float(np.median([r["h"][-1] for r in runs]))}


def table(result: dict) -> str:
    """The docs' tables: the runs' cells, then the fixed references (a JSON may hold either or both)."""
    out = [_cells_table(result["cells"])] if result.get("cells") else []
    if result.get("unstated"):
        out.append(_unstated_table(result["unstated"]))
    if result.get("references"):
        out.append(_references_table(result["references"]))
    return "\n\n".join(out)


def _references_table(references: list[dict]) -> str:
    rows = ["| reference (windows) | over the stated figure | watched | streams | alarms | windows per false alarm "
            "over the stated figure | h, least-most |", "|---|---|---|---|---|---|---|"]
    rows += [f"| {c['reference']:,} | {c['reference'] / c['stated']:.1f} x | "
             f"{'the reference itself' if c['in_sample'] else 'the windows after it'} | {c['streams']} | "
             f"{c['alarms']} | {c['ratio_to_stated']:.2f} x | {c['h_min']:.1f}-{c['h_max']:.1f} |"
             for c in references]
    return "\n".join(rows)


def _unstated_table(cells: list[dict]) -> str:
    rows = ["| run | drop | h | runs (seed) | false alarm episodes per day | runs with one | found within an hour of "
            "the drop | median windows to the alarm |", "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        found = f"{c['found_within_an_hour']:.2f}" if c["found_within_an_hour"] is not None else "-"
        delay = f"{c['median_delay_windows']:.0f}" if c["drop"] and c["median_delay_windows"] is not None else "-"
        seed = f" ({c['seed']})" if c.get("seed") is not None else ""
        rows.append(f"| {c['hours']:g} h | {c['drop']:g} | {c['h']} | {c['streams']}{seed} | "
                    f"{c['episodes_per_day_before_any_drop']:.2f} | {c['runs_with_a_false_episode']:.2f} | {found} | "
                    f"{delay} |")
    return "\n".join(rows)


def _cells_table(cells: list[dict]) -> str:
    rows = ["| mix | stated | streams | windows watched | alarms | windows per false alarm over the stated figure "
            "[95% CI] | per episode | alarms in the chat-heavy third (11-19 UTC) |",
            "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lo, hi = c["ci95"]
        ratio = (f"{c['ratio_to_stated']:.2f} x [{lo:.2f}, {hi:.2f}]" if c["ratio_to_stated"]
                 else f"no alarm (at least {lo:.2f} x)")
        episode = f"{c['windows_per_episode'] / c['stated']:.2f} x" if c["windows_per_episode"] else "-"
        third = f"{c['alarms_in_chat_heavy_third']:.2f}" if c["alarms_in_chat_heavy_third"] is not None else "-"
        rows.append(f"| {c['mix']} | {c['stated']:,} | {c['streams']} | {c['watched_windows']:,} | {c['alarms']} | "
                    f"{ratio} | {episode} | {third} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--arl0", type=int, nargs="+", default=[2000])
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--references", type=int, nargs="+", metavar="WINDOWS",
                    help="instead: one threshold per stream, calibrated on this many first windows and kept, at the "
                    "first --arl0 (fixed_reference)")
    ap.add_argument("--watched", type=int, default=100_000, help="with --references: windows watched per stream")
    ap.add_argument("--in-sample", action="store_true", help="with --references: watch the reference itself")
    ap.add_argument("--unstated", type=float, metavar="HOURS",
                    help="instead: runs this long, too short for a stated rate, with and without a drop "
                    "(unstated_figures; --drops)")
    ap.add_argument("--drops", type=float, nargs="*", default=[0.2, 0.3])
    ap.add_argument("--table", metavar="JSON", help="print the table of a result")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="join results (their cells and references) into --out")
    args = ap.parse_args()
    if args.table:
        print(table(json.load(open(args.table))))
        return
    if args.merge:
        parts = [json.load(open(p)) for p in args.merge]
        merged = {"machine": parts[0]["machine"]}
        for key in ("cells", "references", "unstated"):
            if any(p.get(key) for p in parts):  # each cell keeps the seed of its run
                merged[key] = [{**c, "seed": c.get("seed", p.get("seed"))} for p in parts for c in p.get(key, [])]
        merged["wall_s"] = round(sum(p["wall_s"] for p in parts), 1)
        open(args.out, "w").write(json.dumps(merged, indent=1) + "\n")
        print(table(merged))
        return
    t0 = time.perf_counter()
    result: dict = {"machine": machine(), "seed": args.seed}
    if args.unstated:
        result["unstated"] = unstated_figures(args.unstated, args.streams, args.arl0[0], args.seed, args.drops)
    elif args.references:
        result["references"] = [fixed_reference(r, args.streams, args.arl0[0], args.seed + i, args.watched,
                                                args.in_sample) for i, r in enumerate(args.references)]
    else:
        result["cells"] = [mix_figures(mix, args.streams, arl0, args.seed + 10 * i + j)
                           for i, arl0 in enumerate(args.arl0) for j, mix in enumerate(args.mixes)]
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(result, indent=1)
    if args.out:
        open(args.out, "w").write(text + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
