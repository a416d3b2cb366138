"""What reading top-k step logs costs, by reader and by stage of the step log's fast path
(specmon/ingest/formats/steplog_sql.py): where its time goes, and what rate any reader installable from PyPI allows.

    nice python bench/jsonl_readers.py [--positions 100000] [--workdir DIR] [--reuse] [--repeat 3]
                                       [--parts readers stages profile duckdb_types python_path]
                                       [--files same_tokens varying_tokens] [--out FILE]

The runs behind docs/benchmarks.md ("JSON Lines readers") are in bench/jsonl_readers.json.

On the two top-20 files of bench/ingest.py (the same 20 tokens at every position, and tokens that change per
position), every measurement in a fresh process, CPU seconds of all its threads beside the wall time:
- readers: DuckDB's bare auto-detected load (CREATE TABLE AS SELECT * FROM read_json, in memory), pyarrow.json,
  polars.read_ndjson, msgspec (untyped, and typed with the contract's fields), orjson line by line, and msgspec
  typed with every top-k entry gathered into numpy arrays (token ids, logprobs, entries per object): the least a
  reader outside DuckDB must do before any check, p_i(x_i) or bound (then, timed apart, the four cheapest checks on
  those arrays). Alternating reader by reader, `--repeat` times; median and range. pyarrow and polars turn each
  object's keys into struct fields (20 fixed ones on the same-token file, one per token of the file on the varying
  one, so they are timed there on its first 200 lines only, to show the width). A reader whose package is missing
  is reported as such.
- stages: the fast path's own query cut after each stage (read, trailing-comma screen, decode, split, checks, p and
  q, bounds, stored), cumulative; alternating, `--repeat` times.
- profile: specmon's whole ingest, statement by statement (staging, publishing, rollups, the file's hash).
- duckdb_types: read_json with the logprobs typed as MAP(VARCHAR, DOUBLE)[], MAP(INTEGER, DOUBLE)[], VARCHAR[] and
  JSON[] (split as the fast path does), each reduced by a query that touches every value of both fields.
- python_path: orjson.loads of every line, and orjson plus steplog.parse_steps (the Python path).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from _common import machine, run_child
from ingest import K, write_jsonl, write_jsonl_varying

FILES = {"same_tokens": write_jsonl, "varying_tokens": write_jsonl_varying}

# Each reader child imports its package (untimed), then reads the file named by `path`, timed.
READER = """
import json, time
info = {{}}
try:
{imports}
except ImportError as exc:
    print(json.dumps({{'missing': str(exc)}})); raise SystemExit
t, cpu = time.perf_counter(), time.process_time()
{body}
print(json.dumps({{'seconds': time.perf_counter() - t, 'cpu_seconds': time.process_time() - cpu, **info}}))
"""
_MSGSPEC_STEP = """
class Step(msgspec.Struct, forbid_unknown_fields=True):  # the contract's fields (no dense distributions)
    request_id: str
    draft_tokens: list[int]
    accepted: int
    ts: str | float | None = None
    k: int | None = None
    template: str | None = None
    temperature: float | None = None
    beta: list[float] | None = None
    target_ms: float | None = None
    draft_ms: float | list[float] | None = None
    emitted_tokens: list[int] | None = None
    target_logprobs: list[dict[str, float]] | None = None
    draft_logprobs: list[dict[str, float]] | None = None
with open(path, 'rb') as fh:
    steps = msgspec.json.Decoder(Step).decode_lines(fh.read())"""
READERS = {  # name -> (the child's imports, indented; its timed body, which may set info)
    "duckdb read_json (bare, auto)": ("    import duckdb", """
c = duckdb.connect(); c.execute('SET enable_progress_bar = false')  # its bar on stdout would hide the JSON
c.execute("CREATE TABLE t AS SELECT * FROM read_json(?)", [path])
info['logprobs_type'] = c.execute("SELECT data_type FROM information_schema.columns WHERE "
                                  "column_name = 'target_logprobs'").fetchone()[0][:40]"""),
    "pyarrow.json.read_json": ("    import pyarrow.json", """
table = pyarrow.json.read_json(path)
kind = table.schema.field('target_logprobs').type
info['logprobs_type'], info['struct_fields'] = str(kind)[:40], kind.value_type.num_fields"""),
    "polars.read_ndjson": ("    import polars", """
