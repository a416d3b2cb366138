"""A live load sweep: speculative decoding of a local pair at several batch sizes and draft lengths against plain
batched target decoding, in one process, stored as a run (every step) and a load sweep (a throughput per run).

Every run of a cell decodes the whole prompt set in batches of B (the set cycled up to a whole number of batches,
so batch 32 decodes each of 16 prompts twice): every batch size sees the same prompts, and the curve shows what the
batch changes, not which prompts it drew. Per repeat and batch size, the baseline (plain batched decoding) runs
first and then speculative decoding of the same batches at every k, so that each speedup compares runs close in
time; the repeats give each (k, B) an interval (specmon.core.load.speedup, as the Load page computes it). A batch
is static: its B sequences start together and each leaves when it is done, as when a benchmark sends B requests at
once; speculation's batch thins out towards its end (sequences finish at different steps), which `mean_batch`
shows.
"""
from __future__ import annotations

import csv
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import cycle, islice
from typing import IO

import numpy as np

from specmon.core import load
from specmon.core.faults import SpecmonError
from specmon.core.sampler import write_step_log
from specmon.core.settings import LIVE_DEFAULTS, SWEEP_DEFAULTS, LiveSettings, SweepSettings
from specmon.ingest.formats.load_sweep import COLUMNS
from specmon.ingest.pipeline import IngestResult, ingest_file
from specmon.pair import batched
from specmon.pair.live import Pair

# progress(done, total, what): runs done of all, and the one starting, in words
SweepProgress = Callable[[int, int, str], None]
_WARM_UP_TOKENS = 8


def sweep_name(pair: Pair, settings: LiveSettings) -> str:
    """The default name of a live sweep: the pair and the temperature (its k and batch sizes are its segments)."""
    return f"live sweep {pair.name} T={settings.temperature:g}"


def cell_name(template: str, k: int, concurrency: int) -> str:
    """The segment (template) of one cell's steps: "copy, k=2, batch 8"."""
    return f"{template}, k={k}, batch {concurrency}"


