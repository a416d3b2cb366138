"""Live decoding speed, all in one run on the same pair, prompts, k and temperature: plain target decoding;
specmon's speculative loop (draft model) with logging; HF generate(assistant_model=...); HF
generate(prompt_lookup_num_tokens=...); specmon's n-gram loop. Tokens per second and speedup over plain decoding,
and specmon's measured speedup beside the one predicted from its own measured alpha and c.

    python bench/live.py [--k 4] [--max-new-tokens 64] [--repeats 5] [--threads 1] [--prompts FILE]

It prints JSON; docs/live.md's two runs are bench/live.json ("copy" and "open").

Greedy decoding (temperature 0), so every method emits the same tokens and only time differs.
"""
from __future__ import annotations

import argparse
import json
import time
import timeit

import numpy as np
import torch
from _common import machine

from specmon.core import resources, theory
from specmon.core.settings import LiveSettings
from specmon.pair import live, live_inputs


def timed(fn) -> tuple[float, int]:
    """Wall time of one run, and the tokens it produced."""
    t = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - t, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 leaves a core to the rest of the machine)")
    ap.add_argument("--prompts", default=str(resources.PROMPTS / "copy.jsonl"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    pair = live.load_pair(str(resources.TARGET_MODEL), str(resources.DRAFT_MODEL))
    ngram_pair = live.Pair(pair.target, None, pair.tokenizer, "ngram")
    prompts = live_inputs.read_prompts(args.prompts)
    n, k = args.max_new_tokens, args.k
    enc = [pair.tokenizer(p, return_tensors="pt") for p in prompts]
    pair.draft.generation_config.num_assistant_tokens = k
    pair.draft.generation_config.num_assistant_tokens_schedule = "constant"
    pair.draft.generation_config.assistant_confidence_threshold = 0.0

    greedy = LiveSettings(k=k, max_new_tokens=n, temperature=0.0)

    def specmon_loop(use, logging=True):
        def go():
            go.records = [step.record for p in prompts for step in live.generate(use, p, greedy, log=logging)]
            return sum(len(rec["emitted_tokens"]) for rec in go.records)
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
        "specmon speculative, n-gram, logging": specmon_loop(ngram_pair),
    }
    for fn in methods.values():
        fn()  # warm-up
    plain, logged = "plain target decoding (specmon loop)", "specmon speculative, draft model, logging"
    # Rounds: every method once and the costs once per round, so that each ratio compares runs minutes apart at most
    # (this shared machine's speed drifts within a run); ratios are medians over rounds, with their range.
    rounds = []
    for _ in range(args.repeats):
        seconds, tokens = {}, {}
        for name, fn in methods.items():
            seconds[name], tokens[name] = timed(fn)
        costs = live.measure_costs(pair, prompts[0], k_max=k)
        rounds.append({"seconds": seconds, "costs": costs, "steps": methods[logged].records})

    def spread(values) -> dict:
        return {"median": float(np.median(values)), "min": float(np.min(values)), "max": float(np.max(values))}

    results = {name: {"tokens": tokens[name],
                      "tokens_per_s_best": tokens[name] / min(r["seconds"][name] for r in rounds),
                      "speedup_over_plain": spread([r["seconds"][plain] / r["seconds"][name] for r in rounds])}
               for name in methods}
    steps = rounds[-1]["steps"]  # greedy: every round accepts the same tokens
    accepted = np.array([s["accepted"] for s in steps])
    checked = np.minimum(accepted + 1, [len(s["draft_tokens"]) for s in steps])
    alpha = float(accepted.sum() / checked.sum())
    tokens_per_step = float(1 + accepted.mean())

    # What logging adds to a step, timed alone (beta and top-20 logprobs of k + 1 and k vocabulary rows).
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    p_rows, q_rows = torch.softmax(torch.randn(k + 1, vocab), -1), list(torch.softmax(torch.randn(k, vocab), -1))
    logging_ms = timeit.timeit(lambda: live.log_fields(p_rows, q_rows), number=2000) / 2000 * 1000

    def predicted(costs: dict) -> float:
        # Measured costs in place of 1 + k c (docs/math.md, "Economics"): a step costs T_verify(k+1) + k T_draft,
        # a plain token T_target(1).
        return tokens_per_step * costs["target_step_ms"] / (costs["verify_ms"][k + 1] + k * costs["draft_step_ms"])

    results["specmon_model"] = {
        "alpha": alpha, "measured_tokens_per_step": tokens_per_step,
        "costs_ms_last_round": rounds[-1]["costs"],
        "c": spread([r["costs"]["c"] for r in rounds]),
        "predicted_speedup_iid": spread([theory.speedup(alpha, k, r["costs"]["c"]) for r in rounds]),
        "predicted_speedup_measured_costs": spread([predicted(r["costs"]) for r in rounds]),
        "measured_speedup": results[logged]["speedup_over_plain"],
        # Where a step's wall time goes: the draft passes (with their sampling) and the verification pass as the
        # loop logged them; the rest (acceptance, residual sampling, records, cache crops) is in neither prediction.
        "step_ms": {
            "wall": spread([r["seconds"][logged] * 1000 / len(r["steps"]) for r in rounds]),
            "draft": spread([np.mean([sum(s["draft_ms"]) for s in r["steps"]]) for r in rounds]),
            "verify": spread([np.mean([s["target_ms"] for s in r["steps"]]) for r in rounds])},
        "plain_token_ms": {"wall": spread([r["seconds"][plain] * 1000 / tokens[plain] for r in rounds]),
                           "target_step": spread([r["costs"]["target_step_ms"] for r in rounds])},
        "logging_ms_per_step": logging_ms,
        "logging_cost": spread([1 - r["seconds"]["specmon speculative, draft model, no logging"] / r["seconds"][logged]
                                for r in rounds]),
    }
    print(json.dumps({"machine": machine(), "threads": args.threads, "k": k, "max_new_tokens": n,
                      "prompts": len(prompts),
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
