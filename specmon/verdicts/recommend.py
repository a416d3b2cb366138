"""`specmon recommend`: the speculation policy a run's load curve supports, in plain words and in each engine's own
configuration syntax, with what it assumes and how sure it is; nothing where the data cannot support one.

The engines' knobs (read from their sources):
- vLLM: SpeculativeConfig.disable_by_batch_size (vllm/config/speculative.py): speculation is disabled for new
  requests while more than that many are enqueued; one draft length (num_speculative_tokens) for all loads.
- TensorRT-LLM: DecodingBaseConfig.max_concurrency (speculation off at batch sizes above it) and draft_len_schedule
  (batch size -> draft length, from that batch size on; it must hold {1: max_draft_len}), in
  tensorrt_llm/llmapi/llm_args.py, set in the speculative_config of trtllm-serve's --extra_llm_api_options file.
- SGLang: no switch by batch size in its server arguments (python/sglang/srt/server_args.py; its
  --speculative-adaptive follows acceptance, not load): the policy there is a cap on the speculative deployment's
  --max-running-requests.
An unmeasured stretch between two bands is given to the safer side: speculation stops right after the last
concurrency measured to pay.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from specmon.analysis.load import LoadCurve
from specmon.core import load


@dataclass(frozen=True)
class Recommendation:
    """What to configure for one run, or why nothing can be recommended."""

    run: str
    policy: list[load.Band]  # empty: nothing to recommend
    words: str  # the policy, or why there is none
    assumes: list[str]
    certainty: str
    engines: dict[str, str] = field(default_factory=dict)  # engine -> configuration text to paste

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "recommendation": self.words, "assumes": self.assumes, "certainty": self.certainty,
                "engines": self.engines}


def _switch_points(bands: list[load.Band]) -> list[tuple[int, int | None]]:
    """(first batch size, k) per band, each band starting right after the previous band's last measured
    concurrency (the unmeasured stretch goes to the next band only where the previous one paid less)."""
    out: list[tuple[int, int | None]] = []
    for i, b in enumerate(bands):
        start = 1 if i == 0 else math.floor(bands[i - 1].max_concurrency or b.first) + 1
        out.append((start, b.k))
    return out


def _vllm(points: list[tuple[int, int | None]], bands: list[load.Band], measured: list[float]) -> str | None:
    """One draft length for every load: the k best at the most measured concurrencies (the smaller on a tie)."""
    ks = [k for _, k in points if k]
    if not ks:
        return None
    wins = {k: sum(1 for n in measured for b in bands if b.k == k and b.first <= n
                   and (b.max_concurrency is None or n <= b.max_concurrency)) for k in set(ks)}
    k = min(wins, key=lambda kk: (-wins[kk], kk))
    note = (f"# vLLM takes one draft length; the measured best varies ({', '.join(map(str, ks))}): this uses "
            f"k = {k}, the best at the most measured concurrencies\n") if len(set(ks)) > 1 else ""
    config: dict[str, Any] = {"num_speculative_tokens": k}
    off = next((start for start, k in points if k == 0), None)
    if off is not None:
        config["disable_by_batch_size"] = max(off - 1, 2)
    return (note + "# keep your method and model in the speculative config\n"
            f"--speculative-config '{json.dumps(config)}'")


def _tensorrt_llm(points: list[tuple[int, int | None]]) -> str | None:
    """max_concurrency where the policy is one k then off, else draft_len_schedule, which must start with
    {1: max_draft_len} and so cannot raise k with load."""
    first = points[0][1]
    if not first or any(k is None for _, k in points) or any((k or 0) > first for _, k in points):
        return None
    lines = ["# in trtllm-serve's --extra_llm_api_options YAML; keep your decoding_type and model",
             "speculative_config:", f"  max_draft_len: {first}"]
    if len(points) == 2 and points[1][1] == 0:
        lines.append(f"  max_concurrency: {points[1][0] - 1}")
    elif len(points) > 1:
        lines.append(f"  draft_len_schedule: {{{', '.join(f'{start}: {k}' for start, k in points)}}}")
    return "\n".join(lines)


def _sglang(points: list[tuple[int, int | None]]) -> str | None:
    off = next((start for start, k in points if k == 0), None)
    if off is None:
        return None
    return ("# SGLang has no switch by batch size: cap the speculative deployment's batch, and serve more load\n"
            f"# from a deployment without speculation\n--max-running-requests {off - 1}")


def recommend(curve: LoadCurve) -> Recommendation:
    """The policy the run's measurements support, or why there is none."""
    assumes = [f"the baseline: {curve.baseline}" if curve.baseline else "a baseline without speculation",
               "the traffic (prompt and output lengths, templates) stays as it was when measured",
               "concurrency means requests running at once, as the engine or the benchmark counted them"]
    if not curve.known:
        return Recommendation(curve.run, [], f"nothing to recommend: {curve.note}", assumes, "none")
    measured = sorted({p.concurrency for p in curve.points})
    if not all(b.sure for b in curve.bands):
        unsure = ", ".join(f"{n:g}" for b in curve.bands for n in b.unsure)
        return Recommendation(
            curve.run, [], f"nothing to recommend yet: at {unsure} running requests the measurements cannot tell "
            "the choices apart beyond noise (the speedup's interval holds 1, or two draft lengths overlap); repeat "
            "those measurements, or measure longer", assumes, "not enough data")
    points = _switch_points(curve.bands)
    engines = {name: text for name, text in (("vllm", _vllm(points, curve.bands, measured)),
                                             ("tensorrt-llm", _tensorrt_llm(points)), ("sglang", _sglang(points)))
               if text}
    words = load.describe_policy(curve.bands, measured[-1])
    if all(b.k == 0 for b in curve.bands):
        words = f"speculation off: it loses at every measured concurrency ({measured[0]:g} to {measured[-1]:g})"
    return Recommendation(curve.run, curve.bands, words, assumes,
                          f"every band beyond noise at the {len(curve.points)} measured points "
                          f"(intervals from {curve.observations})", engines)
