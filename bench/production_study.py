"""The study's production-like part (bench/traffic_daily.py): interval coverage and the headline status at the
true break-even on a daily mix of request types and on engine windows over overlapping requests, and how often a
template change that changes nothing is flagged (and a real drop found) under the daily mix. Run by drift_study.py
(--sections production); every figure with its binomial Monte-Carlo standard error.

A step-log model from another module joins the interval part by name, --traffic module:function, where
function(rng, n_requests, k) returns (a StepLog, its truth: {"alpha", "L_minus_1", "conditional"}).
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable

import numpy as np
import traffic_daily as td

from specmon.core import stats
from specmon.core.segments import position_summary, segment_status
from specmon.core.settings import WINDOW_BANDWIDTH_BINS
from specmon.core.window_grid import window_bin_seconds
from specmon.drift import detector

K = 4
BLOCK_US = 600 * td.US  # engine windows' clusters in template comparisons (specmon's WINDOW_BLOCK_SECONDS)


def serial_sums(a: np.ndarray, n: np.ndarray) -> stats.SerialSums:
    """specmon's sums for engine windows (stats.SerialSums), from the counts of one engine's bins (bin_counts)."""
    return stats.SerialSums.of(a, n, WINDOW_BANDWIDTH_BINS)


def bin_counts(w: td.Windows) -> tuple[np.ndarray, np.ndarray]:
    """Per bin of one engine, as specmon bins engine windows (window_bin_seconds): positions accepted (k, bins),
    drafts."""
    minute = w.end_us // (60 * td.US)
    bin_us = window_bin_seconds(float(minute.max() - minute.min() + 1)) * td.US
    index = (w.end_us // bin_us).astype(np.int64)
    index -= index.min()
    acc_pos = np.stack([np.bincount(index, w.accepted_per_position[:, i]) for i in range(w.k)])
    return acc_pos, np.bincount(index, w.drafts)


def _se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / n)


def _judge(acc_pos: np.ndarray, steps: np.ndarray, truth: dict, sums: Callable = stats.ClusterSums.of) -> dict:
    """Coverage and status at break-even from per-cluster counts: acc_pos (k, clusters) positions accepted,
    steps (clusters) steps or drafts, sums the intervals' variance (clusters, or serial_sums for engine windows'
    bins); break-even put exactly at the truth (1 + k c = the true L)."""
    accepted = acc_pos.sum(axis=0)
    checked = steps + acc_pos[:-1].sum(axis=0)
    iv = stats.cluster_interval(sums(accepted, checked))
    tokens = stats.ratio_interval(sums(accepted, steps.astype(float)), iv.dof)
    out = {"alpha": iv.lo <= truth["alpha"] <= iv.hi}
    if tokens is None:
        return out | {"L": False, "status": "unknown", "positions": [False] * K}
    out["L"] = tokens[0] <= truth["L_minus_1"] <= tokens[1]
    out["status"] = segment_status(tokens[0], tokens[1], truth["L_minus_1"])  # L - 1 against k c
    return out | {"positions": position_hits(acc_pos, steps, truth["conditional"], sums).tolist()}


def position_hits(acc_pos: np.ndarray, steps: np.ndarray, conditional: list[float],
                  sums: Callable = stats.ClusterSums.of) -> np.ndarray:
    """Whether each position's interval, as specmon computes it (its own clusters, or bins for engine windows),
    holds the true conditional rate: acc_pos (k, clusters) positions accepted, steps (clusters) steps or drafts."""
    reached = np.vstack([steps, acc_pos[:-1]])
    hits = np.zeros(len(acc_pos), dtype=bool)
    for i in range(len(acc_pos)):
        # a cluster the position never reached is none of its clusters; empty bins stay, they keep the grid's order
        held = reached[i] > 0 if sums is stats.ClusterSums.of else np.ones(len(steps), dtype=bool)
        found = sums(acc_pos[i][held], reached[i][held])
        p = position_summary(i + 1, found.n, found.a, float(steps.sum()), sums=found)
        hits[i] = p.conditional_lo is not None and p.conditional_lo <= conditional[i] <= p.conditional_hi
    return hits


def _tally(results: list[dict]) -> dict:
    n = len(results)
    out: dict = {"replicates": n}
    for name in ("alpha", "L"):
        p = sum(r[name] for r in results) / n
        out[f"coverage_{name}"], out[f"se_{name}"] = p, _se(p, n)
    pos = np.mean([r["positions"] for r in results], axis=0)
    out["coverage_per_position"] = pos.tolist()
    for status in ("losing", "healthy"):
        p = sum(r["status"] == status for r in results) / n
        out[f"p_{status}_at_break_even"], out[f"se_{status}"] = p, _se(p, n)
    out["no_interval"] = sum(r["status"] == "unknown" for r in results) / n
    return out


def _step_counts(log: td.StepLog) -> tuple[np.ndarray, np.ndarray]:
    _, inverse = np.unique(log.request, return_inverse=True)
    acc_pos = np.stack([np.bincount(inverse, log.accepted >= i + 1) for i in range(log.k)])
    return acc_pos, np.bincount(inverse).astype(float)


def daily_model(rng: np.random.Generator, n: int, k: int) -> tuple[td.StepLog, dict]:
    return td.daily_steps(rng, n, 24, k), td.truth(k, td.day_share())


def interval_steps(rng: np.random.Generator, reps: int, model: Callable = daily_model) -> list[dict]:
    out = []
    for n in (20, 200, 1000):
        truth = model(np.random.default_rng(0), 1, K)[1]
        out.append({"requests": n} | _tally([_judge(*_step_counts(model(rng, n, K)[0]), truth)
                                             for _ in range(reps)]))
    return out


def _flat(_: np.ndarray) -> np.ndarray:
    return np.full(np.shape(_), 0.5)


def interval_windows(rng: np.random.Generator, reps: int, spans: tuple[float, ...] = (1.0, 6.0, 24.0)) -> list[dict]:
    """Windows over requests arriving at 0.2/s with a constant mix over each span (hours), their variance pairing
    neighbouring bins as specmon's does (stats.SerialSums)."""
    truth = td.truth(K, 0.5)
    out = []
    for hours in spans:
        results = [_judge(*bin_counts(td.engine_windows(rng, 0.2, hours, K, share=_flat)), truth, serial_sums)
                   for _ in range(reps)]
        out.append({"hours": hours} | _tally(results))
    return out


