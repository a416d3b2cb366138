"""Study of specmon's statistics on data from request models other than their own (bench/streams.py): interval
coverage, status calls at break-even, steps per false alarm against the stated figure, detection delay and
change-time error; river's ADWIN and Page-Hinkley beside the CUSUM in one cell.

    nice python bench/drift_study.py [--full] [--out bench/drift_study.json]

Default (a few minutes on 2 cores): intervals in every cell of request correlation 0 / 0.05 / 0.2 / 0.3 x
geometric / lognormal lengths x 20 / 50 / 200 / 1000 requests x k = 2 / 4 / 8 (300 replicates each); false alarms
at a stated 2,000 steps in every correlation x lengths x k cell (40 reference windows each), at the default 20,000
at k = 4 (20 windows each); delays and change times at a stated 20,000 at k = 4, correlation 0.05 and 0.2; how the
threshold's calibration pictures the poor tail of request acceptance against the truth (mixing_tail, 100 references
per row).
--full: 2,000 replicates per interval cell, 100 reference windows per false-alarm cell and every k at 20,000,
delays in every cell. --reps N sets the interval replicates alone. --sections runs some parts only (each part
has its own seed, so a part gives the same figures alone or with the others); --merge joins the outputs of parts
run side by side:

    nice python bench/drift_study.py --sections intervals --reps 2000 --out DIR/a.json &
    nice python bench/drift_study.py --sections false_alarms_2000,river --out DIR/b.json &
    ...
    python bench/drift_study.py --merge DIR/a.json DIR/b.json ... --out bench/drift_study.json

Every figure comes with its Monte-Carlo error: a coverage or a probability with its binomial standard error;
steps per false alarm with a 95% interval from resampling the reference windows (the windows differ, so alarms
are not Poisson across them).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import production_study
import scipy.stats
import streams
from _common import episode_starts, machine

from specmon.core import stats, theory
from specmon.core.segments import segment_status
from specmon.drift import calibration, detector

RHOS = (0.0, 0.05, 0.2, 0.3)
LENGTHS = ("geometric", "lognormal")
REQUESTS = (20, 50, 200, 1000)
KS = (2, 4, 8)
ALPHA = 0.70  # per-token acceptance in the interval cells (break-even is put exactly there)
P0, P_DROP, BREAK_EVEN = 0.80, 0.40, 0.45  # drift cells: in control, after the drop, break-even (p1)
# delay parts: (correlations, --full's correlations, lengths, seed); each part can run as its own process
DELAY_PARTS = {"delays_0.05": ((0.05,), (0.0, 0.05), LENGTHS, 2027),
               "delays_0.2_geometric": ((0.2,), (0.2, 0.3), ("geometric",), 2030),
               "delays_0.2_lognormal": ((0.2,), (0.2, 0.3), ("lognormal",), 2031)}
SECTIONS = ("intervals", "false_alarms_2000", "false_alarms_20000", "false_alarms_two_point", *DELAY_PARTS, "river",
            "mixing_tail", "production", "production_status", "production_windows")
# production_status and production_windows repeat the production part's step-log and engine-window interval cells at
# 1,000 replicates (minutes): on demand
DEFAULT_SECTIONS = SECTIONS[:-2]
TAIL_LEVELS = (0.01, 0.05, 0.10)  # true quantiles of request acceptance at which mixing_tail compares shares
RIVER_BEFORE = 300  # watched in-control steps before the drop in the comparison with river (after the reference)


def interval_cell(rng: np.random.Generator, rho: float, lengths: str, g: int, k: int, reps: int) -> dict:
    mean = streams.mean_for_alpha(ALPHA, rho, k)
    e = streams.rate_moments(mean, rho, k)
    true_l = 1 + sum(e[1:])
    true_cond = [e[i] / e[i - 1] for i in range(1, k + 1)]  # position i accepted given it was checked
    c = (theory.expected_tokens(ALPHA, k) - 1) / k  # the draft cost that puts break-even exactly at alpha
    hits = {"alpha": 0, "L": 0}
    position_hits = np.zeros(k)
    misses_low = losing = healthy = 0
    for _ in range(reps):
        sizes, acc_pos = streams.request_counts(rng, g, mean, rho, k, lengths)  # acc_pos: (k, g)
        accepted = acc_pos.sum(axis=0)
        checked = sizes + acc_pos[:-1].sum(axis=0)
        iv = stats.cluster_robust_interval(accepted, checked)
        hits["alpha"] += iv.lo <= ALPHA <= iv.hi
        misses_low += iv.hi < ALPHA
        status = segment_status(iv.lo, iv.hi, theory.break_even_alpha(k, c))
        losing += status == "losing"
        healthy += status == "healthy"
        tokens = stats.ratio_interval(stats.ClusterSums.of(accepted, sizes.astype(float)), iv.dof)
        hits["L"] += tokens[0] <= true_l - 1 <= tokens[1]
        position_hits += production_study.position_hits(acc_pos, sizes, true_cond)
    out = {f"coverage_{name}": v / reps for name, v in hits.items()}
    out["coverage_per_position"] = (position_hits / reps).tolist()  # each position's own interval
    out.update({"p_losing_at_break_even": losing / reps, "p_healthy_at_break_even": healthy / reps,
                "upper_bound_below_truth": misses_low / reps, "replicates": reps,
                "mc_se_at_0.95": math.sqrt(0.95 * 0.05 / reps)})
    return out


def false_alarm_cell(rng: np.random.Generator, rho: float, lengths: str, k: int, arl0: int, windows: int,
                     shape: str = "beta") -> dict:
    """Each window: a fresh stream, the detector calibrated on its first REFERENCE_STEPS steps, then 10 x ARL0
    in-control steps watched (restarting after every alarm, as in use) by the self-starting detector (its reference
    growing at the checkpoints, detector.run_cusum) and, on the same steps, by the plain one (the first design
    throughout, never recalibrated), so the two are paired."""
    watched = 10 * arl0
    counts: dict[str, list[int]] = {"self_starting": [], "plain": []}
    episodes, hs, grown = 0, [], []
    for _ in range(windows):
        a, c, req = streams.steps(rng, detector.REFERENCE_STEPS + watched, P0, k, rho, lengths, shape)
        d = calibration.design_for(a, c, req, k, BREAK_EVEN, arl0)
        grow = calibration.redesigner(lambda _, held=(a, c, req): held, k, BREAK_EVEN, arl0)
        ref = detector.REFERENCE_STEPS
        _, raw, _, taken = detector.run_cusum(a[ref:], c[ref:], ref, detector.CusumState.start(d), grow)
        counts["self_starting"].append(len(raw))
        counts["plain"].append(len(detector.cusum(a[detector.REFERENCE_STEPS:], c[detector.REFERENCE_STEPS:], d)[1]))
        episodes += len(episode_starts(raw, detector.EPISODE_GAP))
        hs.append([d.h] + [x.h for _, x in taken])
        grown.append([x.reference for _, x in taken])
    boot = rng.integers(0, windows, (2000, windows))
    out: dict = {"stated": arl0, "reference_windows": windows, "watched_steps_per_window": watched}
    for name, alarms in counts.items():
        n_alarms = np.array(alarms)
        rates = n_alarms[boot].sum(axis=1) / (windows * watched)
        spa = windows * watched / max(n_alarms.sum(), 1)
        lo, hi = np.quantile(1 / np.maximum(rates, 1e-12), [0.025, 0.975])
        figures = {"steps_per_false_alarm": spa, "ratio_to_stated": spa / arl0, "ci95": [float(lo), float(hi)],
                   "alarms": int(n_alarms.sum())}
        if name == "self_starting":
            out.update(figures)
        else:
            out["plain"] = figures
    # the threshold at the reference and at each checkpoint taken, over the windows (a checkpoint that a window's
    # alarms deferred past the next one is skipped there)
    sizes = detector.checkpoints(detector.REFERENCE_STEPS)
    by_size: dict[int, list[float]] = {detector.REFERENCE_STEPS: [h[0] for h in hs]}
    for h, refs in zip(hs, grown, strict=True):
        for x, size in zip(h[1:], refs, strict=True):
            by_size.setdefault(size, []).append(x)
    out.update({"episodes": episodes, "steps_per_episode": windows * watched / max(episodes, 1),
                "median_h": float(np.median([h[-1] for h in hs])),
                "h_by_reference": {str(size): {"windows": len(v), "median": float(np.median(v)),
                                               "sd": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0}
                                   for size, v in sorted(by_size.items())
                                   if size in (detector.REFERENCE_STEPS, *sizes)}})
    return out


def delay_cell(rng: np.random.Generator, rho: float, lengths: str, k: int, streams_n: int, arl0: int,
               before: int = 3000) -> dict:
    """A drop from P0 to P_DROP (below break-even) after `before` watched steps; delay to the first alarm after it
    (streams that alarmed before it are left out: the conditional delay) and the error of the dated change."""
    after = 3000
    delays, errors, in_range, early, missed = [], [], 0, 0, 0
    for _ in range(streams_n):
        a0, c0, r0 = streams.steps(rng, detector.REFERENCE_STEPS + before, P0, k, rho, lengths)
        a1, c1, r1 = streams.steps(rng, after, P_DROP, k, rho, lengths)
        a, c = np.concatenate([a0, a1]), np.concatenate([c0, c1])
        change = len(a0)
        req = np.concatenate([r0, r1 + r0.max() + 1])
        d = calibration.design_for(a, c, req, k, BREAK_EVEN, arl0)
        grow = calibration.redesigner(lambda _, held=(a, c, req): held, k, BREAK_EVEN, arl0)
        _, found, _ = detector.detect(a, c, d, detector.REFERENCE_STEPS, grow)
        if any(e.alarm_index < change for e in found):
            early += 1
            continue
        if not found:
            missed += 1
            continue
        e = found[0]
        delays.append(e.alarm_index - change)
        errors.append(e.change_index - change)
        in_range += e.change_lo <= change <= e.change_hi
    d, err = np.array(delays), np.array(errors)
    n = len(d)
    return {"streams": streams_n, "watched_before_change": before, "alarmed_before_change": early,
            "missed_within_3000": missed,
            "mean_delay": float(d.mean()) if n else None,
            "mean_delay_se": float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else None,
            "median_delay": float(np.median(d)) if n else None,
            "mean_abs_change_error": float(np.abs(err).mean()) if n else None,
            "median_change_error": float(np.median(err)) if n else None,
            "change_in_likely_range": in_range / n if n else None}


def mixing_tail_cell(rng: np.random.Generator, rho: float, lengths: str, k: int, references: int,
                     shape: str = "beta") -> dict:
    """How the threshold's calibration pictures request acceptance where false alarms come from: the share of
    requests below the true 1%, 5% and 10% quantiles of request acceptance (two-point: below the midpoint of the two
    kinds, truly one in ten) among the acceptances each group of a reference draws (its smoothed NPMLE, as
    calibration.calibrate draws them) and in the group's NPMLE weights before smoothing, over the true share: averaged
    over the groups of each reference, then over references (with the standard error over references)."""
    mean = streams.mean_for_alpha(P0, rho, k, shape)
    if shape == "beta":
        m = 1 / rho - 1
        levels = TAIL_LEVELS
        cuts = [float(scipy.stats.beta.ppf(q, mean * m, (1 - mean) * m)) for q in levels]
    else:
        hard, easy = streams._two_point(mean, rho)
        levels, cuts = (streams.TWO_POINT_HARD,), [(hard + easy) / 2]
    drawn = np.zeros((references, len(cuts)))
    weights = np.zeros((references, len(cuts)))
    for i in range(references):
        a, c, req = streams.steps(rng, detector.REFERENCE_STEPS, P0, k, rho, lengths, shape)
        _, inverse = np.unique(req, return_inverse=True)
        g = int(inverse.max()) + 1
        mixing = calibration.Mixing.of_steps(a, c, inverse)
        for _ in range(calibration.CALIBRATION_GROUPS):
            rates = mixing.fit(np.bincount(rng.integers(0, g, g), minlength=g))
            r = rates.draw(rng, 4000)
            drawn[i] += [(r < x).mean() for x in cuts]
            weights[i] += [rates.weights[rates.grid < x].sum() for x in cuts]
    out = {"shape": shape, "rho": rho, "lengths": lengths, "k": k, "references": references,
           "true_share": list(levels), "acceptance_below": cuts}
    for name, v in (("drawn", drawn), ("npmle", weights)):
        ratio = v / calibration.CALIBRATION_GROUPS / np.array(levels)
        out[f"{name}_over_true"] = ratio.mean(axis=0).tolist()
        out[f"{name}_over_true_se"] = (ratio.std(axis=0, ddof=1) / math.sqrt(references)).tolist()
    return out


def river_cell(rng: np.random.Generator, arl0: int, target_rate: float) -> dict:
    """ADWIN and Page-Hinkley (river) on accepted/checked per step, tuned by bisection to the CUSUM's measured
    false-alarm rate on 200,000 in-control steps of the cell (rho 0.2, geometric, k = 4), then the same drops:
    the reference window as warm-up, RIVER_BEFORE watched steps, the drop."""
    from river import drift as river_drift

    null = [streams.steps(rng, 40_000, P0, 4, 0.2, "geometric")[:2] for _ in range(5)]
    changed = []
    start, change = detector.REFERENCE_STEPS, detector.REFERENCE_STEPS + RIVER_BEFORE
    for _ in range(60):
        a0, c0, _ = streams.steps(rng, change, P0, 4, 0.2, "geometric")
        a1, c1, _ = streams.steps(rng, 3000, P_DROP, 4, 0.2, "geometric")
        changed.append((np.concatenate([a0, a1]), np.concatenate([c0, c1])))

    def run(make, a, c) -> list[int]:
        det, found = make(), []
        for t, x in enumerate((a / c).tolist()):
            det.update(x)
            if det.drift_detected:
                found.append(t)
        return found

    def rate(make) -> float:
        return sum(len(run(make, a, c)) for a, c in null) / sum(len(a) for a, _ in null)

    def tune(factory, lo, hi) -> float:
        for _ in range(10):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if rate(lambda mid=mid: factory(mid)) > target_rate else (lo, mid)
        return hi

    out = {}
    for name, factory, lo, hi in (
            ("river Page-Hinkley", lambda t: river_drift.PageHinkley(threshold=t, mode="both"), 1.0, 500.0),
            ("river ADWIN", lambda inv: river_drift.ADWIN(delta=1 / inv), 2.0, 1e15)):
        param = tune(factory, lo, hi)
        delays, early = [], 0
        for a, c in changed:
            found = [t for t in run(lambda f=factory, p=param: f(p), a, c) if t >= start]  # the reference is warm-up
            if any(t < change for t in found):
                early += 1
            elif found:
                delays.append(found[0] - change)
        d = np.array(delays)
        out[name] = {"parameter": param, "steps_per_false_alarm": 1 / max(rate(lambda f=factory, p=param: f(p)), 1e-12),
                     "mean_delay": float(d.mean()) if len(d) else None,
                     "mean_delay_se": float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None,
                     "alarmed_before_change": early, "detected": len(d), "streams": len(changed)}
    return out


def main() -> None:  # noqa: C901 (one branch per option and part: a flat list reads best)
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="every cell at full size (about an hour on 2 cores)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--reps", type=int, help="replicates per interval cell (default 300; --full 2,000)")
    ap.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                    help=f"comma-separated parts to run, each with its own seed (default {','.join(DEFAULT_SECTIONS)}; "
                         "also production_status and production_windows), so they can run as separate processes "
                         "and be joined with --merge")
    ap.add_argument("--windows", type=int, help="reference windows per false-alarm cell at a stated 2,000 "
                    "(default 40, --full 100); half as many at 20,000 unless --full")
    ap.add_argument("--rhos", help="comma-separated request correlations of the false-alarm cells (default all), to "
                    "split a part across processes")
    ap.add_argument("--traffic", default="", help="production part: further step-log models by module:function "
                    "(bench/production_study.py says what the function returns)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="join the outputs of runs of separate sections")
    ap.add_argument("--tables", metavar="JSON", help="print docs/drift.md's tables and goal figures from a result")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    if args.tables:
        return print(tables(json.load(open(args.tables))))
    sections = args.sections.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    t0 = time.perf_counter()
    reps, windows = (2000, 100) if args.full else (300, 40)
    reps = args.reps or reps
    windows = args.windows or windows
    fa_rhos = tuple(float(x) for x in args.rhos.split(",")) if args.rhos else RHOS
    results: dict = {"machine": machine(), "full": args.full, "reference_steps": detector.REFERENCE_STEPS,
                     "calibration_version": calibration.CALIBRATION_VERSION, "windows": windows,
                     "sections": sections, "intervals": [], "false_alarms": [], "delays": []}
    if "intervals" in sections:
        rng = np.random.default_rng(2026)
        for rho in RHOS:
            for lengths in LENGTHS:
                for g in REQUESTS:
                    for k in KS:
                        cell = {"rho": rho, "lengths": lengths, "requests": g, "k": k}
                        cell.update(interval_cell(rng, rho, lengths, g, k, reps))
                        results["intervals"].append(cell)
        print(f"intervals done in {time.perf_counter() - t0:.0f} s", flush=True)
    for arl0 in (2000, 20_000):
        if f"false_alarms_{arl0}" not in sections:
            continue
        for rho in fa_rhos:
            rng = np.random.default_rng([arl0, round(rho * 100)])  # one seed per correlation: --rhos splits alike
            for lengths in LENGTHS:
                for k in (KS if args.full or arl0 == 2000 else (4,)):
                    cell = {"rho": rho, "lengths": lengths, "k": k}
                    cell.update(false_alarm_cell(rng, rho, lengths, k, arl0,
                                                 windows if args.full or arl0 == 2000 else windows // 2))
                    results["false_alarms"].append(cell)
                    print(json.dumps(cell), flush=True)
    if "false_alarms_two_point" in sections:
        # request acceptance from two kinds of request, not the beta family the calibration smooths with
        for rho in (0.05, 0.2):
            if rho not in fa_rhos:
                continue
            rng = np.random.default_rng([2029, round(rho * 100)])
            for lengths in LENGTHS:
                cell = {"rho": rho, "lengths": lengths, "k": 4, "shape": "two-point"}
                cell.update(false_alarm_cell(rng, rho, lengths, 4, 2000, windows, "two-point"))
                results["false_alarms"].append(cell)
                print(json.dumps(cell), flush=True)
    for part, (rhos, full_rhos, part_lengths, seed) in DELAY_PARTS.items():
        if part not in sections:
            continue
        rng = np.random.default_rng(seed)
        for rho in (full_rhos if args.full else rhos):
            for lengths in part_lengths:
                for k in (KS if args.full else (4,)):
                    cell = {"rho": rho, "lengths": lengths, "k": k, "stated": 20_000}
                    cell.update(delay_cell(rng, rho, lengths, k, 200 if args.full else 40, 20_000))
                    results["delays"].append(cell)
                    print(json.dumps(cell), flush=True)
    if "river" in sections:
        # the CUSUM's own false-alarm rate in the river cell, measured here so the section stands alone
        rng = np.random.default_rng(2028)
        cusum = false_alarm_cell(rng, 0.2, "geometric", 4, 2000, windows)
        results["river"] = {"cell": "rho 0.2, geometric, k = 4", "target_steps_per_false_alarm":
                            cusum["steps_per_false_alarm"], "cusum_false_alarms": cusum,
                            "detectors": river_cell(rng, 2000, 1 / cusum["steps_per_false_alarm"])}
        delay = {"rho": 0.2, "lengths": "geometric", "k": 4}
        delay.update(delay_cell(rng, 0.2, "geometric", 4, 60, 2000, RIVER_BEFORE))
        results["river"]["specmon CUSUM (stated 2,000)"] = delay
    if "production" in sections:
        results["production"] = production_study.run(np.random.default_rng(2040), args.reps or 200,
                                                      [t for t in args.traffic.split(",") if t])
        print(f"production done in {time.perf_counter() - t0:.0f} s", flush=True)
    if "production_status" in sections:
        results["production_status"] = production_study.status_part(np.random.default_rng(2041), args.reps or 1000,
                                                                     [t for t in args.traffic.split(",") if t])
        print(f"production_status done in {time.perf_counter() - t0:.0f} s", flush=True)
    if "production_windows" in sections:
        results["production_windows"] = {"intervals_engine_windows": production_study.interval_windows(
            np.random.default_rng(2042), args.reps or 1000, (0.5, 1.0, 6.0, 24.0))}
        print(f"production_windows done in {time.perf_counter() - t0:.0f} s", flush=True)
    if "mixing_tail" in sections:
        rng = np.random.default_rng(2032)
        results["mixing_tail"] = []
        for shape, rhos in (("beta", (0.05, 0.2, 0.3)), ("two-point", (0.05, 0.2))):
            for rho in rhos:
                for lengths in LENGTHS:
                    cell = mixing_tail_cell(rng, rho, lengths, 4, 100, shape)
                    results["mixing_tail"].append(cell)
                    print(json.dumps(cell), flush=True)
    results["wall_s"] = time.perf_counter() - t0
    text = json.dumps(results, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)


def range_table(iv: list[dict]) -> str:
    """The interval cells' lowest and highest coverage and their worst status over every request count and k, a row
    per correlation and lengths, each figure with its cell's requests in brackets."""
    def at(value: float, cell: dict) -> str:
        return f"{value:.3f} ({cell['requests']:,})"

    def extremes(cells: list[dict], low_of, high_of=None) -> str:
        high_of = high_of or low_of
        low, high = min(cells, key=low_of), max(cells, key=high_of)
        return f"{at(low_of(low), low)} to {at(high_of(high), high)}"

    rows = ["\n| correlation | lengths | alpha coverage, min to max | L coverage, min to max | per-position coverage, "
            "min to max | P(losing \\| at break-even), max | P(healthy \\| at break-even), max |\n"
            "|---|---|---|---|---|---|---|"]
    for rho in RHOS:
        for lengths in LENGTHS:
            cells = [c for c in iv if (c["rho"], c["lengths"]) == (rho, lengths)]
            if not cells:
                continue
            losing = max(cells, key=lambda c: c["p_losing_at_break_even"])
            healthy = max(cells, key=lambda c: c["p_healthy_at_break_even"])
            positions = extremes(cells, lambda c: min(c["coverage_per_position"]),
                                 lambda c: max(c["coverage_per_position"]))
            rows.append(f"| {rho} | {lengths} | {extremes(cells, lambda c: c['coverage_alpha'])} | "
                        f"{extremes(cells, lambda c: c['coverage_L'])} | {positions} | "
                        f"{at(losing['p_losing_at_break_even'], losing)} | "
                        f"{at(healthy['p_healthy_at_break_even'], healthy)} |")
    return "\n".join(rows)


