"""`specmon alert-rule`: rules Prometheus' own promtool accepts (`check rules`) and fires as intended (`test rules`),
over each engine's counters in its own naming."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specmon.core import theory

K, C = 4, 0.2
# Counter increases per minute of the input series: accepted tokens before and after acceptance falls, at minute 60.
ACCEPTED_BEFORE, ACCEPTED_AFTER, DRAFTS = 200, 20, 100
# Each engine's counters as Prometheus stores them after scraping it: (accepted, what accepted is divided by, its
# increase per minute, the labels of the series, the label the rule groups by).
ENGINES = {
    "vllm": ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total", DRAFTS,
             '{engine="0",model_name="m"}', "model_name"),
    "llamacpp": ("llamacpp:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_drafts_total", DRAFTS,
                 '{instance="llama-server:8080",job="llama"}', "instance"),
    # TensorRT-LLM counts draft tokens, not drafts: K of them per draft
    "trtllm": ("trtllm_spec_decode_num_accepted_tokens_total", "trtllm_spec_decode_num_draft_tokens_total",
               K * DRAFTS, '{engine_type="trtllm",model_name="m"}', "model_name"),
}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            raise RuntimeError("promtool is missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    return found


def alert_rule(specmon_cmd: list[str], prefix: str) -> str:
    rule = subprocess.run([*specmon_cmd, "alert-rule", "--k", str(K), "--c", str(C), "--prefix", prefix],
                          capture_output=True, text=True)
    assert rule.returncode == 0, rule.stderr
    return rule.stdout


@pytest.mark.parametrize("prefix", sorted(ENGINES))
def test_promtool_accepts_the_rule(tmp_path, specmon_cmd, promtool, prefix):
    path = tmp_path / "rules.yml"
    path.write_text(alert_rule(specmon_cmd, prefix))
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 1 rules found" in check.stdout


def _unit_test(prefix: str, rules: Path) -> str:
    """promtool's unit test: two hours of counters, acceptance falling at minute 60; with a 15-minute rate the ratio
    crosses break-even at about minute 70, so after `for: 30m` the alert fires at about minute 100."""
    accepted, per, per_minute, labels, by = ENGINES[prefix]
    at_60 = 60 * ACCEPTED_BEFORE
    threshold = (float(theory.break_even_tokens(K, C)) - 1) / (K if prefix == "trtllm" else 1)
    value = ACCEPTED_AFTER / per_minute
    assert ACCEPTED_AFTER / per_minute < threshold < ACCEPTED_BEFORE / per_minute  # the series does cross
    group = {"model_name": "m", "instance": "llama-server:8080"}[by]
    what = "Accepted tokens per draft token" if prefix == "trtllm" else "Accepted tokens per draft"
    not_firing = "\n".join(f"""      - eval_time: {t}m
        alertname: SpeculativeDecodingBelowBreakEven
        exp_alerts: []""" for t in (30, 65, 75, 95))
    return f"""rule_files: [{rules.name}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: '{per}{labels}'
        values: '0+{per_minute}x120'
      - series: '{accepted}{labels}'
        values: '0+{ACCEPTED_BEFORE}x60 {at_60 + ACCEPTED_AFTER}+{ACCEPTED_AFTER}x59'
    alert_rule_test:
{not_firing}
      - eval_time: 110m
        alertname: SpeculativeDecodingBelowBreakEven
        exp_alerts:
          - exp_labels: {{severity: warning, {by}: "{group}"}}
            exp_annotations:
              summary: "Speculative decoding on {group} costs more than it saves"
              description: "{what} is {value:.3f} over 15m, below the break-even {threshold:.4f} for k = {K}, c = {C:g}: turn speculation off or retune k."
"""  # noqa: E501 (promtool compares the annotation whole)


@pytest.mark.parametrize("prefix", sorted(ENGINES))
def test_the_rule_fires_after_acceptance_crosses_break_even_and_not_before(tmp_path, specmon_cmd, promtool, prefix):
    rules = tmp_path / "rules.yml"
    rules.write_text(alert_rule(specmon_cmd, prefix))
    (tmp_path / "test.yml").write_text(_unit_test(prefix, rules))
    run = subprocess.run([promtool, "test", "rules", "test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_an_alert_expected_before_the_crossing_fails_the_unit_test(tmp_path, specmon_cmd, promtool):
    """The unit test can fail: promtool refuses an alert expected before acceptance crossed break-even."""
    rules = tmp_path / "rules.yml"
    rules.write_text(alert_rule(specmon_cmd, "vllm"))
    early = _unit_test("vllm", rules).replace("eval_time: 110m", "eval_time: 50m")
    (tmp_path / "test.yml").write_text(early)
    run = subprocess.run([promtool, "test", "rules", "test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode != 0 and "FAILED" in run.stdout + run.stderr


def test_the_rules_over_specmons_own_series_fire_while_it_finds_a_loss(tmp_path, specmon_cmd, promtool):
    """specmon's own series (what `specmon serve` and `watch --metrics-port` export): a segment that turns losing at
    minute 30 fires after `for: 15m`, and one that stays healthy never does; the same for the load status."""
    rule = subprocess.run([*specmon_cmd, "alert-rule", "--prefix", "specmon"], capture_output=True, text=True)
    assert rule.returncode == 0, rule.stderr
    rules = tmp_path / "rules.yml"
    rules.write_text(rule.stdout)
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 2 rules found" in check.stdout, check.stdout + check.stderr
    summary = "Speculative decoding on run prod, template v2 costs more than it saves"
    (tmp_path / "test.yml").write_text(f"""rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'specmon_segment_status{{run="prod",template="v2",status="losing"}}'
        values: '0x29 1x60'
      - series: 'specmon_segment_status{{run="prod",template="v1",status="losing"}}'
        values: '0x89'
      - series: 'specmon_load_status{{run="prod",template="v2",status="loses"}}'
        values: '0x59 1x30'
    alert_rule_test:
      - eval_time: 40m
        alertname: SpeculativeDecodingLosing
        exp_alerts: []
      - eval_time: 50m
        alertname: SpeculativeDecodingLosing
        exp_alerts:
          - exp_labels: {{severity: warning, run: prod, template: v2, status: losing}}
            exp_annotations:
              summary: "{summary}"
              description: "specmon finds that its tokens per step lie below the break-even 1 + g c (batch 1): turn speculation off or retune k (specmon recommend --run prod)."
      - eval_time: 70m
        alertname: SpeculativeDecodingLosingAtLoad
        exp_alerts: []
      - eval_time: 80m
        alertname: SpeculativeDecodingLosingAtLoad
        exp_alerts:
          - exp_labels: {{severity: warning, run: prod, template: v2, status: loses}}
            exp_annotations:
              summary: "{summary}"
              description: "specmon finds that the speedup measured at the concurrency it serves now lies below 1: turn speculation off or retune k (specmon recommend --run prod)."
""")  # noqa: E501 (promtool compares the annotation whole)
    run = subprocess.run([promtool, "test", "rules", "test.yml"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_an_engine_rule_needs_k_and_c(specmon_cmd):
    r = subprocess.run([*specmon_cmd, "alert-rule", "--prefix", "vllm"], capture_output=True, text=True)
    assert r.returncode == 2 and "--k and --c are needed" in r.stderr