def _pooled_flag(before: detector.Cells, after: detector.Cells) -> bool:
    """The verdict of the whole periods compared (specmon's before matched hours): hurt or raised at 1%."""
    b, a = before.interval(), after.interval()
    v = sum(x.estimate * (1 - x.estimate) / x.n_eff for x in (a, b))
    z = (a.estimate - b.estimate) / math.sqrt(v)
    return abs(z) > stats.t_quantile(detector.CHANGE_CONFIDENCE, min(a.dof, b.dof))


def _step_cells(log: td.StepLog, mask: np.ndarray) -> detector.Cells:
    hour = log.ts_us[mask] - log.ts_us[mask] % td.HOUR_US
    keys = log.request[mask].astype(np.int64) * 1000 + hour // td.HOUR_US
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    ts = log.ts_us[mask]
    lo = np.full(len(first), np.iinfo(np.int64).max)
    hi = np.full(len(first), np.iinfo(np.int64).min)
    np.minimum.at(lo, inverse, ts)
    np.maximum.at(hi, inverse, ts)
    return detector.Cells(log.request[mask][first], hour[first], np.bincount(inverse, log.accepted[mask]),
                          np.bincount(inverse, log.checked[mask]), lo, hi)


def _window_cells(w: td.Windows, mask: np.ndarray) -> detector.Cells:
    end = w.end_us[mask]
    return detector.Cells(end // BLOCK_US, end - end % td.HOUR_US, w.accepted[mask], w.checked[mask], end, end)


def template_changes(rng: np.random.Generator, reps: int, kind: str, drop: float, span_h: float = 72) -> dict:
    """A rollout at a uniformly random time of a span_h-hour daily mix (at least 6 hours from either end)."""
    new = {"hurt": 0, "helped": 0, "no detectable change": 0, detector.DIFFERENT_HOURS: 0, detector.ONE_HOUR: 0}
    pooled = 0
    for _ in range(reps):
        at = float(rng.uniform(6, span_h - 6))
        if kind == "steps":
            log = td.daily_steps(rng, 3000, span_h, K, at, drop)
            before, after = _step_cells(log, ~log.v2), _step_cells(log, log.v2)
        else:
            w = td.engine_windows(rng, 0.05, span_h, K, at, drop)
            before, after = _window_cells(w, ~w.v2), _window_cells(w, w.v2)
        new[detector.compare(before, after, by_stratum=kind == "windows").verdict] += 1
        pooled += _pooled_flag(before, after)
    flagged = (new["hurt"] + new["helped"]) / reps
    return {"kind": kind, "drop": drop, "span_h": span_h, "replicates": reps, "verdicts": new,
            "flagged": flagged, "se_flagged": _se(flagged, reps), "hurt": new["hurt"] / reps,
            "whole_periods_flagged": pooled / reps, "se_whole_periods": _se(pooled / reps, reps)}


def run(rng: np.random.Generator, reps: int, traffic: list[str]) -> dict:
    out: dict = {"intervals_daily_steps": interval_steps(rng, reps),
                 "intervals_engine_windows": interval_windows(rng, max(reps // 2, 20))}
    out["template_changes"] = [template_changes(rng, reps, kind, drop) for kind in ("steps", "windows")
                               for drop in (0.0, 0.03)]
    return out | named_models(rng, reps, traffic)  # last: the parts above keep their figures


def named_models(rng: np.random.Generator, reps: int, traffic: list[str]) -> dict:
    """The interval cells of other modules' step-log models, by name (module:function)."""
    out = {}
    for name in traffic:
        module, function = name.split(":")
        out[f"intervals_{name}"] = interval_steps(rng, reps, getattr(importlib.import_module(module), function))
    return out


def status_part(rng: np.random.Generator, reps: int, traffic: list[str]) -> dict:
    """The step-log interval cells alone (the daily mix and the named models), at more replicates: the headline
    status's error at break-even is a rate near 0.03, which 200 replicates cannot tell from 0.04."""
    return {"intervals_daily_steps": interval_steps(rng, reps)} | named_models(rng, reps, traffic)


def tables(r: dict) -> str:
    """The docs' tables of the production part (or of its status part alone, status_part)."""
    out = ["| traffic | size | alpha coverage | L coverage | per-position coverage, min-max | P(losing \\| at "
           "break-even) | P(healthy \\| at break-even) | replicates |", "|---|---|---|---|---|---|---|---|"]
    for key in (key for key in r if key.startswith("intervals_")):
        size = "hours" if key == "intervals_engine_windows" else "requests"
        traffic = key.removeprefix("intervals_").split(":")[-1]  # a named model by its function's name
        for c in r[key]:
            pos = c["coverage_per_position"]
            out.append(f"| {traffic} | {c[size]:g} {size} | {c['coverage_alpha']:.3f} "
                       f"({c['se_alpha']:.3f}) | {c['coverage_L']:.3f} ({c['se_L']:.3f}) | {min(pos):.3f}-"
                       f"{max(pos):.3f} | {c['p_losing_at_break_even']:.3f} ({c['se_losing']:.3f}) | "
                       f"{c['p_healthy_at_break_even']:.3f} ({c['se_healthy']:.3f}) | {c['replicates']} |")
    if "template_changes" not in r:
        return "\n".join(out)
    out += ["", "| traffic | true change | flagged hurt or raised | of which hurt | different hours | whole periods "
            "compared, flagged | replicates |", "|---|---|---|---|---|---|---|"]
    for c in r["template_changes"]:
        out.append(f"| {c['kind']} | {-c['drop']:+.2f} | {c['flagged']:.3f} ({c['se_flagged']:.3f}) | {c['hurt']:.3f} "
                   f"| {c['verdicts'][detector.DIFFERENT_HOURS] / c['replicates']:.3f} | "
                   f"{c['whole_periods_flagged']:.3f} ({c['se_whole_periods']:.3f}) | {c['replicates']} |")
    return "\n".join(out)
