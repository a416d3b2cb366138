"""The `specmon` command line: ingest, summary, check, theory, simulate, demo, serve.

Exit codes: 0 success; 1 the data says no (a file rejected, a segment at risk or losing); 2 an error
(bad arguments, unreadable database, nothing to judge).

A command imports the modules it needs (numpy, DuckDB and the store; pandas through summaries, alarms, readers and
the demo) when it runs, so `specmon serve` starts the dashboard without loading them first (tests/cli/test_cli.py holds
that).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from specmon import __version__
from specmon.core import display, resources, times
from specmon.core.faults import SpecmonError
from specmon.core.settings import (
    DB_ENV,
    DEFAULT_ARL0_STEPS,
    DEFAULT_DB,
    DEFAULT_LOCK_TIMEOUT_S,
    DEFAULT_SUM_TOLERANCE,
    DISTRIBUTION_MODES,
    GROUPINGS,
    KS_LEVEL,
    LIVE_DEFAULTS,
    LOCK_TIMEOUT_ENV,
    PULL_REQUEST_TIMEOUT_S,
    PULL_TIMEOUT_S,
    THEORY_K_MAX,
    WINDOW_BANDWIDTH_SECONDS,
    LiveSettings,
)
from specmon.core.text import printable
from specmon.ingest import formats

if TYPE_CHECKING:
    import numpy as np

    from specmon.ingest.pipeline import IngestResult
    from specmon.store.database import Store

EXIT_OK, EXIT_FINDING, EXIT_ERROR = 0, 1, 2
_PAPER_P = "0.38,0.22,0.16,0.12,0.08,0.04"
_PAPER_Q = "0.30,0.20,0.20,0.10,0.14,0.06"


def _out(line: str) -> None:
    """One line on stdout; names in it cannot drive the terminal (control characters escaped)."""
    print(printable(line))


def _err(msg: str) -> None:
    print(f"specmon: {printable(msg)}", file=sys.stderr)


def _open_store(args: argparse.Namespace, *, with_demo: bool = False, create: bool = True) -> Store:
    """The database of --db; create=False for a command that only reads it: a path that does not exist (a typo)
    is an error, not a new database left behind. A full disk, a damaged file or an unwritable folder is a
    SpecmonError from the Store, whichever command meets it."""
    from specmon.ingest import demo
    from specmon.store.database import Store

    store = Store(args.db, lock_timeout=args.lock_timeout, create=create)
    if with_demo and not args.no_demo and demo.ensure_demo(store):
        _err(f"{store.path} was empty: loaded the demo data (run {demo.DEMO_RUN!r}); it hides once you ingest a log")
    return store


def _progress_bar(label: str):
    from tqdm import tqdm

    bar = tqdm(total=0, unit="B", unit_scale=True, desc=label, file=sys.stderr, leave=False, disable=None)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    def stage(what: str) -> None:  # the steps after the reading, which a full bar would hide
        bar.set_description(f"{label}: {what}")

    return bar, update, stage


def cmd_ingest(args: argparse.Namespace) -> int:
    from specmon.core.limits import MAX_ENGINE_K

    if args.k is not None and not 0 <= args.k <= MAX_ENGINE_K:
        raise SpecmonError(f"--k: {args.k} is not a draft length from 0 (speculation off) to {MAX_ENGINE_K}")
    if args.baseline_of and args.k:
        raise SpecmonError(f"--baseline-of {args.baseline_of!r} says the run served without speculation, and "
                           f"--k {args.k} that it drafted {args.k} tokens a step: give one of them")
    status = EXIT_OK
    stored: list[str] = []
    with _open_store(args) as store:
        for path in args.paths:
            name = "<stdin>" if path == "-" else path
            result = _ingest_one(store, path, name, args)
            if args.json:
                print(json.dumps(result.as_dict()))  # JSON escapes control characters itself
            else:
                _say_ingested(name, result)
            if result.status == "rejected":
                status = EXIT_FINDING
                _say_rejected(name, result)
            elif result.status == "stored" and result.kind != "sweep" and result.run not in stored:
                stored.append(result.run)
            for note in result.notes:
                _err(f"{name}: note: {note}")
        if stored and not args.no_drift:
            _prepare_drift(store, stored, args)
    return status


def _prepare_drift(store: Store, runs: list[str], args: argparse.Namespace) -> None:
    """Bring the drift detectors of the runs just stored up to date (thresholds calibrated for any reference the new
    data fills; a step log's state advanced from the steps after the kept one), kept in the database so that `check`
    with the same --c and --false-alarm-steps reads them instead of calibrating. Load sweeps have no detector. The
    data is stored already: a failure here is a note, not a failed ingest."""
    from specmon.drift import alarms

    try:
        alarms.analyse(store, args.c, args.false_alarm_steps, runs, progress=_err)
    except SpecmonError as e:
        _err(f"the drift detector was not brought up to date ({e}); `specmon check` will do it")


def _ingest_one(store: Store, path: str, name: str, args: argparse.Namespace) -> IngestResult:
    """One file (or standard input, path "-") through the ingest, with a progress bar on stderr."""
    from specmon.ingest.pipeline import ingest_file, ingest_stream

    bar, update, stage = _progress_bar(Path(name).name)
    options = dict(run=args.run or ("stdin" if path == "-" else None), template=args.template,
                   skip_bad=args.skip_bad, report_path=args.report, fmt=args.format, sum_tol=args.sum_tol,
                   progress=update, stage=stage, baseline_of=args.baseline_of, k=args.k)
    try:
        if path == "-":
            return ingest_stream(store, sys.stdin.buffer, name, **options)
        return ingest_file(store, path, **options)
    finally:
        bar.close()


def _say_ingested(name: str, result: IngestResult) -> None:
    if result.status == "stored":
        rejected = f"; {result.rejected} rows rejected, see {result.report_path}" if result.rejected else ""
        _out(f"{name}: stored {result.stored_what()} in run {result.run!r}{rejected}")
    elif result.status == "already ingested":
        _out(f"{name}: already ingested (same content); nothing changed")
    elif result.status == "nothing to ingest":
        _out(f"{name}: empty, nothing to ingest; nothing changed")


def _say_rejected(name: str, result: IngestResult) -> None:
    _err(f"{name}: rejected, nothing stored ({result.fault_count} fault(s); "
         "fix them, or pass --skip-bad to store the good rows)")
    for fault in result.faults:
        _err(f"  {fault}")
    if result.fault_count > len(result.faults):
        _err(f"  ... and {result.fault_count - len(result.faults)} more")


def _json_scalar(value: object) -> object:
    """numpy scalars as plain Python numbers in JSON output."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return display.number(x, spec)


def _print_table(rows: list[dict]) -> None:
    head = ("run", "template", "day", "k", "steps", "alpha [95% CI]", "beta", "L", "c", "alpha*", "1+gc", "status")
    table = [head]
    for r in rows:
        beta = display.beta(r["beta"], r["beta_lo"], r["beta_hi"])
        table.append((
            printable(r["run"]), printable(r["template"] or "-"), r["day"] or "-", str(r["k"] or "-"),
            str(r["steps"]),
            f"{_fmt(r['alpha'])} {display.interval(r['alpha_lo'], r['alpha_hi'], missing='[-,-]')}", beta,
            _fmt(r["tokens_per_step"], ".2f"),
            _fmt(r["c"]), _fmt(r["break_even_alpha"]), _fmt(r["break_even_tokens"], ".2f"), r["status"],
        ))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        _out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_summary(args: argparse.Namespace) -> int:
    from specmon.analysis import summary
    from specmon.ingest import demo

    with _open_store(args, with_demo=True, create=False) as store:
        rows = summary.summarize(store, by=args.by, c=args.c)
    demo_only = bool(rows) and rows[0]["demo"]  # summarize shows demo rows only while nothing else is stored
    if args.json:
        print(json.dumps(rows, indent=2))  # every demo segment carries "demo": true
    elif not rows:
        _out("no data: ingest a step log first (specmon ingest FILE)")
    else:
        if demo_only:
            _out(f"DEMO DATA, not yours: {store.path} holds nothing of your own yet, so these are the synthetic "
                 f"demo figures (run {demo.DEMO_RUN!r}). They hide once you ingest a log.")
        _print_table(rows)
        print("alpha: per-token acceptance, 95% interval with requests as clusters, or engine "
              f"windows paired up to {WINDOW_BANDWIDTH_SECONDS / 60:g} minutes apart or more (docs/math.md). "
              "beta: predicted acceptance (an interval where only top-k logprobs were logged). "
              "L: tokens per step. alpha*, 1+gc: break-even, in alpha and in L (g: the mean draft length).")
    return EXIT_OK


def parse_since(text: str | None, flag: str = "--since") -> datetime | None:
    """'6h', '2d', '30m', '1w' before now, or an ISO-8601 time (UTC where it names no zone)."""
    if text is None:
        return None
    ts = times.parse_since(text)
    if ts is None:
        raise SpecmonError(f"{flag}: {text!r} is neither a duration like 6h, 2d, 30m nor an ISO-8601 time")
    return ts


def cmd_check(args: argparse.Namespace) -> int:
    from specmon.verdicts import findings

    since = parse_since(args.since)
    with _open_store(args, create=False) as store:
        verdict = findings.gather(store, since=since, c=args.c, arl0_steps=args.false_alarm_steps, progress=_err)
    if verdict.demo_only:
        window = f" since {since:%Y-%m-%d %H:%M} UTC" if since else ""
        _err(f"nothing of yours to judge: {store.path} holds no steps of your own{window}"
             + (" (only the demo data)" if verdict.segments else "") + " (specmon ingest FILE)")
        return EXIT_ERROR
    if args.json:
        print(json.dumps(verdict.to_json(), indent=2, default=_json_scalar))
    else:
        for f in verdict.problems:
            print(f.headline)
    for row, why in verdict.unknown:
        _err(f"cannot judge run {row['run']!r}, template {row['template'] or '-'!r}: {why}"
             + ("; pass --c" if row["c"] is None else ""))
    if verdict.problems:
        return EXIT_FINDING
    if verdict.unknown:
        return EXIT_ERROR
    if not args.json:
        print(f"all {len(verdict.segments)} segment(s) healthy: acceptance above break-even, no drift alarm, "
              "no template change that hurt")
    return EXIT_OK


def cmd_recommend(args: argparse.Namespace) -> int:
    from specmon.analysis import load
    from specmon.verdicts.recommend import recommend

    with _open_store(args, create=False) as store:
        curves = load.curves(store, args.run)
    if args.run and not curves:
        _err(f"{store.path}: run {args.run!r} has no load measurements (load sweeps, benchmark results, or engine "
             "windows with their running requests): see specmon summary for its runs")
        return EXIT_ERROR
    advice = [recommend(c) for c in curves]
    if args.json:
        print(json.dumps([{**c.to_dict(), **a.to_dict()} for c, a in zip(curves, advice, strict=True)], indent=2,
                         default=_json_scalar))
        return EXIT_OK
    if not curves:
        _out(f"{store.path}: no run measured load; ingest a load sweep, a `vllm bench serve` result, or engine logs "
             "with their load lines, with a baseline without speculation")
        return EXIT_OK
    for c, a in zip(curves, advice, strict=True):
        _out(f"run {c.run!r}: {a.words}")
        for p in c.points:
            s = p.speedup
            interval = f" [95% CI {s.lo:.2f}, {s.hi:.2f}]" if s.lo is not None and s.hi is not None else \
                " (no interval: one measurement)"
            k = "k = ?" if p.k is None else f"k = {p.k}"
            _out(f"  {k}, N = {p.concurrency:g}: speedup {s.estimate:.2f}{interval}, {p.throughput:,.0f} against "
                 f"{p.baseline_throughput:,.0f} tokens/s")
        if c.known:
            _out(f"  baseline: {c.baseline}; intervals from {c.observations}")
            _out(f"  certainty: {a.certainty}; assumes {'; '.join(a.assumes)}")
        for engine, text in a.engines.items():
            _out(f"  {engine}:")
            for line in text.splitlines():
                _out(f"    {line}")
    return EXIT_OK


def cmd_annotate(args: argparse.Namespace) -> int:
    from specmon.drift import alarms

    at = parse_since(args.at, "--at") or times.utc_now()
    if args.speculation:
        with _open_store(args) as store:
            period_id = alarms.annotate_speculation(store, args.run, args.speculation == "on", at, args.note)
        if args.speculation == "off":
            print(f"period {period_id}: run {args.run!r} served without speculation from {at:%Y-%m-%d %H:%M:%S} UTC "
                  "until its next `--speculation on`; its windows there are the run's baseline at each load "
                  "(`specmon recommend`, the Load page)")
        else:
            print(f"period {period_id}: run {args.run!r} served with speculation again from "
                  f"{at:%Y-%m-%d %H:%M:%S} UTC")
        return EXIT_OK
    with _open_store(args) as store:
        annotation_id = alarms.annotate(store, args.run, args.template, at, args.note)
    print(f"annotation {annotation_id}: run {args.run!r} rolled out template {args.template!r} at "
          f"{at:%Y-%m-%d %H:%M:%S} UTC; `specmon check` and the Drift page now compare before and after it")
    return EXIT_OK


def _duration_seconds(text: str, flag: str) -> float:
    try:
        span = times.parse_duration(text)
    except OverflowError:
        span = None
    if span is None or span.total_seconds() <= 0:
        raise SpecmonError(f"{flag}: {text!r} is not a duration like 30s, 1m, 6h or 2d")
    return span.total_seconds()


def cmd_pull(args: argparse.Namespace) -> int:
    from specmon.follow import prometheus_api
    from specmon.ingest.pipeline import ingest_samples

    end = times.utc_now()
    since_s = _duration_seconds(args.since, "--since")
    if since_s > (end - datetime(1970, 1, 1)).total_seconds():
        raise SpecmonError(f"--since: {args.since!r} reaches back before 1970")
    start = end - timedelta(seconds=since_s)
    samples = prometheus_api.pull(args.prometheus, start, end, _duration_seconds(args.step, "--step"),
                              timeout_s=args.timeout, total_timeout_s=args.total_timeout)
    if not samples:
        _err(f"{args.prometheus}: no vllm:/llamacpp: spec_decode counters, sglang:spec_ gauges or engine load series "
             f"since {args.since}")
        return EXIT_FINDING
    with _open_store(args) as store:
        result = ingest_samples(store, samples, f"{args.prometheus} since {args.since}", args.run, args.template,
                                baseline_of=args.baseline_of)
    if result.status == "already ingested":
        _out(f"{args.prometheus}: nothing new since the last pull")
    else:
        _out(f"{args.prometheus}: stored {result.steps} new samples of {len(samples)} in run {args.run!r}"
             + (f", the baseline of run {args.baseline_of!r}" if args.baseline_of else ""))
    return EXIT_OK


def _metrics_flags(p: argparse.ArgumentParser, port: bool = True) -> None:
    from specmon.core.settings import DEFAULT_METRICS_RUNS, METRICS_RUNS_ENV

    if port:
        p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve specmon's own Prometheus series at "
                       "http://ADDRESS:PORT/metrics")
        p.add_argument("--metrics-address", default="127.0.0.1", help="address for --metrics-port (default "
                       "127.0.0.1: this machine only)")
    p.add_argument("--metrics-runs", type=_positive_int, metavar="N", help="/metrics exports the N runs with the "
                   f"most recent data (default ${METRICS_RUNS_ENV} or {DEFAULT_METRICS_RUNS})")


