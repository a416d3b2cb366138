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
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from specmon.core import theory
from specmon.core.faults import SpecmonError
from specmon.core.sampler import write_step_log
from specmon.core.settings import LIVE_DEFAULTS, THEORY_K_MAX, LiveSettings
from specmon.ingest.pipeline import IngestResult, ingest_file
from specmon.pair.live_inputs import check_pair

LOG_TOPK = 20  # logprobs kept per position in the step log (beta itself is exact)


@dataclass
class Pair:
    target: PreTrainedModel
    draft: PreTrainedModel | None  # None: n-gram prompt lookup
    tokenizer: PreTrainedTokenizerBase
    name: str


def _load(path: str, role: str):
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
    check_pair(target, draft)
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


def set_threads(n: int) -> None:
    """torch's intra-op threads for this process (`specmon live --threads`)."""
    torch.set_num_threads(n)


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
    return [{str(i): v for v, i in zip(vs, ids, strict=True) if v > -math.inf}
            for vs, ids in zip(torch.log(values).tolist(), idx.tolist(), strict=True)]


def log_fields(p_rows: torch.Tensor, q_rows: list[torch.Tensor]) -> dict:
    """A step's exact beta per drafted position and both sides' top-k logprobs (p has one row more: the bonus)."""
    q_matrix = torch.stack(q_rows) if q_rows else p_rows[:0]
    # float32 sums can exceed 1 by an ulp where p and q agree
    beta = np.minimum(theory.beta(p_rows[:len(q_rows)].numpy(), q_matrix.numpy()), 1.0)
    return {"beta": np.atleast_1d(beta).tolist(),
            "target_logprobs": _topk(p_rows), "draft_logprobs": _topk(q_matrix)}


def _forward(model, ids: list[int], cache: DynamicCache) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[0]


