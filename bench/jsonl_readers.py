"""What reading top-k step logs costs, by reader: why the step log's fast path (specmon/formats/steplog_sql.py)
reads the logprob objects as JSON text and splits each with json_keys and json_extract rather than as MAPs.

    nice python bench/jsonl_readers.py [--positions 100000] [--workdir DIR]

On the two top-20 files of bench/ingest.py (the same 20 tokens at every position, and tokens that change per
position), each in a fresh process: DuckDB's read_json with the logprobs typed as MAP(VARCHAR, DOUBLE)[] (what
the checks and bounds would need), as MAP(INTEGER, DOUBLE)[], as VARCHAR[] (the objects left as text), and as
JSON[] with each object split into its keys and values by json_keys and json_extract (what the fast path does),
each reduced by a query that touches every value of both fields (nothing is stored); DuckDB's bare auto-detected
load; orjson.loads of every line; and orjson plus steplog.parse_steps (validation, p_token, q_token, beta's
bounds), which is the Python path. Then the floor of the fast path, stage by stage (each in a fresh process, wall
and CPU seconds): read_ndjson_objects alone; with the line's keys and fields decoded (json_keys, json_transform);
and with both top-k fields also split into keys and DOUBLE values, which every exact reading of the logprob
objects must do and the bare load does not (it stores each object as a STRUCT of fixed fields).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

from _common import machine, run_child
from ingest import write_jsonl, write_jsonl_varying

from specmon.formats.steplog_sql import _STRUCTURE  # the fields the fast path decodes, as it decodes them

TYPED = """
import json, time, duckdb
c = duckdb.connect()
c.execute('SET enable_progress_bar = false')  # its bar on stdout would hide the JSON line
cols = {{'request_id': 'VARCHAR', 'draft_tokens': 'BIGINT[]', 'accepted': 'BIGINT',
         'target_logprobs': {kind!r}, 'draft_logprobs': {kind!r}}}
touch = {touch!r}
t = time.perf_counter()
c.execute(f"SELECT count(*), sum({{touch}}) FROM read_json(?, format = 'newline_delimited', columns = {{cols}})",
          [{path!r}]).fetchall()
print(json.dumps({{'seconds': time.perf_counter() - t}}))
"""
BARE = """
import json, time, duckdb
c = duckdb.connect(); c.execute('SET enable_progress_bar = false'); t, cpu = time.perf_counter(), time.process_time()
c.execute("CREATE TABLE t AS SELECT * FROM read_json(?)", [{path!r}])
print(json.dumps({{'seconds': time.perf_counter() - t, 'cpu_seconds': time.process_time() - cpu,
                   'logprobs_type': c.execute("SELECT data_type FROM information_schema.columns WHERE "
                                              "column_name = 'target_logprobs'").fetchone()[0][:40]}}))
"""
PYTHON = """
import json, time, orjson
from specmon import steplog
with open({path!r}, 'rb') as fh:
    lines = fh.readlines()
t = time.perf_counter(); objs = [orjson.loads(line) for line in lines]; loads = time.perf_counter() - t
t = time.perf_counter()
for i in range(0, len(objs), 2048):
    steplog.parse_steps(objs[i:i + 2048])
print(json.dumps({{'orjson_s': loads, 'parse_steps_s': time.perf_counter() - t}}))
"""
STAGE = """
import json, time, duckdb
c = duckdb.connect()
c.execute('SET enable_progress_bar = false')
t, cpu = time.perf_counter(), time.process_time()
c.execute('''{query}''', [{path!r}]).fetchall()
print(json.dumps({{'seconds': time.perf_counter() - t, 'cpu_seconds': time.process_time() - cpu}}))
"""
_SPLIT = " + ".join(
    f"list_sum(list_transform(o.{field}, lambda x: len(json_keys(x)) + "
    "list_sum(TRY_CAST(CAST(json_extract(x, '$.*') AS VARCHAR[]) AS DOUBLE[]))))"
    for field in ("target_logprobs", "draft_logprobs"))
_DECODED = ("(SELECT json_keys(json) AS k, json_transform(json, '" + _STRUCTURE + "') AS o "
            "FROM read_ndjson_objects(?))")
STAGES = {  # name -> query over the file (? is its path); each reduces to one row, nothing is stored
    "fast path floor: read_ndjson_objects": "SELECT count(*), sum(length(json)) FROM read_ndjson_objects(?)",
    "fast path floor: + json_keys, json_transform": f"SELECT sum(len(k)), count(o.request_id) FROM {_DECODED}",
    "fast path floor: + top-k split": f"SELECT sum(len(k)), sum({_SPLIT}) FROM {_DECODED}",
}
TOUCH = {
    "MAP(VARCHAR, DOUBLE)[]": "list_sum(list_transform(target_logprobs, lambda m: list_sum(map_values(m)))) + "
                              "list_sum(list_transform(draft_logprobs, lambda m: list_sum(map_values(m))))",
    "MAP(INTEGER, DOUBLE)[]": "list_sum(list_transform(target_logprobs, lambda m: list_sum(map_values(m)))) + "
                              "list_sum(list_transform(draft_logprobs, lambda m: list_sum(map_values(m))))",
    "VARCHAR[]": "list_sum(list_transform(target_logprobs, lambda m: length(m))) + "
                 "list_sum(list_transform(draft_logprobs, lambda m: length(m)))",
    "JSON[]": " + ".join(
        f"list_sum(list_transform({field}, lambda o: len(json_keys(o)) + "
        "list_sum(TRY_CAST(CAST(json_extract(o, '$.*') AS VARCHAR[]) AS DOUBLE[]))))"
        for field in ("target_logprobs", "draft_logprobs")),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=100_000)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    w = args.workdir or tempfile.mkdtemp(prefix="specmon-bench-")
    os.makedirs(w, exist_ok=True)
    results: dict = {"machine": machine(), "positions": args.positions, "load_average_at_start": os.getloadavg()[0]}
    for name, writer in (("same_tokens", write_jsonl), ("varying_tokens", write_jsonl_varying)):
        path = os.path.join(w, f"{name}.jsonl")
        writer(path, args.positions)
        row: dict = {"file_mb": os.path.getsize(path) / 2**20}
        for kind, touch in TOUCH.items():
            row[f"read_json {kind}"] = run_child(TYPED.format(kind=kind, touch=touch, path=path))["seconds"]
        bare = run_child(BARE.format(path=path))
        row["bare read_json (auto)"], row["bare logprobs type"] = bare["seconds"], bare["logprobs_type"]
        row["bare read_json (auto) (CPU s)"] = bare["cpu_seconds"]
        for stage, query in STAGES.items():
            r = run_child(STAGE.format(query=query, path=path))
            row[f"{stage} (s)"], row[f"{stage} (CPU s)"] = r["seconds"], r["cpu_seconds"]
        py = run_child(PYTHON.format(path=path))
        row["orjson.loads"], row["orjson + parse_steps"] = py["orjson_s"], py["orjson_s"] + py["parse_steps_s"]
        results[name] = row
    results["load_average_at_end"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