def tables(r: dict) -> str:  # noqa: C901 (one branch per table of the docs)
    """The markdown tables of docs/drift.md and the figures its goals quote, from a study result (so no figure in
    the docs is typed in)."""
    out = []
    iv = r["intervals"]
    if iv:
        out.append("| correlation | lengths | requests | alpha coverage, min over k | L coverage, min over k | "
                   "per-position coverage, min over k and positions | P(losing \\| at break-even), max over k | "
                   "P(healthy \\| at break-even), max over k |\n|---|---|---|---|---|---|---|---|")
    for rho in RHOS:
        for lengths in LENGTHS:
            for g in REQUESTS:
                cells = [c for c in iv if (c["rho"], c["lengths"], c["requests"]) == (rho, lengths, g)]
                if cells:
                    out.append(f"| {rho} | {lengths} | {g} | {min(c['coverage_alpha'] for c in cells):.3f} | "
                               f"{min(c['coverage_L'] for c in cells):.3f} | "
                               f"{min(min(c['coverage_per_position']) for c in cells):.3f} | "
                               f"{max(c['p_losing_at_break_even'] for c in cells):.3f} | "
                               f"{max(c['p_healthy_at_break_even'] for c in cells):.3f} |")
    if iv:
        out.append(range_table(iv))
    if iv:
        def span(key: str) -> str:  # over the cells, or over every position of every cell
            vals = [v for c in iv for v in (c[key] if isinstance(c[key], list) else [c[key]])]
            return f"min {min(vals):.3f}, mean {np.mean(vals):.3f}, max {max(vals):.3f}"
        out.append(f"\ncells: {len(iv)}; alpha coverage {span('coverage_alpha')}; L coverage {span('coverage_L')}; "
                   f"per-position coverage {span('coverage_per_position')}; P(losing) "
                   f"{span('p_losing_at_break_even')}, cells above 0.03: "
                   f"{sum(c['p_losing_at_break_even'] > 0.03 for c in iv)}; "
                   f"P(healthy) {span('p_healthy_at_break_even')}; "
                   f"L cells below 0.94: {sum(c['coverage_L'] < 0.94 for c in iv)}; alpha cells below 0.94: "
                   f"{sum(c['coverage_alpha'] < 0.94 for c in iv)}\n")
    fa = r["false_alarms"]
    paired = any("plain" in c for c in fa)  # the plain detector watched the same streams
    if fa:
        out.append("| correlation | lengths | k | stated | measured steps per false alarm [95% CI] | ratio | steps "
                   "per episode | median h |" + (" plain detector, same streams: ratio [95% CI] |" if paired else "")
                   + "\n|---|---|---|---|---|---|---|---|" + ("---|" if paired else ""))
    for c in fa:
        shape = " (two-point)" if c.get("shape") == "two-point" else ""
        plain = (f" {c['plain']['ratio_to_stated']:.2f} [{c['plain']['ci95'][0] / c['stated']:.2f}, "
                 f"{c['plain']['ci95'][1] / c['stated']:.2f}] |" if "plain" in c else " |" if paired else "")
        out.append(f"| {c['rho']} | {c['lengths']}{shape} | {c['k']} | {c['stated']:,} | "
                   f"{c['steps_per_false_alarm']:,.0f} "
                   f"[{c['ci95'][0]:,.0f}, {c['ci95'][1]:,.0f}] | {c['ratio_to_stated']:.2f} | "
                   f"{c.get('steps_per_episode', float('nan')):,.0f} | {c['median_h']:.1f} |{plain}")
    for stated, shape in ((2000, "beta"), (20_000, "beta"), (2000, "two-point")):
        cells = [c for c in fa if c["stated"] == stated and c.get("shape", "beta") == shape]
        plain = [c["plain"] for c in cells if "plain" in c]
        for name, view in (("", cells), ("plain detector, same streams: ", plain)):
            if not view:
                continue
            ratios = [c["ratio_to_stated"] for c in view]
            inside = sum(0.8 <= x <= 1.25 for x in ratios)
            ci_inside = sum(c["ci95"][0] <= 1.25 * stated and c["ci95"][1] >= 0.8 * stated for c in view)
            episodes = f"; counted as episodes {min(c['steps_per_episode'] / stated for c in view):.2f} to " \
                       f"{max(c['steps_per_episode'] / stated for c in view):.2f}" if not name else ""
            out.append(f"\n{name}stated {stated:,}, {shape} request acceptance: ratio {min(ratios):.2f} to "
                       f"{max(ratios):.2f} (mean {np.mean(ratios):.2f}); "
                       f"{inside} of {len(view)} cells within 0.8-1.25; {ci_inside} whose 95% CI meets the band"
                       + episodes)
    grown = [c for c in fa if "h_by_reference" in c]
    if grown:
        out.append("\n| correlation | lengths | k | stated | h over the windows, median (sd), by reference size "
                   "|\n|---|---|---|---|---|")
        for c in grown:
            shape = " (two-point)" if c.get("shape") == "two-point" else ""
            out.append(f"| {c['rho']} | {c['lengths']}{shape} | {c['k']} | {c['stated']:,} | " + "; ".join(
                f"{int(size):,}: {v['median']:.1f} ({v['sd']:.1f}, {v['windows']} windows)"
                for size, v in c["h_by_reference"].items()) + " |")
    if r["delays"]:
        out.append("\n| correlation | lengths | k | stated | streams | alarmed in the 3,000 steps before the change | "
                   "mean delay (se) | median delay | mean abs change-time error | median error | truth in likely "
                   "range |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for c in r["delays"]:
        out.append(f"| {c['rho']} | {c['lengths']} | {c['k']} | {c['stated']:,} | {c['streams']} | "
                   f"{c['alarmed_before_change']} | {c['mean_delay']:.1f} ({c['mean_delay_se']:.1f}) | "
                   f"{c['median_delay']:.0f} | {c['mean_abs_change_error']:.1f} | {c['median_change_error']:.0f} | "
                   f"{c['change_in_likely_range']:.2f} |")
    if "river" in r:
        rv = r["river"]
        cu = rv["specmon CUSUM (stated 2,000)"]
        out.append("\n| detector | steps per false alarm | alarmed before the drop | mean delay (se), steps |"
                   "\n|---|---|---|---|")
        out.append(f"| specmon CUSUM (stated 2,000) | {rv['target_steps_per_false_alarm']:,.0f} | "
                   f"{cu['alarmed_before_change']} of {cu['streams']} | {cu['mean_delay']:.1f} "
                   f"({cu['mean_delay_se']:.1f}),"
                   f" median {cu['median_delay']:.1f} |")
        for name, d in rv["detectors"].items():
            param = f"delta = {1 / d['parameter']:.1e}" if "ADWIN" in name else f"threshold {d['parameter']:.1f}"
            out.append(f"| {name} ({param}) | {d['steps_per_false_alarm']:,.0f} | {d['alarmed_before_change']} of "
                       f"{d['streams']} | {d['mean_delay']:.1f} ({d['mean_delay_se']:.1f}) |")
    if r.get("mixing_tail"):
        out.append("\n| request acceptance | correlation | lengths | true share below | drawn / true (se) | "
                   "NPMLE weights / true (se) |\n|---|---|---|---|---|---|")
        for c in r["mixing_tail"]:
            for j, share in enumerate(c["true_share"]):
                out.append(f"| {c['shape']} | {c['rho']} | {c['lengths']} | {share:.2f} (acceptance "
                           f"{c['acceptance_below'][j]:.2f}) | {c['drawn_over_true'][j]:.2f} "
                           f"({c['drawn_over_true_se'][j]:.2f}) | {c['npmle_over_true'][j]:.2f} "
                           f"({c['npmle_over_true_se'][j]:.2f}) |")
    for part in ("production", "production_status", "production_windows"):
        if part in r:
            out.append(production_study.tables(r[part]))
    return "\n".join(out)


def merge(paths: list[str], out: str | None) -> None:
    """Join runs of separate sections into one result: lists concatenated, the river part taken from the run that
    has it, wall_s summed (the sections ran side by side, so it is CPU-bound time, not elapsed)."""
    parts = [json.load(open(p)) for p in paths]
    results = {"machine": parts[0]["machine"], "full": parts[0]["full"], "reference_steps": parts[0]["reference_steps"],
               "calibration_version": max(p.get("calibration_version", 1) for p in parts),
               "sections": [s for p in parts for s in p["sections"]],
               "wall_s_per_part": {}}
    for p in parts:  # a part split across processes (--rhos) appears once per process
        name = ",".join(p["sections"])
        name = next(f"{name} ({i})" for i in range(1, len(parts) + 2) if f"{name} ({i})" not in
                    results["wall_s_per_part"]) if name in results["wall_s_per_part"] else name
        results["wall_s_per_part"][name] = p["wall_s"]
    for key in ("intervals", "false_alarms", "delays", "mixing_tail"):
        results[key] = [c for p in parts for c in p.get(key, [])]
    for part in ("production", "production_status", "production_windows"):
        results.update(next(({part: p[part]} for p in parts if part in p), {}))
    for p in parts:
        if "river" in p:
            results["river"] = p["river"]
    text = json.dumps(results, indent=1)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
