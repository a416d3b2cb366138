"""Batched decoding of a local pair: B sequences in one forward pass per step, speculatively with ragged acceptance,
and plain batched target decoding as its baseline.

Each sequence keeps its own accepted prefix. The models' KV caches hold one column per token fed, shared by the
batch (one DynamicCache), and a mask per sequence says which columns it sees: prompt padding, and the draft tokens
its verification rejected. Cropping a sequence to its accepted length masks its rejected columns; the columns no
sequence sees any more at the end are cut off the cache (DynamicCache.crop). Position ids count each sequence's own
visible tokens, so a sequence's positions are what decoding it alone gives them, and nothing is re-encoded. A
sequence that finishes leaves the batch (DynamicCache.batch_select_indices).

The acceptance test is Leviathan et al.'s, per sequence, as in specmon.pair.live; every step of every sequence is
a record in the step-log contract (the sequence is the request).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import torch
from transformers import DynamicCache, PreTrainedModel

from specmon.core.faults import SpecmonError
from specmon.core.settings import LiveSettings
from specmon.pair.live import LOG_TOPK, NgramProposer, Pair, distribution

_PAD = 0  # the token id fed in padding columns; they are masked, so any id will do


class BatchCache:
    """One model's KV cache for a batch of sequences of different lengths.

    mask[r, t] says whether sequence r sees cache column t; lengths[r] is how many tokens of sequence r the cache
    holds (its visible columns, in order: the first lengths[r] tokens of the sequence)."""

    def __init__(self, model: PreTrainedModel, batch: int) -> None:
        self.model = model
        self.cache = DynamicCache()
        self.mask = torch.zeros(batch, 0, dtype=torch.bool)
        self.lengths = [0] * batch

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    def positions(self, pending: Sequence[Sequence[int]], width: int) -> list[list[int]]:
        """Position ids of the new columns: each sequence's tokens continue its own count (padding repeats it)."""
        return [[n] * (width - len(p)) + list(range(n, n + len(p))) for n, p in zip(self.lengths, pending, strict=True)]

    def forward(self, pending: Sequence[Sequence[int]], last: int = 0) -> torch.Tensor:
        """Feed each sequence its pending tokens in one pass, padding first so that every sequence's last token is
        in the last column; logits [B, W, V] (a padding column's row is meaningless), or of the last `last` columns
        only (the output layer over the whole vocabulary costs as much as the rest of a small model)."""
        width = max(max(len(p) for p in pending), last)
        ids = torch.tensor([[_PAD] * (width - len(p)) + list(p) for p in pending])
        new = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in pending], dtype=torch.bool)
        mask = torch.cat([self.mask, new], dim=1)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=torch.tensor(
                self.positions(pending, width)), cache=self.cache, use_cache=True, logits_to_keep=last).logits
        self.mask = mask
        self.lengths = [n + len(p) for n, p in zip(self.lengths, pending, strict=True)]
        return logits

    def keep(self, lengths: Sequence[int]) -> None:
        """Crop each sequence to its first lengths[r] tokens: its later columns are masked, and the trailing columns
        that no sequence sees are dropped from the cache."""
        rank = self.mask.cumsum(dim=1)
        self.mask = self.mask & (rank <= torch.tensor(lengths)[:, None])
        seen = self.mask.any(dim=0).nonzero()
        last = int(seen[-1]) + 1 if len(seen) else 0
        if last < self.columns:
            self.cache.crop(last - self.columns)
            self.mask = self.mask[:, :last]
        self.lengths = list(lengths)

    def select(self, rows: Sequence[int]) -> None:
        """Keep only these sequences (the others have finished)."""
        index = torch.tensor(list(rows), dtype=torch.long)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.lengths = [self.lengths[r] for r in rows]


