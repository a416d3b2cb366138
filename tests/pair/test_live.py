"""Live runs with the shipped model pair: the speculative loop is lossless (greedy exact match, randomized PIT),
runs are stored like any other log, and bad inputs get clear errors."""
import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

try:
    import torch  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise RuntimeError("torch is missing: the test command installs .[dev,live]") from None
    pytest.skip("the live-run stack is not installed (pip install -e '.[live]')", allow_module_level=True)
from paths import ROOT

from specmon.core import resources, stats  # noqa: E402
from specmon.core.faults import SpecmonError  # noqa: E402
from specmon.core.settings import LiveSettings  # noqa: E402
from specmon.pair import live, live_inputs

TARGET, DRAFT = str(resources.TARGET_MODEL), str(resources.DRAFT_MODEL)
PROMPTS = [str(resources.PROMPTS / "copy.jsonl"), str(resources.PROMPTS / "open.jsonl")]
GREEDY = LiveSettings(k=4, max_new_tokens=48, temperature=0.0)


@pytest.fixture(scope="module")
def pair():
    return live.load_pair(TARGET, DRAFT)


def test_the_shipped_pair(pair):
    n_target = sum(p.numel() for p in pair.target.parameters())
    n_draft = sum(p.numel() for p in pair.draft.parameters())
    assert n_target >= 8 * n_draft
    size = sum(f.stat().st_size for d in (TARGET, DRAFT) for f in Path(d).glob("*.safetensors"))
    assert size <= 30 * 2**20


