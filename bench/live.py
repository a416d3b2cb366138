"""Live decoding speed, all in one run on the same pair, prompts, k and temperature: plain target decoding;
specmon's speculative loop (draft model) with logging; HF generate(assistant_model=...); HF
generate(prompt_lookup_num_tokens=...); specmon's n-gram loop. Tokens per second and speedup over plain decoding,
and specmon's measured speedup beside the one predicted from its own measured alpha and c.

    python bench/live.py [--k 4] [--max-new-tokens 64] [--repeats 3]

Greedy decoding (temperature 0), so every method emits the same tokens and only time differs.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from _common import machine
from specmon import live, theory

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, repeats: int) -> tuple[float, int]:
    """Best wall time of `repeats` runs, and the tokens the run produced."""
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        t = time.perf_counter()
        tokens = fn()
        best = min(best, time.perf_counter() - t)
    return best, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", default=str(ROOT / "data" / "prompts" / "copy.jsonl"))
    args = ap.parse_args()
    torch.manual_seed(0)
    pair = live.load_pair(str(ROOT / "data/models/target"), str(ROOT / "data/models/draft"))
    ngram_pair = live.Pair(pair.target, None, pair.tokenizer, "ngram")
    prompts = live.read_prompts(args.prompts)
    n, k = args.max_new_tokens, args.k
    enc = [pair.tokenizer(p, return_tensors="pt") for p in prompts]
    pair.draft.generation_config.num_assistant_tokens = k
    pair.draft.generation_config.num_assistant_tokens_schedule = "constant"
    pair.draft.generation_config.assistant_confidence_threshold = 0.0
    steps: list[dict] = []

    def specmon_loop(use, ngram=None, log=None, logging=True):
        def go():
            out = 0
            for p in prompts:
                for rec in live.generate(use, p, k=k, max_new_tokens=n, temperature=0, ngram=ngram, log=logging):
                    out += len(rec["emitted_tokens"])
                    if log is not None:
                        log.append(rec)
            return out
        return go

    def hf(**kwargs):
        def go():
            out = 0
            for e in enc:
                with torch.inference_mode():
                    ids = pair.target.generate(**e, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                               pad_token_id=pair.tokenizer.eos_token_id, **kwargs)
                out += ids.shape[1] - e["input_ids"].shape[1]
            return out
        return go

    methods = {
        "plain target decoding (specmon loop)": lambda: sum(len(live.target_decode(pair, p, n)) for p in prompts),
        "plain target decoding (HF generate)": hf(),
        "specmon speculative, draft model, logging": specmon_loop(pair),
        "specmon speculative, draft model, no logging": specmon_loop(pair, logging=False),
        "HF generate(assistant_model=draft)": hf(assistant_model=pair.draft),
        "HF generate(prompt_lookup_num_tokens=k)": hf(prompt_lookup_num_tokens=k),
        "specmon speculative, n-gram, logging": specmon_loop(ngram_pair, live.NgramProposer()),
    }
    results = {}
    for name, fn in methods.items():
        fn()  # warm-up
        seconds, tokens = timed(fn, args.repeats)
        results[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
    specmon_loop(pair, log=steps)()
    base = results["plain target decoding (specmon loop)"]["tokens_per_s"]
    for r in results.values():
        r["speedup_over_plain"] = r["tokens_per_s"] / base
    accepted = np.array([s["accepted"] for s in steps])
    g = np.array([len(s["draft_tokens"]) for s in steps])
    checked = np.minimum(accepted + 1, g)
    alpha = accepted.sum() / checked.sum()
    costs = live.measure_costs(pair, prompts[0], k_max=k)
    c = costs["c"]
    tokens_per_step = float(1 + accepted.mean())
    # math.md's measured cost model: a step costs T_verify(k+1) + k T_draft, a plain token T_target(1).
    step_cost = costs["verify_ms"][k + 1] + k * costs["draft_step_ms"]
    results["specmon_model"] = {
        "alpha": float(alpha), "measured_tokens_per_step": tokens_per_step, "costs_ms": costs,
        "c_draft_step_over_target_step": float(c),
        "predicted_speedup_iid": float(theory.speedup(alpha, k, c)),
        "predicted_speedup_measured_costs": tokens_per_step * costs["target_step_ms"] / step_cost,
        "measured_speedup": results["specmon speculative, draft model, logging"]["speedup_over_plain"],
        "logging_cost": 1 - results["specmon speculative, draft model, logging"]["tokens_per_s"]
        / results["specmon speculative, draft model, no logging"]["tokens_per_s"],
    }
    print(json.dumps({"machine": machine(), "k": k, "max_new_tokens": n, "prompts": len(prompts),
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