def batches(prompts: Sequence[str], concurrency: int) -> list[list[str]]:
    """The prompt set in batches of `concurrency`, cycled up to a whole number of batches."""
    if not prompts:
        raise SpecmonError("no prompts")
    n = -(-len(prompts) // concurrency) * concurrency
    every = list(islice(cycle(prompts), n))
    return [every[i:i + concurrency] for i in range(0, n, concurrency)]


@dataclass(frozen=True)
class Measurement:
    """One run of one cell: k = 0 is plain batched decoding (the baseline)."""
    k: int
    concurrency: int
    repeat: int
    output_tokens: int
    seconds: float
    steps: int
    accepted: int
    drafted: int
    checked: int
    mean_batch: float  # sequences in flight per target pass
    draft_step_ms: float | None  # median batched draft pass (n-gram: one proposal for the batch)
    target_step_ms: float  # median target pass: a decode step (k = 0) or a verification pass
    logging_ms: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    def row(self, run: str) -> dict:
        """The measurement as a row of the load-sweep table (specmon.ingest.formats.load_sweep)."""
        spec = self.k > 0
        return {"run": run, "k": self.k, "concurrency": self.concurrency, "repeat": self.repeat,
                "output_tokens": self.output_tokens, "duration_s": repr(self.seconds),
                "output_tokens_per_s": repr(self.tokens_per_s), "accepted_tokens": self.accepted if spec else "",
                "draft_tokens": self.drafted if spec else "", "emitted_tokens": self.output_tokens if spec else ""}


def _measure(k: int, concurrency: int, repeat: int, runs: Sequence[batched.BatchRun]) -> Measurement:
    """One measurement from the batches of one run of a cell."""
    draft = [t for r in runs for t in r.draft_ms]
    target = [t for r in runs for t in r.target_ms]
    sizes = [b for r in runs for b in r.batch_sizes]
    return Measurement(k, concurrency, repeat, sum(r.output_tokens for r in runs), sum(r.seconds for r in runs),
                       sum(r.steps for r in runs), sum(r.accepted for r in runs), sum(r.drafted for r in runs),
                       sum(r.checked for r in runs), float(np.mean(sizes)) if sizes else float(concurrency),
                       float(np.median(draft)) if draft else None,
                       float(np.median(target)) if target else sum(r.seconds for r in runs) * 1000,
                       sum(r.logging_ms for r in runs))


def run_sweep(pair: Pair, prompts: Sequence[str], settings: LiveSettings = LIVE_DEFAULTS,
              sweep: SweepSettings = SWEEP_DEFAULTS, *, template: str, log_out: IO[bytes] | None = None,
              progress: SweepProgress | None = None) -> list[Measurement]:
    """Every (k, B) cell and its baseline, repeat after repeat; each speculative run's step records (template: the
    cell, request: the sequence) are written to log_out as they come. progress may raise to stop the sweep
    between runs."""
    if not sweep.concurrency or not sweep.ks or sweep.repeats < 1:
        raise SpecmonError("a sweep needs at least one batch size, one k and one repeat")
    if min(sweep.concurrency) < 1 or min(sweep.ks) < 1:
        raise SpecmonError("batch sizes and draft lengths must be at least 1")
    concurrency, ks = sorted(set(sweep.concurrency)), sorted(set(sweep.ks))
    warm = replace(settings, k=max(ks), max_new_tokens=_WARM_UP_TOKENS)
    batched.plain_decode(pair, prompts[:1], warm)  # first calls allocate and load the kernels
    batched.speculative_decode(pair, prompts[:1], warm, log=False)
    total, done = sweep.repeats * len(concurrency) * (1 + len(ks)), 0
    out: list[Measurement] = []

    def starting(what: str) -> None:
        if progress:
            progress(done, total, what)

    for repeat in range(sweep.repeats):
        for b in concurrency:
            work = batches(prompts, b)
            seeds = [settings.seed + 1000 * repeat + j for j in range(len(work))]
            starting(f"repeat {repeat + 1} of {sweep.repeats}: {template}, plain decoding, batch {b}")
            out.append(_measure(0, b, repeat, [batched.plain_decode(pair, batch, settings, seed=seed)
                                               for batch, seed in zip(work, seeds, strict=True)]))
            done += 1
            for k in ks:
                name = cell_name(template, k, b)
                starting(f"repeat {repeat + 1} of {sweep.repeats}: {name}")
                runs = []
                for j, (batch, seed) in enumerate(zip(work, seeds, strict=True)):
                    runs.append(batched.speculative_decode(
                        pair, batch, replace(settings, k=k), seed=seed, log=log_out is not None, template=name,
                        request_ids=[f"k{k}-b{b}-r{repeat}-s{j * b + i:03d}" for i in range(b)]))
                    if log_out is not None:
                        write_step_log(iter(runs[-1].records), log_out)
                        runs[-1].records.clear()  # written: a sweep's records would fill memory
                out.append(_measure(k, b, repeat, runs))
                done += 1
    starting("done")
    return out


@dataclass(frozen=True)
class CurvePoint:
    """One (k, B) cell over its repeats: the speedup over plain decoding at B with its interval, the acceptance
    rate alpha (accepted / checked drafted positions), and the costs at B."""
    k: int
    concurrency: int
    speedup: load.Speedup
    tokens_per_s: float  # mean over repeats
    baseline_tokens_per_s: float
    alpha: float | None
    tokens_per_step: float  # per sequence and verification pass
    c: float | None  # median draft pass / median plain decode step at B
    draft_step_ms: float | None
    target_step_ms: float  # plain decode step at B
    verify_ms: float
    mean_batch: float
    logging_share: float  # of the speculative runs' wall time


def curve(measurements: Sequence[Measurement]) -> list[CurvePoint]:
    """The measured speedup curve: one point per (k, B), in k then B order."""
    base = {b: [m for m in measurements if m.k == 0 and m.concurrency == b]
            for b in {m.concurrency for m in measurements}}
    points = []
    for k, b in sorted({(m.k, m.concurrency) for m in measurements if m.k > 0}):
        spec = [m for m in measurements if m.k == k and m.concurrency == b]
        if not base[b]:
            continue
        checked, steps = sum(m.checked for m in spec), sum(m.steps * m.mean_batch for m in spec)
        draft = [m.draft_step_ms for m in spec if m.draft_step_ms is not None]
        target = float(np.median([m.target_step_ms for m in base[b]]))
        draft_ms = float(np.median(draft)) if draft else None
        points.append(CurvePoint(
            k, b, load.speedup([m.tokens_per_s for m in spec], [m.tokens_per_s for m in base[b]]),
            float(np.mean([m.tokens_per_s for m in spec])), float(np.mean([m.tokens_per_s for m in base[b]])),
            sum(m.accepted for m in spec) / checked if checked else None,
            sum(m.output_tokens for m in spec) / steps if steps else 0.0,
            draft_ms / target if draft_ms is not None and target > 0 else None, draft_ms, target,
            float(np.median([m.target_step_ms for m in spec])), float(np.mean([m.mean_batch for m in spec])),
            sum(m.logging_ms for m in spec) / 1000 / sum(m.seconds for m in spec)))
    return points


def crossings(points: Sequence[CurvePoint]) -> dict[int, load.Crossing]:
    """Per k, where its speedup curve crosses 1 (the break-even batch size), as the Load page finds it."""
    out = {}
    for k in sorted({p.k for p in points}):
        mine = sorted((p for p in points if p.k == k), key=lambda p: p.concurrency)
        out[k] = load.crossing([p.concurrency for p in mine], [p.speedup for p in mine])
    return out


def sweep_meta(points: Sequence[CurvePoint], template: str, sweep: SweepSettings) -> dict:
    """What the run's meta keeps of the sweep: its settings and each cell's measured costs."""
    return {"concurrency": sorted(set(sweep.concurrency)), "k": sorted(set(sweep.ks)), "repeats": sweep.repeats,
            "costs": {cell_name(template, p.k, p.concurrency): {
                "draft_step_ms": p.draft_step_ms, "target_step_ms": p.target_step_ms, "verify_ms": p.verify_ms,
                "c": p.c, "mean_batch": p.mean_batch} for p in points}}


def write_sweep(measurements: Sequence[Measurement], run: str, out: IO[str]) -> None:
    """The measurements as a load-sweep CSV."""
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(m.row(run) for m in measurements)


@dataclass(frozen=True)
class SweepRun:
    run: str
    template: str
    measurements: list[Measurement]
    points: list[CurvePoint]
    crossings: dict[int, load.Crossing]
    steps: int
    seconds: float
    ingest: IngestResult  # the step log
    sweep_ingest: IngestResult  # the load sweep


def _ingest(store, path: str, **kwargs) -> IngestResult:
    result = ingest_file(store, path, **kwargs)
    if result.status == "rejected":
        raise SpecmonError(f"the live sweep's {kwargs['name']} did not validate: "
                           + "; ".join(map(str, result.faults[:3])))
    return result


def record_sweep(store, pair: Pair, prompts: Sequence[str], settings: LiveSettings = LIVE_DEFAULTS,
                 sweep: SweepSettings = SWEEP_DEFAULTS, *, run: str, template: str, meta: dict,
                 keep_log: str | None = None, progress: SweepProgress | None = None) -> SweepRun:
    """Run the sweep and store it: every speculative step as the run's step log (one segment per cell), then the
    throughputs as a load sweep into the same run (k = 0: the baseline). Nothing is stored if it stops early."""
    fd, log_path = tempfile.mkstemp(prefix="specmon-sweep-", suffix=".jsonl")
    sweep_path = log_path[:-len(".jsonl")] + ".csv"
    started = time.perf_counter()
    try:
        with os.fdopen(fd, "wb") as out:
            measurements = run_sweep(pair, prompts, settings, sweep, template=template, log_out=out,
                                     progress=progress)
        seconds = time.perf_counter() - started
        points = curve(measurements)
        with open(sweep_path, "w", encoding="utf-8", newline="") as fh:
            write_sweep(measurements, run, fh)
        if keep_log:
            with open(log_path, "rb") as src, open(keep_log, "wb") as dst:
                dst.write(src.read())
        steps = _ingest(store, log_path, name=f"live sweep steps ({len(prompts)} prompts)", run=run,
                        run_meta=json.dumps({**meta, "sweep": sweep_meta(points, template, sweep)}))
        loads = _ingest(store, sweep_path, name=f"live load sweep ({len(measurements)} runs)", run=run,
                        template=template)
    finally:
        for path in (log_path, sweep_path):
            if os.path.exists(path):
                os.unlink(path)
    return SweepRun(run, template, measurements, points, crossings(points), steps.steps, seconds,
                    steps, loads)
