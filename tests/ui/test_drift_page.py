"""The Drift page on engine windows with a rollout annotation: the alarm, the rollout's words and the marks."""
from datetime import timedelta

import pytest
from engine_streams import DROP_AT, START, vllm_log
from paths import APP
from streamlit.testing.v1 import AppTest

from specmon.drift import alarms
from specmon.ingest.pipeline import ingest_file
from specmon.store.database import Store


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_drift_page_shows_engine_alarm_and_marks_the_annotation(app_db, tmp_path):  # noqa: F811
    with Store(app_db) as store:
        assert ingest_file(store, vllm_log(tmp_path / "vllm.log"), run="vllm-prod").status == "stored"
        alarms.annotate(store, "vllm-prod", "v2", START + timedelta(seconds=5 * DROP_AT - 2), "new system prompt")
    at = AppTest.from_file(str(APP), default_timeout=90).run()
    at.switch_page("specmon/ui/views/drift.py").run()
    assert not at.exception, at.exception
    # the page escapes Markdown in text from the data (backslashes, word joiners): compare the plain words
    errors = [e.value.replace("\\", "").replace("\u2060", "") for e in at.error]
    assert any(e.startswith("**Open:** run 'vllm-prod'") and "no false-alarm rate is stated" in e
               for e in errors), errors
    # the caption says what set h, in the words of the alarm and `check`
    captions = [c.value.replace("\\", "") for c in at.caption]
    assert any("One-sided Bernoulli CUSUM over windows" in c and "(the floor where no rate is stated: ln 20,000 x" in c
               and "a lead to check" in c for c in captions), captions
    # the rollout's sides cover different hours (09:14 splits one hour, 08:00 has no match after it): no verdict,
    # shown as information, not as a finding
    infos = [e.value.replace("\\", "").replace("\u2060", "") for e in at.info]
    assert not any(e.startswith("**Annotated rollout.**") for e in errors), errors
    assert any(e.startswith("**Annotated rollout.**") and "new system prompt" in e and "cover different hours" in e
               for e in infos), infos
    # the altair charts (AppTest has no element type for them): their Vega-Lite specs
    specs = [e.proto.spec for e in at.main if type(e).__name__ == "UnknownElement" and hasattr(e.proto, "spec")]
    assert any("annotated rollout" in s and "likely from" in s for s in specs)