@pytest.mark.slow  # about 50 s: the training script end to end runs with CI's slow checks
def test_train_pair_makes_a_pair_that_loads(tmp_path):
    """The training script end to end, on a few standard-library files and two steps per model."""
    stdlib, lib = Path(sysconfig.get_paths()["stdlib"]), tmp_path / "lib"
    for name in ("textwrap.py", "json/encoder.py", "json/decoder.py", "test/test_json/__init__.py"):
        (lib / name).parent.mkdir(parents=True, exist_ok=True)
        (lib / name).write_text((stdlib / name).read_text(encoding="utf-8"), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "specmon.pair.train", "--stdlib", str(lib), "--out", str(tmp_path / "m"),
                        "--target-steps", "2", "--draft-steps", "2", "--batch", "4", "--device", "cpu"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "3 modules" in r.stdout  # the test suite's file is not in the corpus
    trained = live.load_pair(str(tmp_path / "m/target"), str(tmp_path / "m/draft"))
    assert sum(p.numel() for p in trained.target.parameters()) >= 8 * sum(p.numel() for p in trained.draft.parameters())
    text = "def f(x):\n    return x"
    assert trained.tokenizer.decode(trained.tokenizer(text)["input_ids"]) == text
    r = subprocess.run([sys.executable, "-m", "specmon.pair.train", "--stdlib", str(tmp_path / "nowhere")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "nowhere: no .py modules there to train on" in r.stderr


@pytest.fixture(scope="module")
def target_alone(pair):
    """Each prompt's 48 greedy tokens from the target alone, decoded once for both proposers."""
    return {prompt: live.target_decode(pair, prompt, 48)
            for path in PROMPTS for prompt in live_inputs.read_prompts(path)}


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_greedy_speculative_decoding_equals_the_target_alone(pair, target_alone, proposer):
    use = pair if proposer == "draft" else live.Pair(pair.target, None, pair.tokenizer, "ngram")
    for prompt, expected in target_alone.items():
        spec = [t for step in live.generate(use, prompt, GREEDY) for t in step.record["emitted_tokens"]]
        assert spec == expected, prompt


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_sampled_tokens_follow_the_target(pair):
    pit = []
    for i, prompt in enumerate(live_inputs.read_prompts(PROMPTS[0]) + live_inputs.read_prompts(PROMPTS[1])):
        for step in live.generate(pair, prompt, replace(GREEDY, temperature=1.0, seed=i)):
            pit += step.pit
    below, mass = np.array(pit).T
    u = stats.randomized_pit_of(below, mass, np.random.default_rng(0))
    assert len(u) > 500 and stats.uniformity_ks(u).pvalue > 0.001
    # the test has power: the draft's distribution is not the target's
    assert stats.uniformity_ks(np.random.default_rng(1).random(len(u)) ** 1.3).pvalue < 0.001


@pytest.mark.slow  # two live runs of the shipped pair end to end (about 17 s)
def test_live_run_is_stored_and_copy_prompts_accept_more(tmp_path, specmon_cmd):
    db = str(tmp_path / "l.duckdb")
    for prompts in PROMPTS:
        r = subprocess.run([*specmon_cmd, "live", "--db", db, "--k", "4", "--temperature", "0", "--prompts", prompts,
                            "--max-new-tokens", "48", "--run", "pair"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
        assert "run 'pair'" in r.stdout and "tokens/s" in r.stdout
    rows = {s["template"]: s for s in json.loads(subprocess.run(
        [*specmon_cmd, "summary", "--db", db, "--json"], capture_output=True, text=True).stdout)}
    assert set(rows) == {"copy", "open"}
    assert rows["copy"]["alpha"] > rows["open"]["alpha"]
    assert rows["copy"]["c"] is not None and rows["copy"]["beta"] is not None
    assert rows["copy"]["agreement"] == "agrees"  # exact beta from the full distributions predicts acceptance


def test_bad_inputs_get_clear_errors(tmp_path, specmon_cmd, pair):
    def run(*args):
        return subprocess.run([*specmon_cmd, "live", "--db", str(tmp_path / "e.duckdb"), *args],
                              capture_output=True, text=True, timeout=300)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    # each is refused before torch and transformers load (seconds a mistyped argument would otherwise wait)
    for args, message in ((["--target", str(tmp_path / "nowhere")], "no such model directory"),
                          (["--k", "0"], "--k must be at least 1"),
                          (["--prompts", str(empty)], "no prompts in the file"),
                          (["--prompts", str(tmp_path / "none.jsonl")], "no such prompt file")):
        r = run(*args)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
        r = subprocess.run([sys.executable, "-c", "import sys; from specmon.cli.main import main; "
                            "rc = main(sys.argv[1:]); "
                            "assert 'torch' not in sys.modules; sys.exit(rc)", "live", "--db",
                            str(tmp_path / "e.duckdb"), *args], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
    other = tmp_path / "other-draft"
    pair.draft.save_pretrained(other)
    tok = pair.tokenizer
    tok.add_tokens(["<specmon-extra>"])
    tok.save_pretrained(other)
    with pytest.raises(SpecmonError, match="the tokenizers differ: target has 4096 tokens, draft 4097"):
        live.load_pair(TARGET, str(other))


@pytest.mark.slow  # transcripts through the live pair
def test_replay_predicts_acceptance_from_transcripts(tmp_path, specmon_cmd, pair):
    transcripts = tmp_path / "traffic.jsonl"
    lines = []
    prompts = live_inputs.read_prompts(PROMPTS[0])
    for i, prompt in enumerate(prompts):
        completion = pair.tokenizer.decode(live.target_decode(pair, prompt, 24, temperature=1.0, seed=i))
        lines.append(json.dumps({"prompt": prompt, "completion": completion, "template": "copy"}))
    transcripts.write_text("\n".join(lines) + "\n")
    db = str(tmp_path / "r.duckdb")
    r = subprocess.run([*specmon_cmd, "replay", "--db", db, "--transcripts", str(transcripts), "--c", "0.1",
                        "--run", "candidate"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "predicted per-token acceptance beta" in r.stdout
    seg = json.loads(subprocess.run([*specmon_cmd, "summary", "--db", db, "--json", "--c", "0.1"],
                                    capture_output=True, text=True).stdout)[0]
    assert seg["source"] == "replay" and seg["alpha"] is None and seg["requests"] == len(prompts)
    assert 0 < seg["beta_lo"] < seg["beta"] < seg["beta_hi"] < 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    r = subprocess.run([*specmon_cmd, "replay", "--db", db, "--transcripts", str(bad)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "bad.jsonl:1: field 'completion': required, a string" in r.stderr


@pytest.mark.slow  # real processes or many draws: run by CI with the slow checks
def test_full_distributions_to_parquet(tmp_path, specmon_cmd):
    import pyarrow.parquet as pq
    out = tmp_path / "full.parquet"
    r = subprocess.run([*specmon_cmd, "live", "--db", str(tmp_path / "f.duckdb"), "--k", "3", "--max-new-tokens", "8",
                        "--full-distributions", str(out), "--out", str(tmp_path / "steps.jsonl")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    table = pq.read_table(out).to_pandas()
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert len(table) == sum(2 * len(s["draft_tokens"]) + 1 for s in steps)
    sums = table["probs"].map(lambda p: float(np.sum(p)))
    assert np.allclose(sums, 1.0, atol=1e-4) and len(table["probs"].iloc[0]) == 4096
    # with full distributions the run is on the Losslessness page: the PIT of its emitted tokens
    from specmon.analysis import lossless
    from specmon.store.database import Store
    with Store(str(tmp_path / "f.duckdb")) as store:
        (run, template, n), = lossless.segments_with_distributions(store)
        assert n == sum(len(s["emitted_tokens"]) for s in steps)
        assert lossless.pit_check(store, run, template).tokens == n
