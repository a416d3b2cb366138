"""Live runs: speculative decoding of a local model pair (or n-gram prompt lookup), with every step logged.

The loop is Leviathan et al.'s Algorithm 1 with a KV cache for both models: the draft proposes k tokens one at a
time, the target scores all of them in one pass, and on a rejection both caches are cropped back to the accepted
prefix, so no step re-encodes the whole context. Temperature and top-p are applied to both distributions alike;
temperature 0 is greedy (accept while the draft's token is the target's argmax). Each step is a record in
specmon's step-log contract, with the exact beta = sum min(p, q) computed here from the full distributions.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from specmon.faults import SpecmonError
from specmon.ingest import IngestResult, ingest_file
from specmon.sampler import write_step_log

LOG_TOPK = 20  # logprobs kept per position in the step log (beta itself is exact)


@dataclass
class Pair:
    target: PreTrainedModel
    draft: PreTrainedModel | None  # None: n-gram prompt lookup
    tokenizer: PreTrainedTokenizerBase
    name: str


def _load(path: str, role: str):
    # A hub name is "org/model"; anything that looks like a file path must exist here.
    looks_local = path.startswith(("/", ".", "~")) or path.count("/") > 1
    if looks_local and not Path(path).expanduser().exists():
        raise SpecmonError(f"--{role} {path}: no such model directory")
    try:
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        first_line = str(exc).splitlines()[0]
        raise SpecmonError(f"--{role} {path}: cannot load a causal LM and its tokenizer ({first_line})") from None
    model.eval()
    return model, tokenizer


def load_pair(target: str, draft: str | None) -> Pair:
    """Load target and draft; refuse a pair whose tokenizers differ, saying how."""
    target_model, tokenizer = _load(target, "target")
    draft_model = None
    if draft is not None:
        draft_model, draft_tok = _load(draft, "draft")
        a, b = tokenizer.get_vocab(), draft_tok.get_vocab()
        if a != b:
            only_t = sorted(set(a) - set(b))[:3]
            only_d = sorted(set(b) - set(a))[:3]
            moved = [t for t in set(a) & set(b) if a[t] != b[t]][:3]
            raise SpecmonError(
                f"the tokenizers differ: target has {len(a)} tokens, draft {len(b)}; only in the target: {only_t}, "
                f"only in the draft: {only_d}, same token with another id: {moved}. Speculative decoding needs one "
                "vocabulary.")
    return Pair(target_model, draft_model, tokenizer, f"{Path(target).name}+{Path(draft).name if draft else 'ngram'}")


def distribution(logits: torch.Tensor, temperature: float, top_p: float | None) -> torch.Tensor:
    """The sampling distribution over the last axis; temperature 0 gives the argmax as a point mass."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p is not None and top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # the smallest set whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class NgramProposer:
    """Prompt lookup: find the last n tokens (n from max_n down to min_n) earlier in the context, propose what
    followed them. q is the one-hot proposal."""

    def __init__(self, min_n: int = 1, max_n: int = 3):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, context: list[int], k: int) -> list[int]:
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):
                if context[start:start + n] == tail:
                    return context[start + n:start + n + k]
        return []


def _pick(dist: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    """A token from a distribution row: its argmax when greedy, else a draw."""
    return int(dist.argmax()) if temperature == 0 else int(torch.multinomial(dist, 1, generator=gen))


def _topk(rows: torch.Tensor, k: int = LOG_TOPK) -> list[dict[str, float]]:
    """The top-k logprobs of every row, in one topk call (per-row calls cost more than the models here)."""
    values, idx = rows.topk(min(k, rows.shape[-1]), dim=-1)
    return [{str(i): v for v, i in zip(vs, ids) if v > -math.inf}
            for vs, ids in zip(torch.log(values).tolist(), idx.tolist())]


def log_fields(p_rows: torch.Tensor, q_rows: list[torch.Tensor]) -> dict:
    """A step's exact beta per drafted position and both sides' top-k logprobs (p has one row more: the bonus)."""
    q_matrix = torch.stack(q_rows) if q_rows else p_rows[:0]
    # float32 sums can exceed 1 by an ulp where p and q agree
    return {"beta": torch.minimum(p_rows[:len(q_rows)], q_matrix).sum(-1).clamp(max=1.0).tolist(),
            "target_logprobs": _topk(p_rows), "draft_logprobs": _topk(q_matrix)}


def _forward(model, ids: list[int], cache: DynamicCache) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0]