df = polars.read_ndjson(path)
kind = df.schema['target_logprobs']
info['logprobs_type'], info['struct_fields'] = str(kind)[:40], len(kind.inner.fields)"""),
    "msgspec decode_lines (untyped)": ("    import msgspec", """
with open(path, 'rb') as fh:
    steps = msgspec.json.Decoder().decode_lines(fh.read())"""),
    "msgspec decode_lines (typed)": ("    import msgspec", _MSGSPEC_STEP),
    "orjson.loads per line": ("    import orjson", """
with open(path, 'rb') as fh:
    steps = [orjson.loads(line) for line in fh]"""),
    "msgspec typed + top-k entries into numpy": ("    import msgspec, numpy as np", _MSGSPEC_STEP + """
decoded = time.process_time() - cpu
n, keys, values = [], [], []  # both fields' entries, object by object
for s in steps:
    for objs in (s.target_logprobs, s.draft_logprobs):
        for o in objs:
            n.append(len(o)); keys.extend(o); values.extend(o.values())
# the keys as one text parsed by numpy: the cheapest of the ways tried (int() per key, np.array(keys, int64),
# .astype(int64) of a string array took 2.2 to 12 times as long on 9M keys)
arrays = np.array(n, np.int64), np.fromstring(' '.join(keys), np.int64, sep=' '), np.array(values, np.float64)
info['decode_cpu_seconds'], info['entries'] = decoded, len(values)
# After the timed part: the four cheapest checks any path must make on these arrays (parse_step's finite and
# <= 1e-6, the probabilities, each object's listed mass, its keys distinct), timed on their own.
check = time.process_time(); counts, tokens, logprobs = arrays
starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
fine = bool(np.isfinite(logprobs).all() and logprobs.max() <= 1e-6)
mass = np.add.reduceat(np.exp(logprobs), starts) if len(starts) else np.zeros(0)
ids = np.sort(np.repeat(np.arange(len(counts)), counts) * 2**32 + tokens)
distinct = bool((np.diff(ids) != 0).all())
info['cheapest_checks_cpu_seconds'] = time.process_time() - check"""),
}
WIDE = ("pyarrow.json.read_json", "polars.read_ndjson")  # readers that make each token a struct field
WIDE_LINES = 200

PROFILE = """
import json, time
from specmon.ingest import pipeline
from specmon.store import database as store
from specmon.ingest.formats import steplog_jsonl, steplog_sql
spent = {{}}

class Timed:  # the cursor a stage is given, each statement's CPU seconds (all threads) added to `spent`
    def __init__(self, cur, where):
        self._cur, self._where = cur, where
    def __getattr__(self, name):
        return getattr(self._cur, name)
    def execute(self, sql, *args):
        c = time.process_time(); out = self._cur.execute(sql, *args)
        key = self._where + ': ' + ' '.join(sql.split()[:3])[:40]
        spent[key] = spent.get(key, 0.0) + time.process_time() - c
        return out

def timed(fn, where, cur_arg):
    def wrapped(*args, **kwargs):
        args = list(args); args[cur_arg] = Timed(args[cur_arg], where)
        return fn(*args, **kwargs)
    return wrapped

def clocked(fn, key):
    def wrapped(*args, **kwargs):
        c = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] = spent.get(key, 0.0) + time.process_time() - c
    return wrapped

