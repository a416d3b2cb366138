"""`specmon alert-rule`: a Prometheus alerting rule over an engine's own speculative-decoding counters."""
from __future__ import annotations

from specmon.core import theory


def prometheus_alert_rule(k: int, c: float, window: str = "15m", for_: str = "30m",
                          metric_prefix: str = "vllm") -> str:
    """A Prometheus alerting rule that fires while mean acceptance length over `window` is below 1 + k*c.

    This is the model-free break-even (docs/math.md): a step emits 1 + accepted/drafts tokens on average and costs
    1 + k*c target steps, so accepted/drafts < k*c means speculation is slower than plain decoding.
    """
    threshold = float(theory.break_even_tokens(k, c)) - 1.0
    alpha_star = theory.break_even_alpha(k, c)
    p = metric_prefix
    return f"""groups:
  - name: specmon-speculative-decoding
    rules:
      - alert: SpeculativeDecodingBelowBreakEven
        # Mean acceptance length 1 + accepted/drafts below the break-even 1 + k*c = {threshold + 1:.3f}
        # (k = {k}, c = {c:g}; per-token break-even alpha* = {alpha_star:.3f} under the i.i.d. model).
        expr: |
          sum by (model_name) (rate({p}:spec_decode_num_accepted_tokens_total[{window}]))
            / sum by (model_name) (rate({p}:spec_decode_num_drafts_total[{window}]))
          < {threshold:.4f}
        for: {for_}
        labels:
          severity: warning
        annotations:
          summary: "Speculative decoding on {{{{ $labels.model_name }}}} costs more than it saves"
          description: "Accepted tokens per draft is {{{{ $value | printf \\"%.3f\\" }}}} over {window},
            below the break-even {threshold:.3f} for k = {k}, c = {c:g}: turn speculation off or retune k."
"""