def _pick(dist: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """A token per row of [B, V]: the argmax when greedy, else a draw (multinomial normalizes each row)."""
    return dist.argmax(-1) if temperature == 0 else torch.multinomial(dist, 1, generator=gen).squeeze(1)


def _check_lengths(pair: Pair, seqs: list[list[int]], settings: LiveSettings) -> None:
    if any(not s for s in seqs):
        raise SpecmonError("empty prompt")
    limit = getattr(pair.target.config, "n_positions", None) or getattr(pair.target.config,
                                                                         "max_position_embeddings", None)
    longest = max(len(s) for s in seqs) + settings.max_new_tokens + settings.k
    if limit is not None and longest > limit:
        raise SpecmonError(f"the longest prompt ({max(len(s) for s in seqs)} tokens) with {settings.max_new_tokens} "
                           f"new tokens and k = {settings.k} exceeds the target's {limit} positions")


@dataclass
class BatchRun:
    """What one batched decode produced: the tokens of each sequence (in prompt order), and what the run took.

    records: the step-log records (with log=True); pit: (position, F(x - 1), p(x)) under the target's sampling
    distribution for every emitted token, position being the verification row it was drawn from (1 = the first
    drafted position); with pit=True only. Times are milliseconds of the batch's passes."""
    tokens: list[list[int]]
    seconds: float = 0.0
    steps: int = 0  # forward passes of the target (verification passes; plain decoding: decode steps)
    accepted: int = 0
    drafted: int = 0
    checked: int = 0
    records: list[dict] = field(default_factory=list)
    pit: list[tuple[int, float, float]] = field(default_factory=list)
    draft_ms: list[float] = field(default_factory=list)  # every draft pass (n-gram: every batch proposal)
    target_ms: list[float] = field(default_factory=list)  # every target pass (plain decoding: but its prefill)
    logging_ms: float = 0.0  # building the records (beta, top-k logprobs), within seconds
    batch_sizes: list[int] = field(default_factory=list)  # sequences in flight at each target pass

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def plain_decode(pair: Pair, prompts: Sequence[str], settings: LiveSettings, *, seed: int | None = None) -> BatchRun:
    """Plain batched decoding with the target alone: every sequence in one forward pass per token, with a KV cache
    (the prompts left-padded in one prefill); temperature 0 is greedy. A sequence leaves the batch at EOS."""
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(settings.seed if seed is None else seed)
    seqs = [pair.tokenizer(p)["input_ids"] for p in prompts]
    _check_lengths(pair, seqs, settings)
    eos = pair.tokenizer.eos_token_id
    cache = BatchCache(pair.target, len(seqs))
    out: list[list[int]] = [[] for _ in seqs]
    rows = list(range(len(seqs)))  # the prompt index of each row in flight
    logits = cache.forward(seqs, last=1)[:, -1]
    run = BatchRun(out)
    while True:
        x = _pick(distribution(logits, settings.temperature, settings.top_p), settings.temperature, gen).tolist()
        keep = []
        for r, (i, token) in enumerate(zip(rows, x, strict=True)):
            out[i].append(token)
            if token != eos and len(out[i]) < settings.max_new_tokens:
                keep.append(r)
        if not keep:
            break
        if len(keep) < len(rows):
            cache.select(keep)
            rows = [rows[r] for r in keep]
            x = [x[r] for r in keep]
        t0 = time.perf_counter()
        logits = cache.forward([[token] for token in x], last=1)[:, -1]
        run.target_ms.append((time.perf_counter() - t0) * 1000)
        run.batch_sizes.append(len(rows))
    run.steps = len(run.target_ms)
    run.seconds = time.perf_counter() - started
    return run


def _log_fields(p_rows: torch.Tensor, q_rows: torch.Tensor, g: list[int]) -> list[dict]:
    """Per sequence: the exact beta of each drafted position and both sides' top-k logprobs, as live.log_fields
    gives them for one sequence, computed for the whole batch in one pass (per-row calls would cost more than the
    models here). p_rows [B, G + 1, V] (row j: the target's position j + 1), q_rows [B, G, V]."""
    width = q_rows.shape[1]
    beta = torch.minimum(p_rows[:, :width], q_rows).sum(-1).clamp(max=1.0).tolist()
    values, idx = torch.cat([p_rows, q_rows], dim=1).topk(min(LOG_TOPK, p_rows.shape[-1]), dim=-1)
    logs, ids = torch.log(values).tolist(), idx.tolist()

    def top(r: int, j: int) -> dict[str, float]:
        return {str(i): v for v, i in zip(logs[r][j], ids[r][j], strict=True) if v > float("-inf")}

    return [{"beta": beta[r][:g[r]], "target_logprobs": [top(r, j) for j in range(g[r] + 1)],
             "draft_logprobs": [top(r, width + 1 + j) for j in range(g[r])]} for r in range(len(g))]


def _propose(pair: Pair, seqs: list[list[int]], draft: BatchCache | None, settings: LiveSettings,
             gen: torch.Generator, vocab: int) -> tuple[torch.Tensor, torch.Tensor, list[int], list[float]]:
    """Every sequence's draft: tokens [B, G] (padded where n-gram lookup found fewer), proposal distributions
    [B, G, V] (one-hot for n-gram lookup, zero rows in padding), each sequence's own draft length, and the wall
    time of each batched draft pass (ms)."""
    if draft is None:
        t0 = time.perf_counter()
        proposer = NgramProposer(settings.ngram_min, settings.ngram_max)
        found = [proposer.propose(s, settings.k) for s in seqs]
        width = max(len(d) for d in found)
        tokens = torch.tensor([d + [_PAD] * (width - len(d)) for d in found], dtype=torch.long).view(len(seqs), width)
        q = torch.nn.functional.one_hot(tokens, vocab).float()
        g = [len(d) for d in found]
        q *= (torch.arange(width)[None, :] < torch.tensor(g)[:, None])[..., None]
        return tokens, q, g, [(time.perf_counter() - t0) * 1000]
    pending = [s[n:] for s, n in zip(seqs, draft.lengths, strict=True)]
    picked: list[torch.Tensor] = []
    q_rows: list[torch.Tensor] = []
    times: list[float] = []
    for _ in range(settings.k):
        t0 = time.perf_counter()
        q = distribution(draft.forward(pending, last=1)[:, -1], settings.temperature, settings.top_p)
        x = _pick(q, settings.temperature, gen)
        times.append((time.perf_counter() - t0) * 1000)
        picked.append(x)
        q_rows.append(q)
        pending = [[t] for t in x.tolist()]
    return torch.stack(picked, 1), torch.stack(q_rows, 1), [settings.k] * len(seqs), times


def _accept(draft: torch.Tensor, p_rows: torch.Tensor, q_rows: torch.Tensor, g: list[int], temperature: float,
            gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan's acceptance test for every sequence at once: the accepted prefix length [B], and the next token
    [B]: the draw from the residual norm(max(0, p - q)) at the first rejection, or the bonus token from p_{g+1}."""
    batch, width = draft.shape
    lengths = torch.tensor(g)
    rows = torch.arange(batch)
    if width:
        p_x = p_rows[:, :width].gather(2, draft[..., None])[..., 0]
        if temperature == 0:
            ok = p_x > 0  # one-hot p: the draft token is the target's argmax
        else:
            ok = torch.rand(batch, width, generator=gen) * q_rows.gather(2, draft[..., None])[..., 0] <= p_x
        ok &= torch.arange(width)[None, :] < lengths[:, None]
        accepted = ok.long().cumprod(dim=1).sum(dim=1)
    else:
        accepted = torch.zeros(batch, dtype=torch.long)
    p_next = p_rows[rows, accepted]
    if width:
        rejected = (accepted < lengths).float()[:, None]
        residual = (p_next - q_rows[rows, accepted.clamp(max=width - 1)] * rejected).clamp(min=0)
        empty = residual.sum(-1) <= 0  # p <= q everywhere: rounding only; theory.residual returns p there too
        residual[empty] = p_next[empty]
    else:
        residual = p_next
    return accepted, _pick(residual, temperature, gen)


def _verify(target: BatchCache, seqs: list[list[int]], tokens: torch.Tensor, g: list[int],
            settings: LiveSettings) -> tuple[torch.Tensor, float]:
    """The target scores every sequence's pending tokens (the prompt at the first step, then the last token) and
    draft in one pass: p_rows [B, G + 1, V], row j of a sequence being p_{j+1} (rows past its own g + 1 repeat its
    last), and the pass's wall time (ms)."""
    width = tokens.shape[1]
    t0 = time.perf_counter()
    pending = [s[n:] + d[:m] for s, n, d, m in zip(seqs, target.lengths, tokens.tolist(), g, strict=True)]
    logits = target.forward(pending, last=width + 1)
    target_ms = (time.perf_counter() - t0) * 1000
    p_all = distribution(logits, settings.temperature, settings.top_p)
    # a sequence's chunk ends in the last column (padding first): its rows start at width - g
    index = ((width - torch.tensor(g))[:, None] + torch.arange(width + 1)[None, :]).clamp(max=width)
    return p_all.gather(1, index[..., None].expand(-1, -1, p_all.shape[-1])), target_ms


def _emitted(draft: list[int], accepted: int, nxt: int, produced: int, settings: LiveSettings,
             eos: int | None) -> tuple[list[int], bool]:
    """The tokens a step emits for one sequence (up to EOS and max_new_tokens), and whether the sequence is done."""
    emitted = draft[:accepted] + [nxt]
    stop = eos in emitted or produced + len(emitted) >= settings.max_new_tokens
    if eos in emitted:
        emitted = emitted[:emitted.index(eos) + 1]
    return emitted[:settings.max_new_tokens - produced], stop


def speculative_decode(pair: Pair, prompts: Sequence[str], settings: LiveSettings, *, seed: int | None = None,
                       log: bool = True, pit: bool = False, request_ids: Sequence[str] | None = None,
                       template: str | None = None) -> BatchRun:
    """Speculative decoding of all prompts at once under settings (k, max_new_tokens, temperature, top_p; n-gram
    lookup where the pair has no draft model), each sequence accepting its own prefix at every step.

    log=True keeps a step-log record per sequence and step (beta and logprobs as a single-sequence live run logs
    them; the target and draft times are those of the batch's passes); pit=True keeps every emitted token's PIT
    ingredients, by position."""
    if settings.k < 1:
        raise SpecmonError(f"k must be at least 1, got {settings.k}")
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(settings.seed if seed is None else seed)
    seqs = [pair.tokenizer(p)["input_ids"] for p in prompts]
    _check_lengths(pair, seqs, settings)
    ids = list(request_ids) if request_ids is not None else [f"s{i:03d}" for i in range(len(seqs))]
    eos = pair.tokenizer.eos_token_id
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    # The first step feeds each model the whole prompt (left-padded), as the single-sequence loop does; after
    # each step both caches hold all of each sequence but its last token.
    caches = [BatchCache(model, len(seqs)) for model in (pair.target, pair.draft) if model is not None]
    target, draft = caches[0], caches[1] if len(caches) > 1 else None
    run = BatchRun([[] for _ in seqs])
    rows = list(range(len(seqs)))  # the prompt index of each row in flight
    while rows:
        tokens, q_rows, g, draft_ms = _propose(pair, seqs, draft, settings, gen, vocab)
        p_rows, target_ms = _verify(target, seqs, tokens, g, settings)
        accepted, nxt = _accept(tokens, p_rows, q_rows, g, settings.temperature, gen)
        run.draft_ms += draft_ms
        run.target_ms.append(target_ms)
        run.batch_sizes.append(len(rows))
        drafts = tokens.tolist()
        steps = [_emitted(drafts[r][:g[r]], a, x, len(run.tokens[i]), settings, eos)
                 for r, (i, a, x) in enumerate(zip(rows, accepted.tolist(), nxt.tolist(), strict=True))]
        if log:
            t_log = time.perf_counter()
            ts = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            common = {"ts": ts, "k": settings.k, "temperature": settings.temperature, "target_ms": round(target_ms, 3),
                      "draft_ms": [round(t, 3) for t in draft_ms]} | ({"template": template} if template else {})
            for r, fields in enumerate(_log_fields(p_rows, q_rows, g)):
                run.records.append({"request_id": ids[rows[r]], **common, "draft_tokens": drafts[r][:g[r]],
                                    "accepted": int(accepted[r]), "emitted_tokens": steps[r][0], **fields})
            run.logging_ms += (time.perf_counter() - t_log) * 1000
        if pit:  # token j of a step was drawn from p_{j+1}
            run.pit += [(j + 1, float(p_rows[r, j, :t].sum()), float(p_rows[r, j, t]))
                        for r, (emitted, _) in enumerate(steps) for j, t in enumerate(emitted)]
        for r, ((emitted, _), a) in enumerate(zip(steps, accepted.tolist(), strict=True)):
            run.accepted += a
            run.drafted += g[r]
            run.checked += min(a + 1, g[r])
            run.tokens[rows[r]] += emitted
            seqs[r] = seqs[r] + emitted
        # Crop each sequence's caches to its accepted prefix: both then hold all of it but its last token.
        target.keep([len(s) - 1 for s in seqs])
        if draft is not None:
            draft.keep([min(n, len(s) - 1) for n, s in zip(draft.lengths, seqs, strict=True)])
        still = [r for r, (_, stop) in enumerate(steps) if not stop]
        if len(still) < len(rows):
            if still:
                for cache in caches:
                    cache.select(still)
            rows, seqs = [rows[r] for r in still], [seqs[r] for r in still]
    run.steps = len(run.target_ms)
    run.seconds = time.perf_counter() - started
    return run
