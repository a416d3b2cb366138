"""Losslessness of speculative decoding, checked on a pair: greedy speculative decoding (draft model and n-gram
lookup) must emit exactly the target's own greedy decoding of each prompt alone, and sampled tokens must follow the
target's distribution (the randomized PIT against U(0, 1), KS test).

One sequence at a time (concurrency None: specmon.pair.live's loop) or N at once (specmon.pair.batched), where each
sequence's tokens are still compared with that prompt decoded alone: a batch whose caches, masks or positions went
out of step shows as a sequence that differs. At batch N the PIT is also tested per draft position (the tokens drawn
from each verification row), where a wrong crop or position shows first.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import cycle, islice

import numpy as np

from specmon.core import stats
from specmon.core.settings import KS_LEVEL, LiveSettings
from specmon.pair import batched, live
from specmon.pair.live import Pair


@dataclass(frozen=True)
class Mismatch:
    proposer: str
    prompt: int  # index into the prompts
    sequence: int | None  # the row of its batch (None: decoded alone)
    first: int  # the first token where speculative and plain greedy decoding differ


@dataclass(frozen=True)
class GreedyCheck:
    proposer: str
    sequences: int
    matched: int

    @property
    def ok(self) -> bool:
        return self.matched == self.sequences


@dataclass(frozen=True)
class PitCheck:
    """The randomized PIT of sampled tokens, all of them (position None) or those drawn at one draft position, and
    its KS test at `level`."""
    position: int | None
    tokens: int
    ks: stats.TestResult
    level: float
    bonus: bool = False  # position k + 1: the tokens drawn after a fully accepted draft

    @property
    def what(self) -> str:
        if self.position is None:
            return "all tokens"
        return f"bonus tokens (position {self.position})" if self.bonus else f"tokens at draft position {self.position}"

    @property
    def ok(self) -> bool:
        # the Losslessness page's verdict (analysis.lossless.consistent): p below the level fails
        return self.ks.pvalue >= self.level


@dataclass(frozen=True)
class Verification:
    concurrency: int | None
    temperature: float
    greedy: list[GreedyCheck]
    mismatches: list[Mismatch]
    pit: list[PitCheck]  # overall first, then per position (at batch N only)

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.greedy) and all(p.ok for p in self.pit)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _batches(n: int, size: int) -> list[list[int]]:
    """Prompt indices in batches of `size`, the last filled up by cycling from the first prompt, so every batch
    holds `size` sequences."""
    out = []
    for start in range(0, n, size):
        chunk = list(range(start, min(start + size, n)))
        out.append(chunk + list(islice(cycle(range(n)), size - len(chunk))))
    return out


def _pit_checks(pit: Sequence[tuple[int, float, float]], seed: int, level: float, k: int | None) -> list[PitCheck]:
    """The overall test at level; per position (Bonferroni: level / positions each, so the family's false alarm rate
    stays within level), where k is given."""
    if not pit:
        return []
    position, below, mass = (np.array(col) for col in zip(*pit, strict=True))
    u = stats.randomized_pit_of(below, mass, np.random.default_rng(seed))
    checks = [PitCheck(None, len(u), stats.uniformity_ks(u), level)]
    if k is not None:
        positions = sorted(set(position.tolist()))
        checks += [PitCheck(int(j), int((position == j).sum()), stats.uniformity_ks(u[position == j]),
                            level / len(positions), j == k + 1) for j in positions]
    return checks


def verify(pair: Pair, prompts: Sequence[str], settings: LiveSettings, *, temperature: float = 1.0,
           level: float = KS_LEVEL, concurrency: int | None = None,
           progress: Callable[[], None] | None = None) -> Verification:
    """Greedy exactness for both proposers and the sampled PIT (draft model, at `temperature`) on every prompt;
    settings gives k, the new tokens per prompt and the seed (prompt i is seeded with seed + i when decoded alone,
    batch j with seed + j). progress() is called after each decode (decodes() says how many)."""
    greedy = replace(settings, temperature=0.0, top_p=None)
    proposers = {"draft model": pair, "n-gram": Pair(pair.target, None, pair.tokenizer, "ngram")}
    tick = progress or (lambda: None)
    checks, mismatches = [], []
    pit: list[tuple[int, float, float]] = []
    sampled = replace(greedy, temperature=temperature)
    if concurrency is None:
        for name, use in proposers.items():
            matched = 0
            for i, prompt in enumerate(prompts):
                spec = [t for step in live.generate(use, prompt, greedy) for t in step.record["emitted_tokens"]]
                plain = live.target_decode(use, prompt, greedy.max_new_tokens)
                tick()
                if spec == plain:
                    matched += 1
                else:
                    mismatches.append(Mismatch(name, i, None, first_difference(spec, plain)))
            checks.append(GreedyCheck(name, len(prompts), matched))
        for i, prompt in enumerate(prompts):
            for step in live.generate(pair, prompt, replace(sampled, seed=sampled.seed + i)):
                pit += [(0, below, mass) for below, mass in step.pit]
            tick()
        return Verification(None, temperature, checks, mismatches, _pit_checks(pit, sampled.seed, level, None))
    alone = []
    for prompt in prompts:
        alone.append(live.target_decode(pair, prompt, greedy.max_new_tokens))
        tick()
    batches = _batches(len(prompts), concurrency)
    for name, use in proposers.items():
        matched = total = 0
        for batch in batches:
            run = batched.speculative_decode(use, [prompts[i] for i in batch], greedy, log=False)
            tick()
            for row, (i, tokens) in enumerate(zip(batch, run.tokens, strict=True)):
                total += 1
                if tokens == alone[i]:
                    matched += 1
                else:
                    mismatches.append(Mismatch(name, i, row, first_difference(tokens, alone[i])))
        checks.append(GreedyCheck(name, total, matched))
    for j, batch in enumerate(batches):
        run = batched.speculative_decode(pair, [prompts[i] for i in batch], sampled, seed=sampled.seed + j,
                                         log=False, pit=True)
        pit += run.pit
        tick()
    return Verification(concurrency, temperature, checks, mismatches, _pit_checks(pit, sampled.seed, level, sampled.k))


def decodes(prompts: int, concurrency: int | None) -> int:
    """How many times verify calls progress(): alone, three decodes per prompt; at batch N, the target alone once per
    prompt and three batched decodes per batch."""
    return 3 * prompts if concurrency is None else prompts + 3 * len(_batches(prompts, concurrency))