def _rollback(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (the tokens a rejection discarded)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def generate(pair: Pair, prompt: str, *, k: int = 4, max_new_tokens: int = 64, temperature: float = 0.0,
             top_p: float | None = None, seed: int = 0, request_id: str = "r0", template: str | None = None,
             ngram: NgramProposer | None = None, pit: list | None = None, log: bool = True,
             full: list | None = None) -> Iterator[dict]:
    """Speculative decoding of one prompt; yields one step-log record per verification step.

    pit, if given, receives (F(x - 1), p(x)) under the target's sampling distribution for every emitted token x,
    for the randomized PIT (specmon.stats.randomized_pit's ingredients). log=False leaves beta and the logprobs
    out of the records (to measure what logging costs). full, if given, receives every position's complete p and
    q (float32) as rows for a Parquet file.
    """
    if k < 1:
        raise SpecmonError(f"k must be at least 1, got {k}")
    gen = torch.Generator().manual_seed(seed)
    seq = pair.tokenizer(prompt)["input_ids"]
    if not seq:
        raise SpecmonError("empty prompt")
    eos = pair.tokenizer.eos_token_id
    t_cache, d_cache = DynamicCache(), DynamicCache()
    produced = step_index = 0
    while produced < max_new_tokens:
        # Draft: k tokens, one draft pass each (the first pass also catches the draft up on the accepted tokens).
        draft_ms, draft, q_rows = [], [], []
        if pair.draft is None:
            t0 = time.perf_counter()
            draft = (ngram or NgramProposer()).propose(seq, k)
            draft_ms.append((time.perf_counter() - t0) * 1000)
            vocab = pair.target.get_output_embeddings().weight.shape[0]
            q_rows = [torch.nn.functional.one_hot(torch.tensor(x), vocab).float() for x in draft]
        else:
            pending = seq[d_cache.get_seq_length():]
            for _ in range(k):
                t0 = time.perf_counter()
                q = distribution(_forward(pair.draft, pending, d_cache)[-1], temperature, top_p)
                x = _pick(q, temperature, gen)
                draft_ms.append((time.perf_counter() - t0) * 1000)
                draft.append(x)
                q_rows.append(q)
                pending = [x]
        g = len(draft)
        # Target: score the pending context and all g drafts in one pass: rows are p_1 .. p_{g+1}.
        t0 = time.perf_counter()
        logits = _forward(pair.target, seq[t_cache.get_seq_length():] + draft, t_cache)[-(g + 1):]
        target_ms = (time.perf_counter() - t0) * 1000
        p_rows = distribution(logits, temperature, top_p)
        accepted, emitted = g, None
        for i, x in enumerate(draft):
            p_x, q_x = float(p_rows[i, x]), float(q_rows[i][x])
            if float(torch.rand(1, generator=gen)) * q_x > p_x:  # reject: r > p/q
                accepted = i
                # the residual norm(max(0, p - q)) of specmon.theory.residual, in torch
                resid = torch.clamp(p_rows[i] - q_rows[i], min=0)
                resid = resid / resid.sum() if resid.sum() > 0 else p_rows[i]
                emitted = draft[:i] + [_pick(resid, temperature, gen)]
                break
        if emitted is None:
            emitted = draft + [_pick(p_rows[g], temperature, gen)]
        stop = eos in emitted or produced + len(emitted) >= max_new_tokens
        if eos in emitted:
            emitted = emitted[:emitted.index(eos) + 1]
        emitted = emitted[:max_new_tokens - produced]
        if pit is not None:
            for j, x in enumerate(emitted):  # token j was drawn from p_{j+1} (accepted, correction or bonus)
                pit.append((float(p_rows[j, :x].sum()), float(p_rows[j, x])))
        record = {
            "request_id": request_id,
            "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "k": k, "temperature": temperature, "draft_tokens": draft, "accepted": accepted,
            "emitted_tokens": emitted, "target_ms": round(target_ms, 3), "draft_ms": [round(x, 3) for x in draft_ms],
        }
        if log:
            record.update(log_fields(p_rows, q_rows))
        if template is not None:
            record["template"] = template
        if full is not None:
            # In the step log too, so that ingest computes the exact PIT of the emitted tokens (Losslessness page).
            record["target_probs"] = np.round(p_rows.numpy().astype(np.float64), 8).tolist()
            record["draft_probs"] = [np.round(q.numpy().astype(np.float64), 8).tolist() for q in q_rows]
            for side, rows in (("target", list(p_rows)), ("draft", q_rows)):
                full += [{"request_id": request_id, "step": step_index, "position": i + 1, "side": side,
                          "probs": row.numpy().astype("float32")} for i, row in enumerate(rows)]
        step_index += 1
        yield record
        # Roll the caches back to the accepted prefix: both then cover seq[:-1] of the new sequence.
        seq = seq + emitted
        produced += len(emitted)
        _rollback(t_cache, len(seq) - 1)
        _rollback(d_cache, len(seq) - 1)
        if stop:
            return


def target_decode(pair: Pair, prompt: str, max_new_tokens: int, temperature: float = 0.0, top_p: float | None = None,
                  seed: int = 0) -> list[int]:
    """Plain decoding with the target alone (one token per pass, with a KV cache); temperature 0 is greedy."""
    gen = torch.Generator().manual_seed(seed)
    seq = pair.tokenizer(prompt)["input_ids"]
    cache, out, pending = DynamicCache(), [], seq
    for _ in range(max_new_tokens):
        x = _pick(distribution(_forward(pair.target, pending, cache)[-1], temperature, top_p), temperature, gen)
        out.append(x)
        if x == pair.tokenizer.eos_token_id:
            break
        pending = [x]
    return out


def measure_costs(pair: Pair, prompt: str, k_max: int = 8, repeats: int = 7) -> dict:
    """Median wall times on this machine, each as decoding meets it: a target decode step with the target's passes back
    to back (plain decoding); a draft decode step and a target verification pass of n = 1..k_max+1 tokens in
    speculative decoding's alternation (n - 1 draft passes, then one target pass), where each model finds the CPU
    caches holding the other's weights. c = draft step / target decode step (docs/math.md, "Economics")."""
    ids = pair.tokenizer(prompt)["input_ids"]
    caches = {model: DynamicCache() for model in (pair.target, pair.draft) if model is not None}
    for model, cache in caches.items():
        _forward(model, ids, cache)  # the prompt is cached, as it is mid-generation

    def ms(model, n: int) -> float:
        t0 = time.perf_counter()
        _forward(model, ids[-1:] * n, caches[model])
        return (time.perf_counter() - t0) * 1000

    target_steps: list[float] = []
    draft_steps: list[float] = []
    verify: dict[int, list[float]] = {n: [] for n in range(1, k_max + 2)}
    for _ in range(repeats):
        target_steps.append(ms(pair.target, 1))
        _rollback(caches[pair.target], len(ids))
        for n in verify:
            if pair.draft is not None:
                draft_steps += [ms(pair.draft, 1) for _ in range(n - 1)]
                _rollback(caches[pair.draft], len(ids))
            verify[n].append(ms(pair.target, n))
            _rollback(caches[pair.target], len(ids))
    target_step = float(np.median(target_steps))
    draft_step = float(np.median(draft_steps)) if draft_steps else 0.0
    return {"draft_step_ms": draft_step, "target_step_ms": target_step,
            "verify_ms": {n: float(np.median(times)) for n, times in verify.items()}, "c": draft_step / target_step}


def read_prompts(path: str) -> list[str]:
    """One prompt per JSON line ({"prompt": ...}) or, for a .txt file, prompts separated by blank lines."""
    p = Path(path)
    if not p.is_file():
        raise SpecmonError(f"{path}: no such prompt file")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".jsonl":
        prompts = [orjson.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    else:
        prompts = [block.strip("\n") for block in text.split("\n\n") if block.strip()]
    if not prompts:
        raise SpecmonError(f"{path}: no prompts in the file")
    return prompts


def run_prompts(pair: Pair, prompts: list[str], *, progress: Callable[[int, int], None] | None = None,
                **options) -> list[dict]:
    """Speculative decoding of every prompt; the step-log records of all of them."""
    seed = options.pop("seed", 0)
    records: list[dict] = []
    for i, prompt in enumerate(prompts):
        records.extend(generate(pair, prompt, request_id=f"p{i:03d}", seed=seed + i, **options))
        if progress:
            progress(i + 1, len(prompts))
    return records


@dataclass(frozen=True)
class LiveRun:
    run: str
    template: str
    steps: int
    tokens: int
    seconds: float
    ingest: IngestResult


def record_run(store, pair: Pair, prompts: list[str], *, run: str, template: str, meta: dict,
               keep_log: str | None = None, full_distributions: str | None = None,
               progress: Callable[[int, int], None] | None = None, **options) -> LiveRun:
    """Run every prompt and store the step log as a run (through the same ingest as any log file); with
    full_distributions, also write every position's full p and q to that Parquet file."""
    meta = {**meta, "costs": measure_costs(pair, prompts[0])}
    full: list | None = [] if full_distributions else None
    started = time.perf_counter()
    records = run_prompts(pair, prompts, progress=progress, template=template, full=full, **options)
    seconds = time.perf_counter() - started
    if full_distributions:
        pq.write_table(pa.Table.from_pylist(full, schema=pa.schema([
            ("request_id", pa.string()), ("step", pa.int32()), ("position", pa.int16()), ("side", pa.string()),
            ("probs", pa.list_(pa.float32()))])), full_distributions)
    fd, path = tempfile.mkstemp(prefix="specmon-live-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as out:
            write_step_log(iter(records), out)
        if keep_log:
            shutil.copyfile(path, keep_log)
        result = ingest_file(store, path, name=f"live run ({len(prompts)} prompts)", run=run,
                             run_meta=json.dumps(meta))
    finally:
        os.unlink(path)
    if result.status == "rejected":
        raise SpecmonError("the live run's step log did not validate: " + "; ".join(map(str, result.faults[:3])))
    return LiveRun(run, template, len(records), sum(len(r["emitted_tokens"]) for r in records), seconds, result)
