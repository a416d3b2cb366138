"""A day of one engine's 10-second windows stored as an engine log's would be, speculation annotated off every other
hour: the windows the Load page's intervals are tested (tests/analysis/test_load_windows.py) and measured
(bench/load_windows.py) on."""
from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from specmon.store.database import Store
from specmon.store.rows import add_ingest, get_or_create_run, get_or_create_segment

START = datetime(2026, 11, 30)
WINDOW_S = 10


def speculating(windows: int) -> np.ndarray:
    """Whether each window ran with speculation: on in even hours, off in odd ones, as the day's periods say."""
    return (np.arange(windows) // (3600 // WINDOW_S)) % 2 == 0


def store_day(store: Store, running: np.ndarray, throughput: np.ndarray, name: str = "day",
              per_position: bool = False, line_labels: bool = False) -> None:
    """Store a day of windows of run `prod` (engine "0"), `running` requests and `throughput` in each, with k = 2 and
    40 drafts a running request where speculating; `per_position`: their per-position counts too; `line_labels`:
    labels that also hold each line's own throughput, as vLLM's lines give them. The ingest is named `name`."""
    n = len(running)
    on = speculating(n)
    i = np.arange(n)
    labels = ([f'{{"accepted throughput": "{t:.2f} tokens/s", "engine": "0"}}' for t in throughput] if line_labels
              else '{"engine": "0"}')
    with store.transaction() as cur:
        run_id = get_or_create_run(cur, "prod", "engine", False, None)
        segment = get_or_create_segment(cur, run_id, "")
        ingest = add_ingest(cur, file_name="day", sha256=name, ingested_at=START, source_format="engine-log",
                            run_id=run_id)
        frame = pd.DataFrame({
            "ingest_id": ingest, "segment_id": segment, "engine": "vllm", "source": "vllm-v1-log", "line": i,
            "end_ts": [START + timedelta(seconds=WINDOW_S * int(t)) for t in i], "ts_inferred": False,
            "drafts": np.where(on, 40.0 * running, np.nan), "draft_tokens": np.where(on, 80.0 * running, np.nan),
            "accepted_tokens": np.where(on, 60.0 * running, np.nan), "k": np.where(on, 2, None),
            "accepted_per_position": [[35.0 * r, 25.0 * r] if s and per_position else None
                                      for r, s in zip(running, on, strict=True)],
            "labels": labels, "running_requests": running.astype(float), "generation_throughput": throughput})
        cur.register("frame", frame)
        cur.execute("INSERT INTO engine_windows BY NAME SELECT * FROM frame")
        cur.executemany("INSERT INTO speculation_periods (run_id, starts_at, speculation, created_at) "
                        "VALUES (?, ?, ?, ?)", [(run_id, START + timedelta(hours=h), h % 2 == 0, START)
                                                for h in range(-(-n * WINDOW_S // 3600))])
