"""A synthetic vLLM V1 log whose acceptance drops: WINDOWS log lines 5 s apart, in vLLM's own format."""
from datetime import datetime, timedelta

import numpy as np

# vLLM V1's own format string (vllm/v1/spec_decode/metrics.py), as in tests/ingest/test_engine_logs.py
VLLM_V1 = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, Drafted "
           "throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: %s, "
           "Avg Draft acceptance rate: %.1f%%")

PREFIX = "(APIServer pid=4242) INFO 11-29 %s [metrics.py:86] "

K, WINDOWS, DROP_AT = 3, 1200, 900

# vLLM prints no year: the ingest takes the current one, or the previous one where that would be in the future
_NOW = datetime.now()

START = datetime(_NOW.year - (datetime(_NOW.year, 11, 29, 9) > _NOW), 11, 29, 8, 0, 0)


def vllm_log(path, seed=0):
    """WINDOWS lines 5 s apart; each window's drafts share a rate around 0.8 (0.3 from DROP_AT on)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(WINDOWS):
        mean = 0.8 if i < DROP_AT else 0.3
        r = rng.beta(mean * 40, (1 - mean) * 40)
        drafts = int(rng.integers(40, 120))
        alive = np.ones(drafts, dtype=bool)
        per_pos = []
        for _ in range(K):
            alive &= rng.random(drafts) < r
            per_pos.append(int(alive.sum()))
        acc = sum(per_pos)
        rates = ", ".join(f"{a / drafts:.3f}" for a in per_pos)
        ts = (START + timedelta(seconds=5 * i)).strftime("%H:%M:%S")
        lines.append(PREFIX % ts + VLLM_V1 % (1 + acc / drafts, acc / 5, drafts * K / 5, acc, drafts * K, rates,
                                              100 * acc / (drafts * K)))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def vllm_window_lines(start: datetime, end_us, drafts, accepted_per_position, window_s: float) -> str:
    """vLLM V1 lines for windows given as arrays (each window's end in microseconds after start, its drafts, and
    its accepted tokens per position), dated as vLLM dates them (month-day, no year)."""
    lines = []
    for end, n, per_pos in zip(end_us, drafts, accepted_per_position, strict=True):
        n, per_pos = int(n), [int(a) for a in per_pos]
        acc, k = sum(per_pos), len(per_pos)
        ts = (start + timedelta(microseconds=int(end))).strftime("%m-%d %H:%M:%S")
        rates = ", ".join(f"{a / n:.3f}" for a in per_pos)
        figures = (1 + acc / n, acc / window_s, n * k / window_s, acc, n * k, rates, 100 * acc / (n * k))
        lines.append(f"(APIServer pid=4242) INFO {ts} [metrics.py:86] " + VLLM_V1 % figures)
    return "\n".join(lines) + "\n"
