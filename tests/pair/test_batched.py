"""Batched decoding with the shipped pair: at batch N every sequence still decodes exactly as its prompt alone
(greedy, both proposers, and plain batched decoding), sampled tokens follow the target per draft position, a crop
or a position broken on purpose for one sequence is caught, and a load sweep is stored as steps and a load sweep in
one run."""
import json
import os
import subprocess
import sys

import pytest

try:
    import torch
except ImportError:
    if os.environ.get("CI"):
        raise RuntimeError("torch is missing: the test command installs .[dev,live]") from None
    pytest.skip("the live-run stack is not installed (pip install -e '.[live]')", allow_module_level=True)

from specmon.analysis import summary  # noqa: E402
from specmon.core import resources  # noqa: E402
from specmon.core.settings import LiveSettings, SweepSettings  # noqa: E402
from specmon.pair import batched, live, live_inputs, sweep, verify  # noqa: E402

TARGET, DRAFT = str(resources.TARGET_MODEL), str(resources.DRAFT_MODEL)
COPY = live_inputs.read_prompts(str(resources.PROMPTS / "copy.jsonl"))
OPEN = live_inputs.read_prompts(str(resources.PROMPTS / "open.jsonl"))
# prompts of different lengths (3 to 62 tokens), so the batch is padded and its sequences accept differently
MIXED = COPY[:4] + OPEN[:4]
GREEDY = LiveSettings(k=4, max_new_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on a busy 2-core machine wait on each other (docs/live.md)
    yield live.load_pair(TARGET, DRAFT)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def alone(pair):
    return [live.target_decode(pair, p, GREEDY.max_new_tokens) for p in MIXED]


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_greedy_batched_speculation_equals_each_prompt_decoded_alone(pair, alone, proposer):
    use = pair if proposer == "draft" else live.Pair(pair.target, None, pair.tokenizer, "ngram")
    run = batched.speculative_decode(use, MIXED, GREEDY)
    assert run.tokens == alone
    assert 0 < run.accepted < run.drafted  # ragged: some drafts rejected, some accepted
    assert min(run.batch_sizes) < len(MIXED) == max(run.batch_sizes)  # sequences left the batch as they finished


def test_plain_batched_decoding_equals_each_prompt_decoded_alone(pair, alone):
    run = batched.plain_decode(pair, MIXED, GREEDY)
    assert run.tokens == alone
    assert run.steps == GREEDY.max_new_tokens - 1 and run.batch_sizes[0] == len(MIXED)  # one pass per token


def test_step_records_are_the_live_runs_contract(pair, tmp_path):
    """Each sequence's steps, as records a single-sequence live run writes, ingest as a run."""
    from specmon.core.sampler import write_step_log
    from specmon.ingest.pipeline import ingest_file
    from specmon.store.database import Store

    run = batched.speculative_decode(pair, MIXED[:4], GREEDY, template="copy, k=4, batch 4",
                                     request_ids=["a", "b", "c", "d"])
    assert {r["request_id"] for r in run.records} == {"a", "b", "c", "d"}
    for rid, tokens in zip("abcd", run.tokens, strict=True):
        assert [t for r in run.records if r["request_id"] == rid for t in r["emitted_tokens"]] == tokens
    one = run.records[0]
    assert len(one["beta"]) == len(one["draft_tokens"]) == 4 and len(one["target_logprobs"]) == 5
    path = tmp_path / "steps.jsonl"
    with open(path, "wb") as out:
        write_step_log(iter(run.records), out)
    with Store(str(tmp_path / "s.duckdb")) as store:
        assert ingest_file(store, str(path), run="batched").status == "stored"
        seg, = summary.summarize(store, run="batched")
        assert seg["template"] == "copy, k=4, batch 4" and seg["requests"] == 4
        assert seg["agreement"] == "agrees"  # exact beta from the full distributions predicts acceptance


def test_sampled_tokens_follow_the_target_at_every_position(pair):
    result = verify.verify(pair, COPY + OPEN, LiveSettings(k=3, max_new_tokens=16), temperature=1.0, concurrency=8)
    assert result.ok, result
    overall, *positions = result.pit
    assert overall.position is None and overall.tokens > 400  # 32 x 16 but for sequences that drew EOS
    assert [p.position for p in positions] == [1, 2, 3, 4] and sum(p.tokens for p in positions) == overall.tokens
    assert positions[-1].bonus and positions[-1].what == "bonus tokens (position 4)"
    assert all(p.level == pytest.approx(overall.level / 4) for p in positions)


def _break_row_1(monkeypatch, pair, method: str) -> None:
    """Patch one BatchCache method so that the target's cache goes wrong by one for the batch's row 1 only: keep
    crops it to one token more than it accepted (a rejected draft token stays visible), positions runs one ahead."""
    right = getattr(batched.BatchCache, method)

    def keep(self, lengths):
        lengths = list(lengths)
        if self.model is pair.target and len(lengths) > 1:
            lengths[1] += 1
        right(self, lengths)

    def positions(self, pending, width):
        out = right(self, pending, width)
        if self.model is pair.target and len(out) > 1:
            out[1] = [p + 1 for p in out[1]]
        return out

    monkeypatch.setattr(batched.BatchCache, method, keep if method == "keep" else positions)


@pytest.mark.parametrize("method", ["keep", "positions"])
def test_a_broken_crop_or_position_for_one_sequence_is_caught(pair, monkeypatch, method):
    """Sequence 1's target cache keeps one rejected token (its crop off by one), or its positions run one ahead:
    the check names that sequence, and never sequence 0, which the bug does not touch."""
    settings = LiveSettings(k=4, max_new_tokens=8)
    assert verify.verify(pair, OPEN[:4], settings, concurrency=4).ok
    _break_row_1(monkeypatch, pair, method)
    result = verify.verify(pair, OPEN[:4], settings, concurrency=4)
    assert not result.ok
    wrong = {m.prompt for m in result.mismatches}
    assert 1 in wrong and 0 not in wrong, result.mismatches


def test_a_load_sweep_is_stored_as_steps_and_load_points(pair, store):
    settings = LiveSettings(max_new_tokens=6, temperature=0.0)
    plan = SweepSettings(concurrency=(1, 2), ks=(1, 2), repeats=2)
    said = []
    done = sweep.record_sweep(store, pair, OPEN[:2], settings, plan, run="sweep", template="open", meta={},
                              progress=lambda n, total, what: said.append((n, total, what)))
    assert said[0] == (0, 12, "repeat 1 of 2: open, plain decoding, batch 1") and said[-1] == (12, 12, "done")
    assert "repeat 2 of 2: open, k=2, batch 2" in [w for _, _, w in said]
    rows = store.query("SELECT k, concurrency, repeat, output_tokens, accepted_tokens, draft_tokens FROM load_points "
                       "ORDER BY repeat, concurrency, k")
    assert len(rows) == 12 and {r[:2] for r in rows} == {(k, b) for k in (0, 1, 2) for b in (1.0, 2.0)}
    assert all(r[3] == 12 for r in rows)  # 2 prompts x 6 tokens at every batch size
    assert all(r[4] is None and r[5] is None for r in rows if r[0] == 0)
    segs = {r["template"]: r for r in summary.summarize(store, run="sweep")}
    assert {"open, k=1, batch 1", "open, k=2, batch 2"} <= set(segs)
    assert segs["open, k=2, batch 2"]["requests"] == 4  # 2 sequences x 2 repeats
    assert [(p.k, p.concurrency) for p in done.points] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(p.speedup.lo is not None for p in done.points)  # two repeats: an interval
    meta = json.loads(store.query("SELECT meta FROM runs WHERE name = 'sweep'")[0][0])
    assert set(meta["sweep"]["costs"]) == {sweep.cell_name("open", k, b) for k in (1, 2) for b in (1, 2)}


def test_a_sweep_stopped_between_runs_stores_nothing(pair, store, tmp_path, monkeypatch):
    class Stop(Exception):
        pass

    def progress(done, total, what):
        if done == 2:
            raise Stop

    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(spool))
    with pytest.raises(Stop):
        sweep.record_sweep(store, pair, OPEN[:2], LiveSettings(max_new_tokens=4), SweepSettings((1, 2), (1,), 1),
                           run="stopped", template="open", meta={}, progress=progress)
    assert not store.query("SELECT * FROM runs WHERE name = 'stopped'")
    assert not list(spool.iterdir())  # the step log written so far is removed


