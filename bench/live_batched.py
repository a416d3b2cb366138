"""Batched live decoding of the shipped pair: the speedup of speculative decoding over plain batched decoding against
batch size, twice (does the curve reproduce?), and with n-gram lookup; beside it, the batched loop at batch 1
against the single-sequence loop, and plain batched decoding's scaling with batch size.

    python bench/live_batched.py [--repeats 5] [--threads 1] [--max-new-tokens 64] [--prompts FILE] [--sweeps 2]

It prints JSON; docs/live.md ("Batched runs: where speculation stops paying") is bench/live_batched.json.

Greedy decoding (temperature 0): every run of a cell emits the same tokens, so only time differs between repeats.
A sweep is specmon.pair.sweep.run_sweep, what `specmon live --concurrency` runs, with its step records written (to
/dev/null) so that logging costs what it costs in a stored sweep.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import numpy as np
import torch
import transformers
from _common import machine

from specmon.core import load, resources
from specmon.core.settings import LiveSettings, SweepSettings
from specmon.pair import batched, live, live_inputs, sweep


def spread(values) -> dict:
    return {"median": float(np.median(values)), "min": float(np.min(values)), "max": float(np.max(values))}


def batch_one(pair: live.Pair, prompts: list[str], settings: LiveSettings, repeats: int) -> dict:
    """The batched loop at batch 1 against the single-sequence loop (live.generate), both logging every step,
    prompt by prompt, alternating which goes first (this machine's speed drifts within seconds); per repeat the
    ratio of the two loops' total times over the prompt set (above 1: the batched loop is faster)."""
    loops = {"single": lambda p: sum(len(s.record["emitted_tokens"]) for s in live.generate(pair, p, settings)),
             "batched": lambda p: batched.speculative_decode(pair, [p], settings).output_tokens}
    ratios, rates = [], {"single": [], "batched": []}
    for r in range(repeats):
        seconds, tokens = dict.fromkeys(loops, 0.0), dict.fromkeys(loops, 0)
        for i, prompt in enumerate(prompts):
            for name in ("single", "batched") if (i + r) % 2 == 0 else ("batched", "single"):
                t0 = time.perf_counter()
                tokens[name] += loops[name](prompt)
                seconds[name] += time.perf_counter() - t0
        for name in loops:
            rates[name].append(tokens[name] / seconds[name])
        ratios.append(seconds["single"] / seconds["batched"])
    return {"tokens_per_s": {k: spread(v) for k, v in rates.items()}, "batched_over_single": spread(ratios)}


def describe(measurements: list[sweep.Measurement], seconds: float) -> dict:
    points = sweep.curve(measurements)
    base = {(m.concurrency, m.repeat): m for m in measurements if m.k == 0}
    plain = {b: float(np.mean([m.tokens_per_s for m in measurements if m.k == 0 and m.concurrency == b]))
             for b in sorted({m.concurrency for m in measurements})}
    out_points = []
    for p in points:
        paired = [m.tokens_per_s / base[(m.concurrency, m.repeat)].tokens_per_s for m in measurements
                  if m.k == p.k and m.concurrency == p.concurrency]
        out_points.append({
            "k": p.k, "batch": p.concurrency, "speedup": p.speedup.estimate, "lo": p.speedup.lo, "hi": p.speedup.hi,
            "verdict": p.speedup.verdict, "paired_ratio": spread(paired), "tokens_per_s": p.tokens_per_s,
            "plain_tokens_per_s": p.baseline_tokens_per_s, "alpha": p.alpha, "tokens_per_step": p.tokens_per_step,
            "c": p.c, "draft_step_ms": p.draft_step_ms, "plain_step_ms": p.target_step_ms,
            "verify_ms": p.verify_ms, "mean_batch": p.mean_batch, "logging_share": p.logging_share})
    peaks = {str(k): {"peak_batch": peak.concurrency, "peak_speedup": peak.speedup.estimate,
                      "describe": c.describe(), "break_even": c.break_even, "lo": c.lo, "hi": c.hi}
             for k, (peak, c) in after_peak(points).items()}
    return {"seconds": seconds, "points": out_points, "break_even_after_peak": peaks,
            "measurements": [dataclasses.asdict(m) for m in measurements],
            "break_even": {str(k): {"describe": c.describe(), "break_even": c.break_even, "lo": c.lo, "hi": c.hi,
                                    "pays_up_to": c.pays_up_to, "loses_from": c.loses_from}
                           for k, c in sweep.crossings(points).items()},
            "plain_tokens_per_s": {str(b): v for b, v in plain.items()},
            "plain_batch_8_over_1": plain[8] / plain[1] if 8 in plain and 1 in plain else None,
            "logging_share_max": max(p.logging_share for p in points)}


def after_peak(points: list[sweep.CurvePoint]) -> dict[int, tuple[sweep.CurvePoint, load.Crossing]]:
    """Per k whose speedup peaks above 1 past the smallest batch size: the peak and where the curve falls through 1
    after it. The curve's own crossing starts where it first pays; this one starts at its peak."""
    out = {}
    for k in sorted({p.k for p in points}):
        mine = sorted((p for p in points if p.k == k), key=lambda p: p.concurrency)
        peak = max(range(len(mine)), key=lambda i: mine[i].speedup.estimate)
        if peak > 0 and mine[peak].speedup.estimate > 1:
            rest = mine[peak:]
            out[k] = (mine[peak], load.crossing([p.concurrency for p in rest], [p.speedup for p in rest]))
    return out


def _within(x: float, point: dict) -> bool:
    return point["lo"] is not None and point["lo"] <= x <= point["hi"]


def reproduce(a: dict, b: dict) -> dict:
    """Each cell's estimate in one sweep against the other's interval, both ways, and the break-even per k."""
    cells = []
    for pa, pb in zip(a["points"], b["points"], strict=True):
        cells.append({"k": pa["k"], "batch": pa["batch"], "first": pa["speedup"], "second": pb["speedup"],
                      "second_in_first": _within(pb["speedup"], pa), "first_in_second": _within(pa["speedup"], pb)})
    return {"cells": cells, "all_within": all(c["second_in_first"] and c["first_in_second"] for c in cells),
            "break_even": {k: [a["break_even"][k]["describe"], b["break_even"][k]["describe"]]
                           for k in a["break_even"]},
            "break_even_after_peak": {k: [x["break_even_after_peak"].get(k, {}).get("describe") for x in (a, b)]
                                      for k in a["break_even"]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 leaves a core to the rest of the machine)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", default=str(resources.PROMPTS / "copy.jsonl"))
    ap.add_argument("--sweeps", type=int, default=2, help="sweeps of the draft-model pair (2: does it reproduce?)")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--k", default="1,2,4")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    pair = live.load_pair(str(resources.TARGET_MODEL), str(resources.DRAFT_MODEL))
    ngram = live.Pair(pair.target, None, pair.tokenizer, "ngram")
    prompts = live_inputs.read_prompts(args.prompts)
    settings = LiveSettings(k=4, max_new_tokens=args.max_new_tokens, temperature=0.0)
    plan = SweepSettings(tuple(int(x) for x in args.concurrency.split(",")), tuple(int(x) for x in args.k.split(",")),
                         args.repeats)
    result: dict = {"machine": machine(), "torch": torch.__version__, "transformers": transformers.__version__,
                    "threads": args.threads, "max_new_tokens": args.max_new_tokens, "prompts": len(prompts),
                    "prompt_file": os.path.basename(args.prompts), "repeats": args.repeats,
                    "temperature": 0.0, "concurrency": list(plan.concurrency), "k": list(plan.ks)}
    result["batch_1_loop"] = batch_one(pair, prompts, settings, args.repeats)
    result["draft_model"] = []
    with open(os.devnull, "wb") as sink:
        for _ in range(args.sweeps):
            t0 = time.perf_counter()
            done = sweep.run_sweep(pair, prompts, settings, plan, template="copy", log_out=sink)
            result["draft_model"].append(describe(done, time.perf_counter() - t0))
        t0 = time.perf_counter()
        done = sweep.run_sweep(ngram, prompts, settings, plan, template="copy", log_out=sink)
        result["ngram"] = describe(done, time.perf_counter() - t0)
    if args.sweeps >= 2:
        result["reproduce"] = reproduce(*result["draft_model"][:2])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
