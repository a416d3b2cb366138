"""The demo data: a synthetic production step log in which a template change pushes acceptance below break-even,
and a synthetic load sweep in which speculation pays at low concurrency and loses at high.

Made from fixed seeds, so `specmon demo --write-log` and `--write-sweep` reproduce specmon/data/demo_steplog.jsonl
and specmon/data/demo_sweep.csv byte for byte. The log comes from specmon's own sampler: each request gets its own
target/draft pair (acceptance varies by prompt and is correlated within a request, as in real traffic); template v2
makes the draft a much worse guesser of the target. The sweep comes from a stated cost model, for the demo only
(specmon measures speedup at load, it never predicts it): the target's step over n tokens in flight costs
max(1, n / _KNEE) units (memory-bound below the knee, compute-bound above), a draft step c = _DEMO_C of the target's
at the same batch, so at N requests and draft length k a step takes t(N (k + 1)) + k c t(N) and emits L(alpha, k)
tokens per request; each measurement has 1.5% noise.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import IO, TYPE_CHECKING

import numpy as np

from specmon.core import sampler, theory
from specmon.core.resources import DEMO_LOG, DEMO_SWEEP

if TYPE_CHECKING:
    from specmon.ingest.pipeline import IngestResult
    from specmon.store.database import Store

DEMO_RUN = "demo (synthetic)"
DEMO_SEED = 20261129
DEMO_K = 4
_VOCAB = 16
_DAYS = 6
_REQUESTS_PER_DAY = 40
_CHANGE_DAY = 3.5  # template v2 ships here
_START = datetime(2026, 11, 22, tzinfo=timezone.utc)
# How far the draft's logits stray from the target's, per template: the knob that sets acceptance.
_DRAFT_NOISE = {"v1": (0.3, 1.0), "v2": (3.0, 5.0)}
_DENSE_EVERY = 10  # every 10th request logs full distributions (for the losslessness checks); others beta only


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def demo_records(seed: int = DEMO_SEED) -> list[dict]:
    """The demo step log's records, in time order."""
    rng = np.random.default_rng(seed)
    records = []
    for r in range(_DAYS * _REQUESTS_PER_DAY):
        start = _START + timedelta(days=r / _REQUESTS_PER_DAY + rng.uniform(0, 1 / _REQUESTS_PER_DAY))
        template = "v1" if (start - _START) < timedelta(days=_CHANGE_DAY) else "v2"
        logits = rng.normal(0.0, 2.0, _VOCAB)
        p = _softmax(logits)
        q = _softmax(logits + rng.normal(0.0, rng.uniform(*_DRAFT_NOISE[template]), _VOCAB))
        dense = r % _DENSE_EVERY == 0
        if dense:  # what a logger writes: rounded, so the sums are 1 only to ~1e-5
            p, q = np.round(p, 6), np.round(q, 6)
            p, q = p / p.sum(), q / q.sum()
        p_rows, q_rows = np.tile(p, (DEMO_K + 1, 1)), np.tile(q, (DEMO_K, 1))
        b = round(float(theory.beta(p, q)), 6)
        for i in range(int(rng.integers(15, 41))):
            step = sampler.speculative_step(p_rows, q_rows, rng)
            rec = {
                "request_id": f"req-{r:04d}",
                "ts": (start + timedelta(milliseconds=55 * i)).isoformat(timespec="milliseconds")
                .replace("+00:00", "Z"),
                "template": template,
                "k": DEMO_K,
                "temperature": 1.0,
                "draft_tokens": step.draft_tokens,
                "accepted": step.accepted,
                "emitted_tokens": step.emitted_tokens,
                "target_ms": round(float(rng.lognormal(np.log(30.0), 0.08)), 2),
                "draft_ms": [round(float(x), 2) for x in rng.lognormal(np.log(6.0), 0.1, DEMO_K)],
            }
            if dense:
                rec["target_probs"] = np.round(p_rows, 6).tolist()
                rec["draft_probs"] = np.round(q_rows, 6).tolist()
            else:
                rec["beta"] = [b] * DEMO_K
            records.append(rec)
    records.sort(key=lambda rec: str(rec["ts"]))  # ISO times in one format: text order is time order
    return records


def write_demo_log(out: IO[bytes], seed: int = DEMO_SEED) -> int:
    return sampler.write_step_log(iter(demo_records(seed)), out)


# The demo sweep's cost model (see the docstring): the knee in tokens in flight, the draft cost, its acceptance.
_KNEE = 28.0
_DEMO_C = 0.1
_SWEEP_ALPHA = 0.82
_SWEEP_KS = (0, 2, 4)
_SWEEP_CONCURRENCY = (1, 2, 4, 8, 16, 32)
_SWEEP_REPEATS = 4
_SWEEP_NOISE = 0.015
_TOKENS_PER_UNIT = 100.0  # output tokens per second of one request at batch 1, without speculation


def demo_sweep_rows(seed: int = DEMO_SEED) -> list[dict]:
    """The demo sweep's rows (load-sweep columns), from the cost model and a fixed seed."""
    rng = np.random.default_rng(seed + 1)
    rows = []
    for n in _SWEEP_CONCURRENCY:
        for k in _SWEEP_KS:
            step = max(1.0, n * (k + 1) / _KNEE) + k * _DEMO_C * max(1.0, n / _KNEE)
            tokens = float(theory.expected_tokens(_SWEEP_ALPHA, k)) if k else 1.0
            for repeat in range(1, _SWEEP_REPEATS + 1):
                rate = _TOKENS_PER_UNIT * n * tokens / step * (1 + _SWEEP_NOISE * rng.standard_normal())
                rows.append({"run": DEMO_RUN, "k": k, "concurrency": n, "repeat": repeat,
                             "output_tokens_per_s": round(rate, 1)})
    return rows


def write_demo_sweep(out: IO[bytes], seed: int = DEMO_SEED) -> int:
    rows = demo_sweep_rows(seed)
    columns = list(rows[0])
    out.write((",".join(columns) + "\n").encode())
    for r in rows:
        out.write((",".join(str(r[c]) for c in columns) + "\n").encode())
    return len(rows)


def load_demo(store: Store) -> IngestResult:
    """Ingest the shipped demo log and sweep as the demo run (shown only while the user has stored nothing). The
    result is the log's; the sweep goes with it."""
    from specmon.ingest.pipeline import (
        ingest_file,  # the readers load only when the demo is written, not to look for it
    )

    result = ingest_file(store, str(DEMO_LOG), name=DEMO_LOG.name, run=DEMO_RUN, demo=True)
    ingest_file(store, str(DEMO_SWEEP), name=DEMO_SWEEP.name, run=DEMO_RUN, demo=True)
    return result


def ensure_demo(store: Store) -> IngestResult | None:
    """Load the demo into an empty database; leave any other database alone."""
    return load_demo(store) if store.is_empty() else None