def cmd_watch(args: argparse.Namespace) -> int:
    from specmon.follow.config import SourceConfig, WatchConfig, load_config
    from specmon.follow.watcher import Watcher

    config = load_config(args.config) if args.config else WatchConfig()
    if args.baseline_of and args.baseline_of == args.run:
        raise SpecmonError(f"--baseline-of: run {args.run!r} cannot be its own baseline; give the sources without "
                           "speculation a --run of their own")
    for kind, locations in (("log", args.log), ("steplog", args.steplog), ("inbox", args.inbox),
                            ("prometheus", args.prometheus), ("scrape", args.scrape)):
        for location in locations or []:
            config.sources.append(SourceConfig(kind, location, args.run, args.template, args.c, args.skip_bad,
                                               baseline_of=args.baseline_of))
    if args.interval is not None:
        config.interval_s = args.interval
    if args.stale_after is not None:
        config.stale_after_s = args.stale_after
    if args.webhook:
        config.webhook = args.webhook
    if args.dashboard_url:
        config.dashboard_url = args.dashboard_url
    if args.alertmanager:
        config.alertmanager = args.alertmanager

    with _open_store(args) as store:
        watcher = Watcher(store, config, log=_watch_log)
        exporter = None
        if args.metrics_port is not None:
            from specmon.core import environment
            from specmon.core.settings import METRICS_RUNS_ENV
            from specmon.verdicts import metrics

            exporter = metrics.serve(store, args.metrics_address, args.metrics_port, args.metrics_runs
                                     or int(environment.value(METRICS_RUNS_ENV)))  # type: ignore[call-overload]
            _watch_log(f"serving /metrics on http://{args.metrics_address}:{exporter.server_port}/metrics")
        try:
            watcher.run_until_signalled()
        finally:
            if exporter is not None:
                exporter.shutdown()
    return EXIT_OK