def _rollback(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (the tokens a rejection discarded)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass(frozen=True)
class DecodeStep:
    """One verification step of speculative decoding: its step-log record and what the losslessness checks use.

    pit holds (F(x - 1), p(x)) under the target's sampling distribution for every emitted token x (the randomized
    PIT's ingredients, specmon.core.stats.randomized_pit); target_probs (g + 1 rows) and draft_probs (g rows) are the
    full distributions of the step's positions.
    """
    record: dict
    pit: list[tuple[float, float]]
    target_probs: torch.Tensor
    draft_probs: list[torch.Tensor]

    def full_rows(self, step: int) -> list[dict]:
        """Every position's complete p and q (float32) as rows for a Parquet file."""
        rid = self.record["request_id"]
        return [{"request_id": rid, "step": step, "position": i + 1, "side": side,
                 "probs": row.numpy().astype("float32")}
                for side, rows in (("target", list(self.target_probs)), ("draft", self.draft_probs))
                for i, row in enumerate(rows)]


def _propose(pair: Pair, seq: list[int], d_cache: DynamicCache, settings: LiveSettings,
             gen: torch.Generator) -> tuple[list[int], list[torch.Tensor], list[float]]:
    """The draft tokens, their proposal distributions q (one-hot for n-gram lookup) and the wall time of each draft
    step (ms). A draft model makes one pass per token; the first also catches it up on the accepted tokens."""
    if pair.draft is None:
        t0 = time.perf_counter()
        draft = NgramProposer(settings.ngram_min, settings.ngram_max).propose(seq, settings.k)
        vocab = pair.target.get_output_embeddings().weight.shape[0]
        q_rows = [torch.nn.functional.one_hot(torch.tensor(x), vocab).float() for x in draft]
        return draft, q_rows, [(time.perf_counter() - t0) * 1000]
    draft, q_rows, draft_ms = [], [], []
    pending = seq[d_cache.get_seq_length():]
    for _ in range(settings.k):
        t0 = time.perf_counter()
        q = distribution(_forward(pair.draft, pending, d_cache)[-1], settings.temperature, settings.top_p)
        x = _pick(q, settings.temperature, gen)
        draft_ms.append((time.perf_counter() - t0) * 1000)
        draft.append(x)
        q_rows.append(q)
        pending = [x]
    return draft, q_rows, draft_ms


def _accept(draft: list[int], p_rows: torch.Tensor, q_rows: list[torch.Tensor], temperature: float,
            gen: torch.Generator) -> tuple[int, list[int]]:
    """Leviathan's acceptance test: (accepted prefix length, tokens emitted): the accepted prefix and either the
    draw from the residual at the first rejection or the bonus token from p_{g+1}."""
    for i, x in enumerate(draft):
        p_x, q_x = float(p_rows[i, x]), float(q_rows[i][x])
        if float(torch.rand(1, generator=gen)) * q_x > p_x:  # reject: r > p/q
            residual = torch.from_numpy(theory.residual(p_rows[i].numpy(), q_rows[i].numpy()))
            return i, draft[:i] + [_pick(residual, temperature, gen)]
    return len(draft), draft + [_pick(p_rows[len(draft)], temperature, gen)]


def _record(draft: list[int], accepted: int, emitted: list[int], draft_ms: list[float], target_ms: float,
            settings: LiveSettings, request_id: str, template: str | None) -> dict:
    record = {
        "request_id": request_id,
        "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "k": settings.k, "temperature": settings.temperature, "draft_tokens": draft, "accepted": accepted,
        "emitted_tokens": emitted, "target_ms": round(target_ms, 3), "draft_ms": [round(x, 3) for x in draft_ms],
    }
    if template is not None:
        record["template"] = template
    return record


def generate(pair: Pair, prompt: str, settings: LiveSettings = LIVE_DEFAULTS, *, request_id: str = "r0",
             template: str | None = None, log: bool = True, full: bool = False) -> Iterator[DecodeStep]:
    """Speculative decoding of one prompt under settings (k, max_new_tokens, temperature, top_p, seed; n-gram
    lookup where the pair has no draft model); yields each verification step.

    log=False leaves beta and the logprobs out of the records (to measure what logging costs); full=True puts
    both full distributions in each record (ingest then computes the exact PIT for the Losslessness page).
    """
    if settings.k < 1:
        raise SpecmonError(f"k must be at least 1, got {settings.k}")
    gen = torch.Generator().manual_seed(settings.seed)
    seq = pair.tokenizer(prompt)["input_ids"]
    if not seq:
        raise SpecmonError("empty prompt")
    eos = pair.tokenizer.eos_token_id
    t_cache, d_cache = DynamicCache(), DynamicCache()
    produced = 0
    while produced < settings.max_new_tokens:
        draft, q_rows, draft_ms = _propose(pair, seq, d_cache, settings, gen)
        g = len(draft)
        # Target: score the pending context and all g drafts in one pass: rows are p_1 .. p_{g+1}.
        t0 = time.perf_counter()
        logits = _forward(pair.target, seq[t_cache.get_seq_length():] + draft, t_cache)[-(g + 1):]
        target_ms = (time.perf_counter() - t0) * 1000
        p_rows = distribution(logits, settings.temperature, settings.top_p)
        accepted, emitted = _accept(draft, p_rows, q_rows, settings.temperature, gen)
        stop = eos in emitted or produced + len(emitted) >= settings.max_new_tokens
        if eos in emitted:
            emitted = emitted[:emitted.index(eos) + 1]
        emitted = emitted[:settings.max_new_tokens - produced]
        # token j was drawn from p_{j+1} (accepted, correction or bonus)
        pit = [(float(p_rows[j, :x].sum()), float(p_rows[j, x])) for j, x in enumerate(emitted)]
        record = _record(draft, accepted, emitted, draft_ms, target_ms, settings, request_id, template)
        if log:
            record.update(log_fields(p_rows, q_rows))
        if full:
            record["target_probs"] = np.round(p_rows.numpy().astype(np.float64), 8).tolist()
            record["draft_probs"] = [np.round(q.numpy().astype(np.float64), 8).tolist() for q in q_rows]
        yield DecodeStep(record, pit, p_rows, q_rows)
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


def measure_costs(pair: Pair, prompt: str, k_max: int = THEORY_K_MAX, repeats: int = 7) -> dict:
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


def run_prompts(pair: Pair, prompts: list[str], settings: LiveSettings = LIVE_DEFAULTS, *,
                template: str | None = None, full: bool = False,
                progress: Callable[[int, int], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Speculative decoding of every prompt (prompt i seeded with settings.seed + i): the step-log records of all
    of them, and with full=True every position's full distributions as Parquet rows (else none)."""
    records: list[dict] = []
    full_rows: list[dict] = []
    for i, prompt in enumerate(prompts):
        steps = generate(pair, prompt, replace(settings, seed=settings.seed + i), request_id=f"p{i:03d}",
                         template=template, full=full)
        for step_index, step in enumerate(steps):
            records.append(step.record)
            if full:
                full_rows += step.full_rows(step_index)
        if progress:
            progress(i + 1, len(prompts))
    return records, full_rows


def run_name(pair: Pair, settings: LiveSettings) -> str:
    """The default name of a live run: the pair, k and temperature."""
    return f"live {pair.name} k={settings.k} T={settings.temperature:g}"


def run_meta(settings: LiveSettings, target: str, draft: str | None, prompts: str) -> dict:
    """What a live run stores about itself (the run's meta): the models, the prompt set and every setting."""
    return {"target": target, "draft": None if settings.ngram else draft, "proposer": settings.proposer,
            "k": settings.k, "temperature": settings.temperature, "top_p": settings.top_p, "prompts": prompts,
            "max_new_tokens": settings.max_new_tokens, "seed": settings.seed}


@dataclass(frozen=True)
class LiveRun:
    run: str
    template: str
    steps: int
    tokens: int
    seconds: float
    ingest: IngestResult


def record_run(store, pair: Pair, prompts: list[str], settings: LiveSettings = LIVE_DEFAULTS, *, run: str,
               template: str, meta: dict, keep_log: str | None = None, full_distributions: str | None = None,
               progress: Callable[[int, int], None] | None = None) -> LiveRun:
    """Run every prompt and store the step log as a run (through the same ingest as any log file); with
    full_distributions, also write every position's full p and q to that Parquet file."""
    meta = {**meta, "costs": measure_costs(pair, prompts[0])}
    started = time.perf_counter()
    records, full = run_prompts(pair, prompts, settings, template=template, full=bool(full_distributions),
                                progress=progress)
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
