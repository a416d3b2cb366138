"""Replay: predict acceptance of a model pair on recorded traffic without serving anything.

For each transcript (prompt and completion) both models read the whole text once (teacher forcing), and every
completion position gets beta = sum min(p, q) under the chosen temperature: the probability that a draft token
drawn at that position would be accepted. The mean beta predicts per-token acceptance alpha on that traffic.

What it does not predict: in real speculative decoding the draft continues from its own proposals, not from the
recorded text, so positions 2..k of a draft see contexts that replay never scores; acceptance there is usually
lower than replay's beta when the draft strays. The completion itself came from whatever served it, not
necessarily from this target. Treat replay beta as an upper-side estimate of alpha for position 1 and a guide
for comparing drafts or templates on the same traffic, not as a measurement.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import orjson
import torch

from specmon.core import theory, times
from specmon.core.faults import Fault, SpecmonError
from specmon.ingest.formats import jsonlines
from specmon.ingest.pipeline import Counts, Delivery, already_stored, store_read
from specmon.pair.live import Pair, distribution
from specmon.store.database import Store
from specmon.store.rows import get_or_create_segment


def read_transcripts(path: str) -> list[dict]:
    """JSON lines with prompt and completion (strings), optional template and ts (ISO-8601, naive is UTC, or epoch
    seconds; read into a naive UTC datetime); faults name line and field."""
    out, faults = [], []
    if not os.path.isfile(path):
        raise SpecmonError(f"{path}: no such transcript file")
    for no, obj, fault in jsonlines.objects(path, path):
        if fault is not None:
            faults.append(fault)
        if obj is not None:
            faults += _check_transcript(obj, path, no)
            out.append(obj)
    if faults:
        raise SpecmonError("; ".join(map(str, faults[:5])))
    if not out:
        raise SpecmonError(f"{path}: no transcripts in the file")
    return out


def _check_transcript(obj: dict, path: str, no: int) -> list[Fault]:
    """The faults of one transcript; its ts, where valid, is read into a naive UTC datetime in place."""
    faults = [Fault(path, no, field, "required, a string") for field in ("prompt", "completion")
              if not isinstance(obj.get(field), str)]
    if obj.get("ts") is not None:
        try:
            obj["ts"] = times.parse_timestamp(obj["ts"])  # a naive time is UTC, as in step logs
        except (TypeError, ValueError, OverflowError, OSError):
            faults.append(Fault(path, no, "ts", f"expected an ISO-8601 time or epoch seconds, got {obj['ts']!r}"))
    return faults


def score(pair: Pair, prompt: str, completion: str, temperature: float = 1.0, top_p: float | None = None):
    """(tokens, beta, p_token, q_token) per completion position, from one forward pass of each model."""
    if pair.draft is None:
        raise SpecmonError("replay scores a draft model's distributions; n-gram lookup has none")
    prompt_ids = pair.tokenizer(prompt)["input_ids"]
    ids = pair.tokenizer(prompt + completion)["input_ids"]
    limit = min(pair.target.config.max_position_embeddings, pair.draft.config.max_position_embeddings)
    start = max(len(prompt_ids), 1)
    if len(ids) > limit:  # keep the end: the completion is what is scored
        cut = len(ids) - limit
        ids, start = ids[cut:], max(start - cut, 1)
    x = torch.tensor([ids])
    with torch.inference_mode():
        p = distribution(pair.target(input_ids=x).logits[0, start - 1:-1], temperature, top_p)
        q = distribution(pair.draft(input_ids=x).logits[0, start - 1:-1], temperature, top_p)
    tokens = ids[start:]
    idx = torch.arange(len(tokens))
    t = torch.tensor(tokens)
    beta = np.minimum(theory.beta(p.numpy(), q.numpy()), 1.0)  # float32 sums can exceed 1 by an ulp
    return tokens, np.atleast_1d(beta).tolist(), p[idx, t].tolist(), q[idx, t].tolist()


def store_replay(store: Store, pair: Pair, transcripts: list[dict], *, run: str, template: str | None,
                 temperature: float, meta: str, name: str, progress=None) -> int | None:
    """Score every transcript and store its positions as a replay run. Returns positions stored, or None when the
    same transcripts were replayed into this run with the same pair and settings before (nothing changed)."""
    key = "replay:" + hashlib.sha256(orjson.dumps([run, meta, temperature, template, transcripts],
                                                  default=str)).hexdigest()
    if already_stored(store, key):
        return None
    rows = []
    now = times.utc_now()
    for i, tr in enumerate(transcripts):
        tokens, beta, p_tok, q_tok = score(pair, tr["prompt"], tr["completion"], temperature)
        ts = tr.get("ts") or now
        label = tr.get("template") or template or ""
        rows += [(f"t{i:05d}", label, ts, j + 1, tok, b, pp, qq)
                 for j, (tok, b, pp, qq) in enumerate(zip(tokens, beta, p_tok, q_tok, strict=True))]
        if progress:
            progress(i + 1, len(transcripts))

    def write(cur, run_id: int, ingest_id: int) -> Counts:
        segments = {label: get_or_create_segment(cur, run_id, label) for label in {r[1] for r in rows}}
        cur.executemany("INSERT INTO replay_positions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [(ingest_id, segments[r[1]], r[0], r[2], r[3], r[4], r[5], r[6], r[7]) for r in rows])
        return Counts(rows_read=len(transcripts), positions=len(rows))

    stored = store_read(store, Delivery(key, name, "replay", run, "replay", now, meta=meta), write)
    return None if stored is None else len(rows)