def _watch_log(line: str) -> None:
    """The watcher's log: one timestamped line per event on stdout."""
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S}Z {printable(line)}", flush=True)


def live_settings(args: argparse.Namespace) -> LiveSettings:
    # live's --k is a list (a sweep takes several; a single run the first), the other commands' one number
    ks = args.k if isinstance(args.k, list) else [args.k] if args.k is not None else [LIVE_DEFAULTS.k]
    for k in ks:
        if k < 1:
            raise SpecmonError(f"--k must be at least 1, got {k}")
    ngram = getattr(args, "ngram", False)
    return LiveSettings(k=ks[0], max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_p=getattr(args, "top_p", None), seed=args.seed, ngram=ngram,
                        ngram_min=args.ngram_min if ngram else LIVE_DEFAULTS.ngram_min,
                        ngram_max=args.ngram_max if ngram else LIVE_DEFAULTS.ngram_max)


def cmd_live(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specmon.core.settings import SWEEP_DEFAULTS, SweepSettings
    from specmon.pair import live_inputs

    # the arguments are checked before torch and transformers load (seconds), which only the commands that run
    # models import
    settings = live_settings(args)
    if args.concurrency is None and args.k and len(args.k) > 1:
        raise SpecmonError(f"--k {','.join(map(str, args.k))}: several draft lengths make a load sweep; give the "
                           "batch sizes too (--concurrency 1,2,4,8)")
    sweep = None
    if args.concurrency is not None:
        sweep = SweepSettings(tuple(args.concurrency), tuple(args.k or SWEEP_DEFAULTS.ks), args.repeats)
        if not sweep.concurrency or min(sweep.concurrency) < 1:
            raise SpecmonError(f"--concurrency must name batch sizes of at least 1, got {args.concurrency}")
        if args.full_distributions:
            raise SpecmonError("--full-distributions is for a single run, not a load sweep (--concurrency)")
    draft = None if settings.ngram else args.draft
    live_inputs.check_pair(args.target, draft)
    prompts = live_inputs.read_prompts(args.prompts)

    from specmon.analysis import summary
    from specmon.pair import live
    from specmon.pair import sweep as sweeps

    if args.threads:
        live.set_threads(args.threads)
    pair = live.load_pair(args.target, draft)
    template = args.template or Path(args.prompts).stem
    meta = live.run_meta(settings, args.target, args.draft, args.prompts)
    if sweep is None:
        run = args.run or live.run_name(pair, settings)
        bar = tqdm(total=len(prompts), unit="prompt", desc="live run", file=sys.stderr, disable=None)
        with _open_store(args) as store:
            done = live.record_run(store, pair, prompts, settings, run=run, template=template, meta=meta,
                                   keep_log=args.out, full_distributions=args.full_distributions,
                                   progress=lambda n, total: bar.update(n - bar.n))
            bar.close()
            seg = next(r for r in summary.summarize(store, run=run) if r["template"] == template)
        print(f"run {run!r}: {done.steps} steps, {done.tokens} tokens in {done.seconds:.1f} s "
              f"({done.tokens / done.seconds:.1f} tokens/s); alpha = {_fmt(seg['alpha'])} "
              f"[{_fmt(seg['alpha_lo'])}, {_fmt(seg['alpha_hi'])}], predicted beta = {_fmt(seg['beta'])}, tokens "
              f"per step = {_fmt(seg['tokens_per_step'], '.2f')}, c = {_fmt(seg['c'])}")
        return EXIT_OK

    run = args.run or sweeps.sweep_name(pair, settings)
    bar = tqdm(total=0, unit="run", desc="live sweep", file=sys.stderr, disable=None)

    def progress(done: int, total: int, what: str) -> None:
        bar.total, bar.n = total, done
        bar.set_description(what)  # in words: which repeat, which cell

    with _open_store(args) as store:
        swept = sweeps.record_sweep(store, pair, prompts, settings, sweep, run=run, template=template,
                                    meta={**meta, "k": sorted(set(sweep.ks))}, keep_log=args.out,
                                    progress=progress)
        bar.close()
        segs = {r["template"]: r for r in summary.summarize(store, run=run)}
    ks, sizes = (", ".join(map(str, sorted(set(values)))) for values in (sweep.ks, sweep.concurrency))
    print(f"run {run!r}: {swept.steps} steps stored in {swept.seconds:.1f} s, and a load sweep of "
          f"{len(swept.measurements)} runs ({sweep.repeats} repeats of plain decoding and k = {ks} at batch {sizes})")
    table = [("k", "batch", "plain tokens/s", "spec tokens/s", "speedup [95% CI]", "alpha [95% CI]", "tokens/step",
              "c")]
    for p in swept.points:
        seg = segs.get(sweeps.cell_name(template, p.k, p.concurrency), {})
        s = p.speedup
        table.append((str(p.k), str(p.concurrency), f"{p.baseline_tokens_per_s:.0f}", f"{p.tokens_per_s:.0f}",
                      f"{s.estimate:.2f}x" + (f" [{s.lo:.2f}, {s.hi:.2f}]" if s.lo is not None else ""),
                      f"{_fmt(seg.get('alpha'))} [{_fmt(seg.get('alpha_lo'))}, {_fmt(seg.get('alpha_hi'))}]",
                      _fmt(seg.get("tokens_per_step"), ".2f"), _fmt(p.c)))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        _out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for k, crossing in swept.crossings.items():
        print(f"k = {k}: {crossing.describe()}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specmon.pair import live_inputs

    prompts = [p for path in args.prompts for p in live_inputs.read_prompts(path)]
    settings = live_settings(args)
    live_inputs.check_pair(args.target, args.draft)

    from specmon.pair import live, verify  # torch and transformers: after the arguments are checked

    pair = live.load_pair(args.target, args.draft)
    bar = tqdm(total=verify.decodes(len(prompts), args.concurrency), unit="decode", desc="verify", file=sys.stderr,
               disable=None)
    result = verify.verify(pair, prompts, settings, temperature=args.temperature, level=args.alpha,
                           concurrency=args.concurrency, progress=bar.update)
    bar.close()
    batch = "" if result.concurrency is None else f" at batch {result.concurrency}"
    for check in result.greedy:
        for m in result.mismatches:
            if m.proposer == check.proposer:
                where = f"prompt {m.prompt}" if m.sequence is None else f"batch {result.concurrency}, sequence " \
                                                                          f"{m.sequence}, prompt {m.prompt}"
                print(f"MISMATCH ({m.proposer}, {where}): speculative and plain greedy decoding differ at token "
                      f"{m.first}")
        what = "prompts" if result.concurrency is None else "sequences"
        print(f"greedy{batch}, {check.proposer}: {check.matched}/{check.sequences} {what} decode exactly as the "
              "target alone")
    for pit in result.pit:
        which = "" if pit.position is None else f", {pit.what}"
        print(f"sampled (T = {result.temperature:g}, draft model{batch}{which}): randomized PIT of {pit.tokens} "
              f"tokens, KS = {pit.ks.statistic:.4f}, p = {pit.ks.pvalue:.3g}: "
              f"{'consistent with' if pit.ok else 'NOT consistent with'} the target's distribution at the "
              f"{pit.level:g} level")
    return EXIT_OK if result.ok else EXIT_FINDING


def cmd_replay(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specmon.analysis import summary
    from specmon.pair import live, replay

    pair = live.load_pair(args.target, args.draft)
    transcripts = replay.read_transcripts(args.transcripts)
    run = args.run or f"replay {pair.name} T={args.temperature:g}"
    meta = json.dumps({"target": args.target, "draft": args.draft, "k": args.k, "temperature": args.temperature,
                       "transcripts": args.transcripts, "proposer": "replay"})
    bar = tqdm(total=len(transcripts), unit="transcript", desc="replay", file=sys.stderr, disable=None)
    with _open_store(args) as store:
        n = replay.store_replay(store, pair, transcripts, run=run, template=args.template,
                                temperature=args.temperature, meta=meta, name=Path(args.transcripts).name,
                                progress=lambda done, total: bar.update(done - bar.n))
        bar.close()
        rows = summary.summarize(store, run=run, c=args.c)
    for r in rows:
        print(f"run {run!r}, template {r['template'] or '-'!r}: predicted per-token acceptance beta = "
              f"{_fmt(r['beta'])} [95% CI {_fmt(r['beta_lo'])}, {_fmt(r['beta_hi'])}] over {r['requests']} "
              f"transcripts" + (f"; predicted speedup at k = {args.k}: {r['speedup_iid']:.2f}x" if r["speedup_iid"]
                                else ""))
    print(f"{n} completion positions scored and stored" if n is not None else
          f"these transcripts were replayed into run {run!r} with this pair and temperature before; nothing changed")
    return EXIT_OK


def cmd_alert_rule(args: argparse.Namespace) -> int:
    from specmon.follow.alert_rule import prometheus_alert_rule, specmon_alert_rules

    if args.prefix == "specmon":
        print(specmon_alert_rules(args.for_ or "15m"), end="")
        return EXIT_OK
    if args.k is None or args.c is None:
        _err(f"--k and --c are needed for the rule over {args.prefix}'s own counters (--prefix specmon needs "
             "neither: specmon's series carry its verdicts)")
        return EXIT_ERROR
    print(prometheus_alert_rule(args.k, args.c, window=args.window, for_=args.for_ or "30m",
                                metric_prefix=args.prefix), end="")
    return EXIT_OK


def cmd_theory(args: argparse.Namespace) -> int:
    import numpy as np

    from specmon.core import theory

    ks = list(range(1, args.k_max + 1))
    print(f"speedup S(alpha, k, c = {args.c:g}) under the i.i.d. model; best k per alpha")
    print("alpha  " + " ".join(f"k={k:<5d}" for k in ks) + "  best k  speedup")
    for alpha in np.round(np.arange(0.1, 1.0, 0.05), 2):
        s = [theory.speedup(alpha, k, args.c) for k in ks]
        k_best, s_best = theory.best_k(alpha, args.c, args.k_max)
        verdict = f"{k_best:<6d}  {s_best:.2f}x" if s_best > 1 else "none    (every k loses)"
        print(f"{alpha:5.2f}  " + " ".join(f"{x:<7.2f}" for x in s) + f"  {verdict}")
    print(f"\nbreak-even at c = {args.c:g}: alpha* (S = 1) and tokens per step 1 + k*c")
    for k in ks:
        a = theory.break_even_alpha(k, args.c)
        a_txt = "none (c > 1: no alpha pays)" if a != a else f"{a:.3f}"
        print(f"  k={k}: alpha* = {a_txt}, 1+kc = {theory.break_even_tokens(k, args.c):.2f}")
    return EXIT_OK


def _distribution(text: str, flag: str) -> np.ndarray:
    import numpy as np

    try:
        v = np.array([float(x) for x in text.split(",")])
    except ValueError:
        raise SpecmonError(f"{flag}: expected comma-separated probabilities, got {text!r}") from None
    if (v < 0).any() or abs(v.sum() - 1) > 1e-6:
        raise SpecmonError(f"{flag}: probabilities must be >= 0 and sum to 1 (they sum to {v.sum():g})")
    return v


def cmd_simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from specmon.core import sampler, theory

    p, q = _distribution(args.p, "--p"), _distribution(args.q, "--q")
    if p.shape != q.shape:
        raise SpecmonError(f"--p has {len(p)} tokens, --q has {len(q)}: they must share a vocabulary")
    records = sampler.simulate_fixed_pair(p, q, args.k, args.cycles, np.random.default_rng(args.seed),
                                          template=args.template, distributions=args.distributions, topk=args.topk)
    if args.out and args.out != "-":
        with open(args.out, "wb") as out:
            n = sampler.write_step_log(records, out)
    else:
        n = sampler.write_step_log(records, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    _err(f"simulated {n} steps: beta = {theory.beta(p, q):.4f}, expected tokens per step at k = {args.k}: "
         f"{theory.expected_tokens(theory.beta(p, q), args.k):.4f}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from specmon.ingest import demo

    if args.write_sweep:
        with open(args.write_sweep, "wb") as out:
            n = demo.write_demo_sweep(out)
        print(f"wrote {n} load measurements to {args.write_sweep}")
        return EXIT_OK
    if args.write_log:
        with open(args.write_log, "wb") as out:
            n = demo.write_demo_log(out)
        print(f"wrote {n} steps to {args.write_log}")
        return EXIT_OK
    with _open_store(args) as store:
        result = demo.load_demo(store)
    if result.status == "already ingested":
        print(f"{store.path}: the demo data is already there (run {demo.DEMO_RUN!r}); nothing changed")
    else:
        print(f"{store.path}: demo data {result.status} (run {demo.DEMO_RUN!r}, {result.steps} steps)")
    return EXIT_OK


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _seconds(text: str) -> float:
    v = _wait_seconds(text)
    if v == 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 and less than 1e6 seconds, got {text}")
    return v


def _wait_seconds(text: str) -> float:
    """A wait in seconds, 0 (do not wait) included; nan and inf are not waits."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= v < 1e6:
        raise argparse.ArgumentTypeError(f"must be from 0 to less than 1e6 seconds, got {text}")
    return v


def _cost(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"c is a cost ratio >= 0, got {text!r}") from None
    if not 0 <= v < math.inf:
        raise argparse.ArgumentTypeError(f"c is a cost ratio >= 0 (a finite one), got {text}")
    return v


class _FormatNames:
    """--format's choices, listed only when a command line or its help asks: naming them imports every reader."""

    def __iter__(self) -> Iterator[str]:
        return iter(formats.names())

    def __contains__(self, name: object) -> bool:
        return name in formats.names()


def cmd_serve(args: argparse.Namespace) -> int:
    from specmon.core import environment
    from specmon.ui.serve import serve

    path = str(args.db or environment.value(DB_ENV))
    if os.path.exists(path):  # a damaged file or a directory is said here, not on the first page
        _open_store(args).close()
    elif (args.db or os.environ.get(DB_ENV)) and not (args.demo or args.watch):
        # A named path that does not exist is a typo until said otherwise; the default file is the dashboard's
        # own, started with the demo data on first start.
        raise SpecmonError(f"no database at {path}: ingest a file into it first (specmon ingest --db {path} FILE), "
                           f"or start the dashboard on a new one with the demo data (specmon serve --db {path} "
                           "--demo)")
    return serve(args.db, args.address, args.port, args.watch, _watch_log, lambda: _open_store(args),
                 metrics_runs=args.metrics_runs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specmon", description="Is speculative decoding paying off? Acceptance, break-even and drift.",
        epilog=f"The database is --db, else ${DB_ENV}, else ./{DEFAULT_DB}.")
    parser.add_argument("--version", action="version", version=f"specmon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", help=f"DuckDB file (default: ${DB_ENV}, else ./{DEFAULT_DB})")
    db.add_argument("--lock-timeout", type=_wait_seconds, metavar="SECONDS",
                    help=f"how long to wait while another process writes the database (default: "
                         f"${LOCK_TIMEOUT_ENV}, else {DEFAULT_LOCK_TIMEOUT_S:g})")

    # what the drift detector is designed for: check judges with it, and ingest prepares it for check
    design = argparse.ArgumentParser(add_help=False)
    design.add_argument("--c", type=_cost, help="draft cost / target cost, overriding the measured one")
    design.add_argument("--false-alarm-steps", type=_positive_int, default=DEFAULT_ARL0_STEPS,
                        help="expected steps (engine windows) between false alarms when nothing changed "
                        f"(default {DEFAULT_ARL0_STEPS})")

    p = sub.add_parser("ingest", parents=[db, design], help="store step logs, engine logs or Prometheus pages",
                       description="Store specmon step logs (JSON Lines, or the flat form as CSV or Parquet), vLLM, "
                                   "llama.cpp or SGLang logs and JSON responses, saved Prometheus /metrics pages, "
                                   "load sweeps or `vllm bench serve --save-result` results; the format is "
                                   "detected. Each file is one transaction: a file with any fault stores nothing "
                                   "(exit 1) unless --skip-bad. Re-ingesting the same content is a no-op. Then the "
                                   "drift detector of each run stored into is brought up to date, as "
                                   "`check` with the same --c and --false-alarm-steps would (a new reference's "
                                   "threshold is calibrated now, a few seconds, so that check only reads it).")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files to ingest; - reads standard input")
    p.add_argument("--run", help="run to store into (default: the file name without extension)")
    p.add_argument("--template", help="template for steps whose log line names none")
    p.add_argument("--skip-bad", action="store_true", help="store the good rows; write rejected ones to --report")
    p.add_argument("--report", help="where --skip-bad writes rejected rows (default: ./FILE.rejected.jsonl)")
    p.add_argument("--format", choices=_FormatNames(), metavar="FORMAT",
                   help="skip format detection: one of %(choices)s")
    p.add_argument("--sum-tol", type=float, default=DEFAULT_SUM_TOLERANCE,
                   help=f"how far a distribution may sum from 1 (default {DEFAULT_SUM_TOLERANCE:g})")
    p.add_argument("--k", type=int, metavar="K", help="the draft length the server ran with, for benchmark results "
                   "that do not record it (0: speculation off)")
    p.add_argument("--baseline-of", metavar="RUN", help="these files ran without speculation, on the model, "
                   "hardware and traffic of run RUN: its baseline (implies --k 0)")
    p.add_argument("--no-drift", action="store_true", help="leave the drift detector to the next `check` (a bulk "
                   "load ingests faster; that check then calibrates every new reference)")
    p.add_argument("--json", action="store_true", help="one JSON object per file on stdout")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("summary", parents=[db], help="acceptance, break-even and status per segment",
                       description="Per segment: alpha with a cluster-robust 95% interval, predicted beta, "
                                   "per-position rates, tokens per step, c, break-even and status. Shows the demo "
                                   "data while nothing of your own is ingested.")
    p.add_argument("--json", action="store_true", help="a JSON array of segment objects (keys in the README)")
    p.add_argument("--by", choices=GROUPINGS, default="template", help="segment by run, run+template "
                   "(default), or run+template+day")
    p.add_argument("--c", type=_cost, help="draft cost / target cost, overriding the one measured from timings")
    p.add_argument("--no-demo", action="store_true", help="do not load the demo data into an empty database")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("check", parents=[db, design], help="exit 1 on a losing segment, a run losing at its load, a "
                       "drift alarm or a template change that hurt (for cron and CI)",
                       description="Exit 0: every segment healthy, no drift alarm, no template change that hurt, "
                                   "no run losing or at risk at the load it serves now. "
                                   "1: a problem (one line each). 2: error, or c unknown for a segment (pass --c). "
                                   "A segment's status: the 95% interval of its tokens per step L against the "
                                   "break-even 1 + g c (healthy above, losing below, at risk across it; g the mean "
                                   "draft length), at batch 1; at load, the measured speedup's interval against 1 "
                                   "at the current concurrency, where a baseline was measured. "
                                   "Drift: a one-sided Bernoulli CUSUM per run (step logs, engine logs, Prometheus) "
                                   "towards the run's break-even alpha (its per-position profile's), "
                                   "calibrated on the run's own first requests to one false alarm per "
                                   "--false-alarm-steps points (steps, or engine windows in 10-minute blocks); a "
                                   "rate is stated once the reference covers a day, its requests or blocks then "
                                   "drawn by hour of day (engine windows: once it also holds 8 x the figure, and "
                                   "until then the threshold is at least a floor sized from the reference's own "
                                   "windows, which errs towards quiet), and each alarm says why where none is; "
                                   "template changes and annotations are judged "
                                   "before/after on the hours both sides cover (where they cover different hours "
                                   "the data cannot tell, and only a new side below break-even is a problem).")
    p.add_argument("--since", help="only steps, alarms and template changes since then: 6h, 2d, 30m, 1w or ISO time")
    p.add_argument("--json", action="store_true", help="problems, statuses, alarms and template changes as JSON")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("recommend", parents=[db], help="the speculation policy by concurrency the data supports",
                       description="From each run's speedup at each measured concurrency (throughput with "
                                   "speculation over the same without it: load sweeps, benchmark results, engine "
                                   "windows against a baseline), the draft length to use up to which number of "
                                   "running requests, and where to turn speculation off, in words and in vLLM's, "
                                   "TensorRT-LLM's and SGLang's own configuration; nothing where the measurements "
                                   "cannot tell the choices apart.")
    p.add_argument("--run", help="one run (default: every run that measured load)")
    p.add_argument("--json", action="store_true", help="one object per run: points, break-even, policy")
    p.set_defaults(func=cmd_recommend)

    p = sub.add_parser("annotate", parents=[db], help="record a rollout (a template change the data cannot show), "
                       "or a period with speculation off", description="Record that run RUN serves template T from "
                       "--at on (like a deploy annotation): template-change verdicts, `specmon check` and the Drift "
                       "page compare acceptance before and after it. Or, with --speculation off|on, that RUN served "
                       "without (or again with) speculation from --at on: the windows of an off period are the "
                       "run's own baseline at each load.")
    p.add_argument("--run", required=True, help="the run (it must exist: see specmon summary)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--template", help="the template rolled out")
    what.add_argument("--speculation", choices=("off", "on"), help="speculation turned off (or on again)")
    p.add_argument("--at", help="when: an ISO-8601 time (UTC where it names no zone) or a duration ago like 30m, "
                   "2h (default: now)")
    p.add_argument("--note", help="free text shown with the verdict")
    p.set_defaults(func=cmd_annotate)

    pair_args = argparse.ArgumentParser(add_help=False)
    pair_args.add_argument("--target", default=str(resources.TARGET_MODEL), help="target model directory or hub name "
                           "(default: the shipped pair's target)")
    pair_args.add_argument("--draft", default=str(resources.DRAFT_MODEL),
                           help="draft model (default: the shipped draft)")
    pair_args.add_argument("--k", type=int, default=LIVE_DEFAULTS.k, help=f"draft length (default {LIVE_DEFAULTS.k})")
    pair_args.add_argument("--max-new-tokens", type=_positive_int, default=LIVE_DEFAULTS.max_new_tokens,
                           help=f"new tokens per prompt (default {LIVE_DEFAULTS.max_new_tokens})")
    pair_args.add_argument("--seed", type=int, default=LIVE_DEFAULTS.seed)

    from specmon.core.settings import SWEEP_DEFAULTS
    from specmon.pair.live_inputs import int_list  # torch-free

    p = sub.add_parser("live", parents=[db], help="run speculative decoding of a local pair and store it",
                       description="Speculative decoding (Leviathan et al.'s Algorithm 1, KV caches rolled back on "
                                   "rejection) of every prompt, every step logged with exact beta and timings, "
                                   "stored as a run. With --concurrency, a load sweep: B prompts decoded at once at "
                                   "each batch size B, speculatively at each k (ragged acceptance) and plainly, "
                                   "alternating, stored as the run's steps and a load sweep in the same run.")
    # pair_args' options, but --k takes a list here (a sweep's draft lengths)
    p.add_argument("--target", default=str(resources.TARGET_MODEL), help="target model directory or hub name "
                   "(default: the shipped pair's target)")
    p.add_argument("--draft", default=str(resources.DRAFT_MODEL), help="draft model (default: the shipped draft)")
    p.add_argument("--k", type=int_list, metavar="K[,K...]",
                   help=f"draft length (default {LIVE_DEFAULTS.k}); with --concurrency, draft lengths to sweep "
                        f"(default {','.join(map(str, SWEEP_DEFAULTS.ks))})")
    p.add_argument("--max-new-tokens", type=_positive_int, default=LIVE_DEFAULTS.max_new_tokens,
                   help=f"new tokens per prompt (default {LIVE_DEFAULTS.max_new_tokens})")
    p.add_argument("--seed", type=int, default=LIVE_DEFAULTS.seed)
    p.add_argument("--concurrency", type=int_list, metavar="B[,B...]",
                   help="a load sweep at these batch sizes, e.g. "
                        f"{','.join(map(str, SWEEP_DEFAULTS.concurrency))}: B prompts at once (the prompt set "
                        "cycled where it has fewer)")
    p.add_argument("--repeats", type=_positive_int, default=SWEEP_DEFAULTS.repeats,
                   help=f"runs of each (k, batch size) and of its baseline in a sweep (default "
                        f"{SWEEP_DEFAULTS.repeats})")
    p.add_argument("--threads", type=_positive_int, help="torch threads (default: torch's own choice)")
    p.add_argument("--ngram", action="store_true", help="propose by n-gram prompt lookup instead of a draft model")
    p.add_argument("--ngram-min", type=_positive_int, default=LIVE_DEFAULTS.ngram_min)
    p.add_argument("--ngram-max", type=_positive_int, default=LIVE_DEFAULTS.ngram_max)
    p.add_argument("--top-p", type=float, default=LIVE_DEFAULTS.top_p, help="nucleus sampling on both sides")
    p.add_argument("--temperature", type=_cost, default=LIVE_DEFAULTS.temperature,
                   help=f"0 is greedy (default {LIVE_DEFAULTS.temperature:g})")
    p.add_argument("--prompts", type=resources.prompt_file, default="copy",
                   help="JSON lines {\"prompt\": ...}, a .txt file of blank-line-separated prompts, or a shipped "
                        f"set: {', '.join(resources.PROMPT_SETS)} (default: copy, the copy-heavy set)")
    p.add_argument("--template", help="segment label (default: the prompt file's name)")
    p.add_argument("--run", help="run name (default: from the pair, k and temperature)")
    p.add_argument("--out", help="also keep the step log here (JSON Lines)")
    p.add_argument("--full-distributions", metavar="PARQUET", help="also write every position's full target and "
                   "draft distributions (float32 lists, one row per step, position and side) to this Parquet file")
    p.set_defaults(func=cmd_live)

    p = sub.add_parser("verify", parents=[pair_args], help="check that speculative decoding emits the target's output",
                       description="Greedy: speculative decoding (draft model and n-gram) must equal the target's "
                                   "own greedy decoding token for token. Sampled: the randomized PIT of emitted "
                                   "tokens under the target's distribution must be uniform (KS test). Exit 1 if not.")
    p.add_argument("--prompts", nargs="+", type=resources.prompt_file,
                   default=[resources.prompt_file(name) for name in resources.PROMPT_SETS],
                   help="prompt files or shipped sets (default: every shipped set)")
    p.add_argument("--temperature", type=_cost, default=1.0, help="temperature of the sampled check (default 1)")
    p.add_argument("--alpha", type=float, default=KS_LEVEL,
                   help=f"significance level of the KS test (default {KS_LEVEL:g})")
    p.add_argument("--concurrency", type=_positive_int, metavar="N",
                   help="decode N prompts at once (batched, ragged acceptance); each sequence must still equal its "
                        "prompt decoded alone, and the PIT is tested per draft position too")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("replay", parents=[db, pair_args],
                       help="predict acceptance on recorded traffic (teacher forcing)",
                       description="Score every completion position of recorded transcripts with both models (one "
                                   "forward pass each) and store beta per position as a replay run: a prediction "
                                   "of per-token acceptance, not a measurement (README: what replay predicts).")
    p.add_argument("--transcripts", required=True, help="JSON lines with prompt, completion, optional template, ts")
    p.add_argument("--temperature", type=_cost, default=1.0, help="temperature of both distributions (default 1)")
    p.add_argument("--template", help="segment label for transcripts that name none")
    p.add_argument("--run", help="run name (default: from the pair and temperature)")
    p.add_argument("--c", type=_cost, help="draft cost, for the predicted speedup and status")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("pull", parents=[db], help="store speculative-decoding counters from a Prometheus server",
                       description="Read vLLM's (or llama.cpp's) spec_decode counters and SGLang's gauges, and the "
                                   "engines' load series (requests running and waiting, tokens generated), from the "
                                   "Prometheus HTTP API (query_range) and store the samples; windows are the "
                                   "differences between consecutive samples of each series, restarts handled.")
    p.add_argument("--prometheus", required=True, metavar="URL", help="e.g. http://prometheus:9090")
    p.add_argument("--since", default="6h", help="how far back (default 6h): 30m, 6h, 2d")
    p.add_argument("--step", default="1m", help="sample spacing (default 1m)")
    p.add_argument("--run", default="prometheus", help="run to store into (default prometheus)")
    p.add_argument("--template", help="segment label for these samples")
    p.add_argument("--baseline-of", metavar="RUN", help="these engines ran without speculation, on the model, "
                   "hardware and traffic of run RUN: its baseline")
    p.add_argument("--timeout", type=_seconds, default=PULL_REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help=f"give up on a request not answered in full within this time (default "
                        f"{PULL_REQUEST_TIMEOUT_S:g})")
    p.add_argument("--total-timeout", type=_seconds, default=PULL_TIMEOUT_S, metavar="SECONDS",
                   help=f"give up on the whole pull after this time (default {PULL_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("watch", parents=[db], help="follow engine logs, step logs, an inbox or Prometheus until "
                       "stopped", description="Follow sources until Ctrl-C or SIGTERM (the batch in hand is "
                       "finished, exit 0). Logs are followed like tail -F (complete lines only; rotation and "
                       "truncation survived); the read position is committed with the data, so a restart resumes "
                       "exactly. An alarm opening or closing, or a segment turning losing or back, is logged and "
                       "POSTed as JSON to --webhook. A failing source is retried with back-off; the others go on.")
    p.add_argument("--log", action="append", metavar="PATH", help="an engine log (vLLM, llama.cpp, SGLang); repeatable")
    p.add_argument("--steplog", action="append", metavar="PATH", help="an appended JSON Lines step log; repeatable")
    p.add_argument("--inbox", action="append", metavar="DIR", help="a folder: each complete file is ingested once, "
                   "then moved to DIR/done/ or DIR/rejected/ with its report; repeatable")
    p.add_argument("--prometheus", action="append", metavar="URL", help="pull from where the last pull stopped, "
                   "every interval; repeatable")
    p.add_argument("--scrape", action="append", metavar="URL", help="an engine's own Prometheus page (vLLM, "
                   "SGLang, llama-server: http://host:port/metrics; TensorRT-LLM: .../prometheus/metrics), read "
                   "every interval; repeatable")
    p.add_argument("--config", metavar="FILE", help="a TOML file naming sources, one table per source "
                   "([[log]] path=..., run=..., template=..., c=...; README: Watching a deployment)")
    p.add_argument("--interval", type=float, metavar="SECONDS", help="seconds between polls (default 1)")
    p.add_argument("--run", help="run for the sources named on the command line (default: the file name; "
                   "'prometheus' for a server; host:port for a scraped engine)")
    p.add_argument("--template", help="template for those sources (default: the data's own, else the latest "
                   "`specmon annotate`)")
    p.add_argument("--c", type=_cost, help="draft cost / target cost, for break-even and status")
    p.add_argument("--baseline-of", metavar="RUN", help="the sources named on the command line run without "
                   "speculation, as the baseline of run RUN")
    p.add_argument("--skip-bad", action="store_true", help="skip bad lines (named in the log) instead of stopping "
                   "that source")
    p.add_argument("--webhook", metavar="URL", help="POST one JSON document per alarm or status change here")
    p.add_argument("--dashboard-url", metavar="URL", help="prefix for the page links in webhooks, e.g. "
                   "http://host:8501")
    p.add_argument("--stale-after", type=float, metavar="SECONDS", help="show a source as stale after this long "
                   "without data (default 300)")
    p.add_argument("--alertmanager", metavar="URL", help="post findings as alerts to this Alertmanager "
                   "(http://host:9093; API v2), re-posted while they fire and resolved when they close")
    _metrics_flags(p)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("alert-rule", help="print a Prometheus alerting rule over an engine's counters",
                       description="A Prometheus rule that fires while accepted tokens per draft over a window is "
                                   "below the break-even k*c (mean acceptance length below 1 + k*c).")
    p.add_argument("--k", type=_positive_int, help="draft length served (engines' counters)")
    p.add_argument("--c", type=_cost, help="draft cost / target cost on your hardware (engines' counters)")
    p.add_argument("--window", default="15m", help="rate window (default 15m)")
    p.add_argument("--for", dest="for_", help="how long it must hold before firing (default 30m; 15m with "
                   "--prefix specmon)")
    p.add_argument("--prefix", default="vllm", choices=("vllm", "llamacpp", "trtllm", "specmon"),
                   help="whose series: vLLM's (vllm:), llama-server's (llamacpp:) or TensorRT-LLM's (trtllm_) "
                        "counters, or specmon's own /metrics (specmon_segment_status, specmon_load_status: "
                        "no --k or --c needed) (default vllm)")
    p.set_defaults(func=cmd_alert_rule)

    p = sub.add_parser("theory", help="speedup table, best k and break-even for a draft cost c",
                       description="The i.i.d. model's speedup S = (1 - a^(k+1)) / ((1 - a)(1 + k c)).")
    p.add_argument("--c", type=_cost, required=True, help="draft step cost / target step cost")
    p.add_argument("--k-max", type=_positive_int, default=THEORY_K_MAX,
                   help=f"largest draft length to consider (default {THEORY_K_MAX})")
    p.set_defaults(func=cmd_theory)

    p = sub.add_parser("simulate", help="write a step log of a simulated fixed (p, q) pair",
                       description="Run Leviathan's Algorithm 1 on one fixed target/draft pair and write a step "
                                   "log (JSON Lines) to stdout or --out. Pipe it into specmon ingest -.")
    p.add_argument("--cycles", type=_positive_int, default=50000, help="verification steps (default 50000)")
    p.add_argument("--k", type=_positive_int, default=4, help="draft length (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--p", default=_PAPER_P, help=f"target distribution (default {_PAPER_P})")
    p.add_argument("--q", default=_PAPER_Q, help=f"draft distribution (default {_PAPER_Q})")
    p.add_argument("--distributions", choices=DISTRIBUTION_MODES, default="dense",
                   help="what to log per position: full p and q, top-k logprobs, beta only, or none")
    p.add_argument("--topk", type=_positive_int, default=20, help="logprobs per position with --distributions topk")
    p.add_argument("--template", default="sim")
    p.add_argument("--out", help="output file (default stdout)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("demo", parents=[db], help="load the demo data (or write its step log)",
                       description="Load the shipped demo step log and load sweep as the demo run; --write-log and "
                                   "--write-sweep regenerate them.")
    p.add_argument("--write-log", metavar="PATH", help="write the demo step log from its seed instead")
    p.add_argument("--write-sweep", metavar="PATH", help="write the demo load sweep from its seed instead")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("serve", parents=[db], help="start the dashboard (Streamlit)")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--address", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--watch", metavar="FILE", help="also run `specmon watch --config FILE` beside the dashboard "
                   "(stopped with it)")
    p.add_argument("--demo", action="store_true", help="start a new database at --db with the demo data (without "
                   "it, a --db that does not exist is an error; the default database starts with the demo data)")
    _metrics_flags(p, port=False)  # the dashboard serves /metrics on its own port
    p.set_defaults(func=cmd_serve)
    return parser


class _Terminated(BaseException):
    """SIGTERM, raised where the program is, so that cleanup (a spooled copy, a transaction) runs as on Ctrl-C."""


_signals_received: list[int] = []


def _on_signal(signum: int, frame: object) -> None:
    # Remembered because DuckDB turns an exception raised while one of its queries runs into
    # RuntimeError("Query interrupted"): main must still know which signal ended the program.
    _signals_received.append(signum)
    raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for handled in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(handled) is not signal.SIG_IGN:  # a background job of a script ignores SIGINT: keep that
            signal.signal(handled, _on_signal)
    try:
        return args.func(args)
    except SpecmonError as exc:
        _err(str(exc))
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_OK
    except (KeyboardInterrupt, _Terminated, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not _signals_received:
            raise
        signum: int = _signals_received[-1] if _signals_received else signal.SIGINT
        what = "interrupted (SIGINT)" if signum == signal.SIGINT else "terminated (SIGTERM)"
        _err(f"{what}; an ingest not yet reported as stored was rolled back")
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