steplog_sql.stage = timed(steplog_sql.stage, 'stage', 0)
steplog_jsonl.Reader.publish = timed(steplog_jsonl.Reader.publish, 'publish', 1)
pipeline.refresh_rollups = timed(pipeline.refresh_rollups, 'rollups', 0)
pipeline._hashed = clocked(pipeline._hashed, 'sha256 of the file')
pipeline._publish = clocked(pipeline._publish, 'publishing transaction, in all')
steplog_jsonl.Reader.prepare = clocked(steplog_jsonl.Reader.prepare, 'staging (fast path), in all')
s = store.Store({db!r}); t = time.perf_counter(); c = time.process_time(); r = pipeline.ingest_file(s, {path!r})
spent['ingest, in all (wall s)'], spent['ingest, in all'] = time.perf_counter() - t, time.process_time() - c
assert r.status == 'stored', r.faults
print(json.dumps(spent))
"""
# The fast path's own query (steplog_sql._steps_sql) cut after each stage: each query reduces that stage's columns
# to one row, so DuckDB computes what the stage and those before it need, and nothing after it.
QUERY_STAGE = """
import json, time
from specmon.ingest import steplog
from specmon.store import database as store
from specmon.ingest.formats import steplog_sql
c = store.connect(':memory:'); c.execute(steplog_sql._MACROS)
c.create_function('sm_iso', steplog_sql._iso, ['VARCHAR'], 'TIMESTAMP', type='arrow', side_effects=False)
sql = steplog_sql._steps_sql(False)
ctes, final = sql[:sql.rindex('SELECT g, acc')], sql[sql.rindex('SELECT g, acc'):]
query = {query!r}
text = query.replace('WHOLE', sql) if 'WHOLE' in query else ctes + query.replace('FINAL', '(' + final + ')')
params = {{'path': {path!r}, 'known': list(steplog_sql._FIELDS),
          'mass_limit': 1.0 + steplog.DEFAULT_SUM_TOLERANCE - 1e-9}}
t, cpu = time.perf_counter(), time.process_time()
c.execute(text, {{k: v for k, v in params.items() if '$' + k in text}})  # DuckDB refuses unused parameters
print(json.dumps({{'seconds': time.perf_counter() - t, 'cpu_seconds': time.process_time() - cpu}}))
"""
QUERY_STAGES = {  # name -> the query after the fast path's CTEs (FINAL: its last SELECT; WHOLE: all of it)
    "read the lines (read_ndjson_objects)": "SELECT count(*) FROM raw",
    "+ trailing-comma screen": "SELECT count(*), count(*) FILTER (trailing_comma) FROM raw",
    "+ decode the fields, list the keys": "SELECT count(*), count(*) FILTER (trailing_comma), sum(len(keys)), "
                                          "count(o.request_id) FROM raw",
    "+ split the top-k objects": "SELECT count(*) FILTER (trailing_comma), sum(len(keys)), sum(len(flatten(tk)) "
                                 "+ len(flatten(qk)) + list_sum(flatten(tv)) + list_sum(flatten(qv))), "
                                 "sum(len(d)), sum(acc) FROM fields",
    "+ every check (ok)": "SELECT count(*) FILTER (NOT ok) FROM FINAL",
    "+ p and q of the drafted tokens": "SELECT count(*) FILTER (NOT ok), sum(list_sum(pt) + list_sum(qt)) FROM FINAL",
    "+ beta's bounds (the whole query)": "SELECT count(*) FILTER (NOT ok), sum(list_sum(pt) + list_sum(qt)), "
                                         "sum(list_sum(blo) + list_sum(bhi)) FROM FINAL",
    "+ stored (CREATE TABLE fast_steps, as stage does)": "CREATE TABLE fast_steps AS WHOLE",
}

TYPED = """
import json, time, duckdb
c = duckdb.connect()
c.execute('SET enable_progress_bar = false')
cols = {{'request_id': 'VARCHAR', 'draft_tokens': 'BIGINT[]', 'accepted': 'BIGINT',
         'target_logprobs': {kind!r}, 'draft_logprobs': {kind!r}}}
touch = {touch!r}
t, cpu = time.perf_counter(), time.process_time()
c.execute(f"SELECT count(*), sum({{touch}}) FROM read_json(?, format = 'newline_delimited', columns = {{cols}})",
          [{path!r}]).fetchall()
print(json.dumps({{'seconds': time.perf_counter() - t, 'cpu_seconds': time.process_time() - cpu}}))
"""
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
PYTHON = """
import json, time, orjson
from specmon.ingest import steplog
with open({path!r}, 'rb') as fh:
    lines = fh.readlines()
t = time.process_time(); objs = [orjson.loads(line) for line in lines]; loads = time.process_time() - t
t = time.process_time()
for i in range(0, len(objs), 2048):
    steplog.parse_steps(objs[i:i + 2048])