def test_sweep_arguments_are_checked_before_torch_loads(tmp_path):
    for args, message in ((["--k", "1,2"], "several draft lengths make a load sweep"),
                          (["--concurrency", "0,2"], "--concurrency must name batch sizes of at least 1"),
                          (["--concurrency", "1", "--k", "0"], "--k must be at least 1"),
                          (["--concurrency", "1", "--full-distributions", "x.parquet"], "not a load sweep")):
        r = subprocess.run([sys.executable, "-c", "import sys; from specmon.cli.main import main; "
                            "rc = main(sys.argv[1:]); assert 'torch' not in sys.modules; sys.exit(rc)", "live",
                            "--db", str(tmp_path / "e.duckdb"), *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
    r = subprocess.run([sys.executable, "-m", "specmon", "live", "--concurrency", "1,x"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "expected integers separated by commas" in r.stderr


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_verify_at_a_batch_size_prints_each_check(tmp_path, specmon_cmd):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in OPEN[:3]))
    r = subprocess.run([*specmon_cmd, "verify", "--concurrency", "2", "--prompts", str(prompts), "--max-new-tokens",
                        "8", "--k", "2"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})  # torch's threads: see the pair fixture
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "greedy at batch 2, draft model: 4/4 sequences decode exactly as the target alone" in lines
    assert "greedy at batch 2, n-gram: 4/4 sequences decode exactly as the target alone" in lines
    assert any(line.startswith("sampled (T = 1, draft model at batch 2, tokens at draft position 2)") for line in lines)


@pytest.mark.slow  # a sweep of the shipped pair end to end through the CLI (about 30 s)
def test_live_sweep_from_the_cli(tmp_path, specmon_cmd):
    db = str(tmp_path / "l.duckdb")
    r = subprocess.run([*specmon_cmd, "live", "--db", db, "--concurrency", "1,4", "--k", "1,3", "--repeats", "2",
                        "--max-new-tokens", "16", "--temperature", "0", "--threads", "1", "--run", "sw"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "run 'sw':" in r.stdout and "k = 3: " in r.stdout
    rows = json.loads(subprocess.run([*specmon_cmd, "summary", "--db", db, "--json"], capture_output=True,
                                     text=True).stdout)
    assert {s["template"] for s in rows if s["run"] == "sw"} >= {f"copy, k={k}, batch {b}" for k in (1, 3)
                                                                 for b in (1, 4)}
