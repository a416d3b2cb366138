"""`specmon alert-rule`: a Prometheus alerting rule over an engine's own speculative-decoding counters, or over
specmon's own series (specmon.verdicts.metrics), where specmon has judged k, c and the load already."""
from __future__ import annotations

from specmon.core import theory

# The engines whose counters a rule can watch, by the prefix their metric names carry, and the label that tells one
# served model from another: llama-server's series carry no labels of their own, so Prometheus' scrape target.
PREFIXES = ("vllm", "llamacpp", "trtllm")
GROUP_BY = {"vllm": "model_name", "llamacpp": "instance", "trtllm": "model_name"}


def break_even_expression(k: int, c: float, window: str, metric_prefix: str) -> tuple[str, str]:
    """The PromQL that is below its threshold while speculation costs more than it saves, and what it measures.

    vLLM and llama.cpp count drafts (verification steps): accepted/drafts against k*c. TensorRT-LLM counts draft
    and accepted tokens but no drafts; with k tokens in every draft, drafts = draft tokens / k, so the same
    condition reads accepted/draft tokens against c."""
    if metric_prefix not in PREFIXES:
        raise ValueError(f"metric_prefix must be one of {', '.join(PREFIXES)}, not {metric_prefix!r}")
    threshold = float(theory.break_even_tokens(k, c)) - 1.0  # k*c accepted tokens per draft
    if metric_prefix == "trtllm":
        accepted, per = "trtllm_spec_decode_num_accepted_tokens_total", "trtllm_spec_decode_num_draft_tokens_total"
        threshold, what = threshold / k, "Accepted tokens per draft token"
    else:
        accepted = f"{metric_prefix}:spec_decode_num_accepted_tokens_total"
        per, what = f"{metric_prefix}:spec_decode_num_drafts_total", "Accepted tokens per draft"
    by = GROUP_BY[metric_prefix]
    expr = (f"sum by ({by}) (rate({accepted}[{window}]))\n"
            f"  / sum by ({by}) (rate({per}[{window}]))\n"
            f"< {threshold:.4f}")
    return expr, what


def prometheus_alert_rule(k: int, c: float, window: str = "15m", for_: str = "30m",
                          metric_prefix: str = "vllm") -> str:
    """A Prometheus alerting rule that fires while mean acceptance length over `window` is below 1 + k*c.

    This is the model-free break-even (docs/math.md): a step emits 1 + accepted/drafts tokens on average and costs
    1 + k*c target steps, so accepted/drafts < k*c means speculation is slower than plain decoding.
    """
    expr, what = break_even_expression(k, c, window, metric_prefix)
    threshold = float(theory.break_even_tokens(k, c)) - 1.0
    alpha_star = theory.break_even_alpha(k, c)
    shown = expr.split("< ")[-1]
    body = "\n".join("          " + line for line in expr.splitlines())
    return f"""groups:
  - name: specmon-speculative-decoding
    rules:
      - alert: SpeculativeDecodingBelowBreakEven
        # Mean acceptance length 1 + accepted/drafts below the break-even 1 + k*c = {threshold + 1:.3f}
        # (k = {k}, c = {c:g}; per-token break-even alpha* = {alpha_star:.3f} under the i.i.d. model).
        expr: |
{body}
        for: {for_}
        labels:
          severity: warning
        annotations:
          summary: "Speculative decoding on {{{{ $labels.{GROUP_BY[metric_prefix]} }}}} costs more than it saves"
          description: "{what} is {{{{ $value | printf \\"%.3f\\" }}}} over {window},
            below the break-even {shown} for k = {k}, c = {c:g}: turn speculation off or retune k."
"""


def specmon_alert_rules(for_: str = "15m") -> str:
    """Rules over specmon's own /metrics: a segment losing at batch 1 (its headline status: L's interval below
    1 + g c) and a run losing at the load it serves now (the measured speedup's interval below 1). specmon has
    judged k, c and the load already, so the rules need neither."""
    alerts = (("SpeculativeDecodingLosing", "specmon_segment_status", "losing",
               "its tokens per step lie below the break-even 1 + g c (batch 1)"),
              ("SpeculativeDecodingLosingAtLoad", "specmon_load_status", "loses",
               "the speedup measured at the concurrency it serves now lies below 1"))
    rules = "".join(f"""      - alert: {name}
        expr: {metric}{{status="{status}"}} == 1
        for: {for_}
        labels:
          severity: warning
        annotations:
          summary: "Speculative decoding on run {{{{ $labels.run }}}}, template {{{{ $labels.template }}}} costs more than it saves"
          description: "specmon finds that {why}: turn speculation off or retune k (specmon recommend --run {{{{ $labels.run }}}})."
""" for name, metric, status, why in alerts)  # noqa: E501 (one annotation per line keeps the YAML plain)
    return f"""groups:
  - name: specmon-verdicts
    rules:
{rules}"""
