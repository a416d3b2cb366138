"""The Live run page runs a load sweep in its background thread and shows the measured curve when it is done."""
import pytest
from paths import APP
from streamlit.testing.v1 import AppTest

from specmon.store.database import Store
from specmon.ui.widgets import md_text

torch = pytest.importorskip("torch")


def _form(at: AppTest, run: str, sizes: str, ks: str, repeats: int) -> None:
    at.radio[0].set_value("n-gram prompt lookup")
    at.slider[1].set_value(0.0)  # greedy
    at.slider[2].set_value(8)  # new tokens per prompt
    at.text_input[2].input(run)
    at.checkbox[0].check()
    at.text_input[3].input(sizes)
    at.text_input[4].input(ks)
    at.selectbox[1].select(repeats)


@pytest.fixture
def one_thread():
    """The run's thread is in this process; two threads on a busy 2-core machine wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_live_page_runs_a_sweep_and_shows_its_curve(app_db, one_thread):
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page("specmon/ui/views/live.py").run()
    _form(at, "ui-sweep", "4,8", "2", 2)
    at.button[0].click().run()
    assert not at.exception, at.exception
    job = at.session_state["live_job"]
    assert job.sweep is not None and job.sweep.concurrency == (4, 8) and job.sweep.ks == (2,)
    job.thread.join(timeout=600)
    at.run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.success[0].value.startswith(f"Stored run **{md_text('ui-sweep')}**: ")
    assert [s.value for s in at.subheader] == [f"Speedup by batch size: {md_text('ui-sweep')}"]
    assert any(m.value.startswith("**k = 2**: ") for m in at.markdown)
    table = at.dataframe[0].value
    assert list(table["batch"]) == [4, 8] and table["lo"].notna().all()
    with Store(app_db) as store:
        stored = store.query("SELECT count(*) FROM load_points JOIN segments USING (segment_id) JOIN runs USING "
                             "(run_id) WHERE runs.name = 'ui-sweep'")[0][0]
    assert stored == 2 * 2 * 2  # repeats x batch sizes x (plain, k = 2)


def test_a_sweep_with_bad_batch_sizes_is_refused_on_the_page(app_db):
    at = AppTest.from_file(str(APP), default_timeout=120).run()
    at.switch_page("specmon/ui/views/live.py").run()
    _form(at, "ui-bad", "1,two", "2", 1)
    at.button[0].click().run()
    assert [e.value for e in at.error] == ["batch sizes: expected whole numbers separated by commas, got '1,two'"]
    assert "live_job" not in at.session_state