print(json.dumps({{'orjson_cpu_s': loads, 'parse_steps_cpu_s': time.process_time() - t}}))
"""

def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def readers(path: str, name: str, positions: int, repeat: int, workdir: str) -> dict:
    """Every reader on the file, alternating reader by reader, `repeat` times."""
    head = os.path.join(workdir, f"{name}-first{WIDE_LINES}.jsonl")
    with open(path, "rb") as src, open(head, "wb") as out:
        out.writelines(line for _, line in zip(range(WIDE_LINES), src, strict=False))
    runs: dict[str, list[dict]] = {r: [] for r in READERS}
    for _ in range(repeat):
        for reader, (imports, body) in READERS.items():
            on = head if name == "varying_tokens" and reader in WIDE else path
            runs[reader].append(run_child(READER.format(imports=imports, body=f"path = {on!r}" + body)))
    out: dict = {}
    for reader, rs in runs.items():
        if "missing" in rs[0]:
            out[reader] = {"missing": rs[0]["missing"]}
            continue
        n = WIDE_LINES * K if name == "varying_tokens" and reader in WIDE else positions
        cpu = [r["cpu_seconds"] for r in rs]
        out[reader] = {"positions": n, "cpu_s": _spread(cpu), "wall_s": _spread([r["seconds"] for r in rs]),
                       "positions_per_cpu_s": n / statistics.median(cpu),
                       "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                       **{k: statistics.median(r[k] for r in rs) if isinstance(v, float) else v
                          for k, v in rs[0].items() if k not in ("seconds", "cpu_seconds", "peak_rss_mb", "wall_s")}}
    bare = out["duckdb read_json (bare, auto)"]["cpu_s"]["median"]
    for row in out.values():
        if "cpu_s" in row and row["positions"] == positions:
            row["cpu_ratio_to_bare"] = row["cpu_s"]["median"] / bare
    return out


def stages(path: str, repeat: int) -> dict:
    """The fast path's query cut after each stage, alternating stage by stage, `repeat` times."""
    runs: dict[str, list[dict]] = {stage: [] for stage in QUERY_STAGES}
    for _ in range(repeat):
        for stage, query in QUERY_STAGES.items():
            runs[stage].append(run_child(QUERY_STAGE.format(query=query, path=path)))
    return {stage: {"cpu_s": _spread([r["cpu_seconds"] for r in rs]), "wall_s": _spread([r["seconds"] for r in rs]),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in rs)} for stage, rs in runs.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=100_000)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--reuse", action="store_true", help="keep the input files already in --workdir")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each reader and each stage, alternating")
    parts = ("readers", "stages", "profile", "duckdb_types", "python_path")
    ap.add_argument("--parts", nargs="+", choices=parts, default=list(parts))
    ap.add_argument("--files", nargs="+", choices=list(FILES), default=list(FILES))
    ap.add_argument("--out", default=None, help="also write the results here (JSON)")
    args = ap.parse_args()
    w = args.workdir or tempfile.mkdtemp(prefix="specmon-bench-")
    os.makedirs(w, exist_ok=True)
    results: dict = {"machine": machine(), "positions": args.positions, "repeat": args.repeat,
                     "load_average_at_start": os.getloadavg()[0]}
    for name, writer in ((n, w) for n, w in FILES.items() if n in args.files):
        path = os.path.join(w, f"{name}.jsonl")
        if not (args.reuse and os.path.exists(path)):
            writer(path, args.positions)
        row: dict = {"file_mb": os.path.getsize(path) / 2**20}
        if "readers" in args.parts:
            row["readers"] = readers(path, name, args.positions, args.repeat, w)
        if "stages" in args.parts:
            row["fast path query, cumulative"] = stages(path, args.repeat)
        if "profile" in args.parts:
            db = os.path.join(w, f"{name}.duckdb")
            for p in (db, db + ".wal"):
                if os.path.exists(p):
                    os.remove(p)
            row["ingest profile (CPU s)"] = run_child(PROFILE.format(db=db, path=path))
        if "duckdb_types" in args.parts:
            row["read_json typed"] = {kind: run_child(TYPED.format(kind=kind, touch=touch, path=path))
                                      for kind, touch in TOUCH.items()}
        if "python_path" in args.parts:
            row["python path"] = run_child(PYTHON.format(path=path))
        results[name] = row
        results[f"load_average_after_{name}"] = os.getloadavg()[0]
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
