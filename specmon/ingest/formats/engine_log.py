"""Engine text logs: vLLM (V1 and V0), llama.cpp (llama-server and the speculative examples) and SGLang.

Lines are read by the key phrase that marks an engine's speculative-decoding line, then field by field by name
(`key: value` pairs anywhere after the phrase), so reordered, added or missing optional fields do not matter. A
line with the key phrase that lacks a required field, or holds a value that cannot be a count, is a fault with
its line number and the field's name. Every other line of a server log is skipped.

How each engine's figures become counts (the README's engine table says the same per engine and version):
- vLLM V1 prints per interval Accepted and Drafted tokens and the per-position rate accepted_at_i / drafts.
  drafts = Drafted / depth, the depth being `Current speculative depth` where printed, else the length of the
  per-position list; where that disagrees with the printed mean acceptance length (1 + Accepted / drafts, to two
  decimals) the depth changed within the interval and drafts = Accepted / (sum of per-position rates), rounded.
- vLLM V0 prints running totals since the engine started. The first line of a process is the window from the
  start to that line, later lines are differences, a fall is a restart. V0's "accepted tokens" counts positions
  accepted even after the first rejection, so accepted-prefix tokens are emitted - drafts (each step emits its
  accepted prefix and one more token) and L = emitted / drafts; V0's own count is kept as a label.
- llama-server prints, per request, accepted / generated draft tokens and the mean acceptance length (1 +
  accepted / drafts): drafts = accepted / (sum of per-position rates) or accepted / (L - 1), rounded. Where a
  line gives no length, the `statistics <drafter>: #calls(b,g,a) = B ..., #gen drafts = N, ...` lines after it
  (running totals of the slot's drafter, B counting requests) give the request's drafts as the difference from
  that drafter's previous line (or N itself when B is 1), used only where their token counts match the request's.
- llama.cpp's examples print n_drafted and n_accept; their n_draft is the final draft length, which an adaptive
  (heuristic) run changes as it goes, so it is kept as a label, not taken for k.
- SGLang prints gauges: accept len (tokens per step, bonus included) and, in most releases, accept rate, whose
  definition changed (older: accept len / draft tokens per round, bonus included; newer: (accept len - 1) / draft
  tokens per round). Which one a line uses is inferred where only one fits the printed figures, else unknown.

The load each window ran at comes from the engines' throughput lines. vLLM logs, per engine and interval, `[Engine
NNN: ]Avg prompt throughput: X tokens/s, Avg generation throughput: Y tokens/s, Running: N reqs, Waiting: M reqs,
...` (V0: `Running: N reqs, Swapped: S reqs, Pending: P reqs`) and, from the same call, right after it, the
speculative line of that engine (vllm/v1/metrics/loggers.py, LoggingStatLogger.log; vllm/engine/metrics.py in V0).
The speculative line does not name its engine, so it is paired with the last unpaired load line of its own process
(data-parallel engines log one pair after another). A load line that no speculative line follows is a window of
its own with the load alone: an engine without speculation, or an interval in which nothing was drafted (vLLM
prints no speculative line then). SGLang's `Decode batch` lines carry #running-req, gen throughput and #queue-req,
with or without accept len.
"""
from __future__ import annotations

import calendar
import math
import re
from collections.abc import Iterator
from datetime import datetime, timezone

from specmon.core.faults import Fault, RowFault
from specmon.core.limits import MAX_COUNT, MAX_ENGINE_K, MAX_ENGINE_LINE_BYTES
from specmon.ingest.formats import textio
from specmon.ingest.formats.engine_window import Batch, EngineWindow, WindowReader

FORMATS = ("engine-log",)
SOURCE = "engine"
SNIFF_ORDER = 20
SCAN_ANYWHERE = True  # a server log prints pages of start-up lines before its first metrics line

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# compiled once: number() and count() run several times on every speculative line
_NUMBER = re.compile(_NUM)
_COUNTS = {unit: re.compile(r"(\d+)" + (rf"\s*{unit}" if unit else "")) for unit in ("", "tokens")}
_VLLM_TS = re.compile(r"(?:^|\s)[A-Z]+ (\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})")
_ISO_TS = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})")
_PROCESS = re.compile(r"\(([^()]*\bpid=\d+)\)")  # vLLM's "(APIServer pid=N) " / "(EngineCore_0 pid=N) " prefix
_PROCESS_AT_START = re.compile(r"\((\w+ pid=\d+)\)")  # the usual place and shape, tried first
_FIELD = re.compile(r"(?:^|,)\s*([A-Za-z#][A-Za-z0-9 _/#()-]*?)\s*:\s")
_LLAMA_COUNTS = re.compile(r"\(\s*(\d+) accepted /\s*(\d+) generated\)")
_LLAMA_RATE = re.compile(r"draft acceptance(?: rate)? = (" + _NUM + ")")
_LLAMA_MEAN = re.compile(r"mean (?:acceptance length|len) =\s*(" + _NUM + ")")
_LLAMA_PER_POS = re.compile(r"(?:acceptance rate per position|acc per pos) = \(([^)]*)\)")
_LLAMA_SLOT = re.compile(r"print_timing: id\s+(\d+)")
_LLAMA_STATS = re.compile(r"\bstatistics\s+([\w.-]+):(.*)")
_LLAMA_CALLS = re.compile(r"#calls\(b,g,a\)\s*=\s*(\d+)\s+\d+\s+\d+")
_LLAMA_EXAMPLE = re.compile(r"^\s*(n_draft|n_predict|n_drafted|n_accept|accept)\s*=\s*(" + _NUM + r")%?\s*$")
# vLLM's load line as V1 prints it; other shapes (V0, n/a, reordered fields) are read field by field.
_RATE = r"(\d{1,15}(?:\.\d*)?)"
_LOAD_FAST = re.compile(r"Avg prompt throughput: " + _RATE + r" tokens/s, Avg generation throughput: " + _RATE
                        + r" tokens/s, Running: (\d{1,15}) reqs, Waiting: (\d{1,15}) reqs(?:,|\s*$)")
# [ \t], not \s: \s* at each of n blank lines' starts would run over all the blank lines after it (quadratic)
_EXAMPLE_SNIFF = re.compile(r"^[ \t]*n_drafted[ \t]*=", re.M)
_ENGINES_AGGREGATED = re.compile(r"(\d+) Engines Aggregated:\s*$")
_SGLANG_RANK = re.compile(r"\[[^\]]*\b(DP\d+)\b[^\]]*\]")

V1 = "SpecDecoding metrics:"
V0 = "Speculative metrics:"
LLAMA_SERVER = "draft acceptance"
ACC_PER_POS = "acc per pos"
SGLANG = "Decode batch"
LOAD = "Avg generation throughput:"
PROMPT = "Avg prompt throughput:"
KEY_PHRASES = (V1, V0, LLAMA_SERVER, ACC_PER_POS, LOAD)
SGLANG_LOAD = ("#running-req", "gen throughput (token/s)")


# ---- values ---------------------------------------------------------------------------------------------------

def fields(text: str) -> dict[str, str]:
    """`Key: value, Key: value` pairs by name (keys lower-cased); a value runs to the next key, so lists of numbers
    with commas in them stay whole."""
    found = list(_FIELD.finditer(text))
    out = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        out[m.group(1).strip().lower()] = text[m.end():end].strip().rstrip(",.").strip()
    return out


def count(name: str, text: str | None, unit: str = "") -> int:
    """A non-negative integer count, optionally followed by its unit ("262 tokens")."""
    m = _COUNTS[unit].fullmatch((text or "").strip())
    if not m:
        raise RowFault(name, f"expected a count{' of ' + unit if unit else ''}, got {text!r}")
    value = int(m.group(1)) if len(m.group(1)) <= 17 else MAX_COUNT + 1  # no giant int is ever built
    if value > MAX_COUNT:
        raise RowFault(name, f"{m.group(1)[:20]}... is beyond the counts specmon stores exactly (2^53)")
    return value


def number(name: str, text: str | None, *, percent: bool = False) -> float | None:
    """A finite number (None for vLLM's 'nan', printed when nothing was drafted); '%' divides by 100."""
    t = (text or "").strip()
    if percent:
        t = t.removesuffix("%").strip()
    if t.lower() == "nan":
        return None
    if not _NUMBER.fullmatch(t) or not math.isfinite(float(t)):
        raise RowFault(name, f"expected a number, got {text!r}")
    return float(t) / 100 if percent else float(t)


def rates(name: str, text: str) -> list[float]:
    """A comma-separated list of rates in [0, 1], bounded in length before it is built."""
    if text.count(",") >= MAX_ENGINE_K:
        raise RowFault(name, f"lists more than {MAX_ENGINE_K} positions (specmon reads draft lengths up to "
                             f"{MAX_ENGINE_K})")
    out = []
    for item in (t.strip() for t in text.split(",")):
        value = number(name, item)
        if value is None or not 0 <= value <= 1:
            raise RowFault(name, f"expected rates between 0 and 1, got {item!r}")
        out.append(value)
    return out


def depth(name: str, value: int) -> int:
    if not 1 <= value <= MAX_ENGINE_K:
        raise RowFault(name, f"{value} speculative tokens; specmon reads 1 to {MAX_ENGINE_K}")
    return value


def _not_available(text: str) -> bool:
    return text.lower() in ("n/a", "na", "nan", "-")


def throughput(name: str, text: str | None) -> float | None:
    """Tokens per second as engines print them ("50.3 tokens/s", "410.50"); None where printed as n/a."""
    t = (text or "").strip().removesuffix("tokens/s").strip()
    if _not_available(t):
        return None
    value = number(name, t)
    if value is None or value < 0:
        raise RowFault(name, f"expected tokens/s >= 0, got {text!r}")
    return value


def requests(name: str, text: str | None) -> float | None:
    """A number of requests ("4 reqs", "4"); None where printed as n/a."""
    t = (text or "").strip().removesuffix("reqs").strip()
    return None if _not_available(t) else float(count(name, t))


def vllm_load(line: str) -> tuple[str, float | None, float | None, float | None, float | None, str]:
    """(engine, running, waiting, generation tokens/s, prompt tokens/s, source) of a vLLM load line. engine is
    the `Engine NNN:` index, 'N engines aggregated', or '' where the release prints no label; V0's Pending
    requests are its waiting ones."""
    at = line.find(PROMPT)
    if at < 0:
        at = line.find(LOAD)
    engine = ""
    named = line.rfind("Engine", max(0, at - 24), at)  # the label ends right before the figures
    if named >= 0:
        engine = line[named + 6:at].strip(" :")
        if not engine.isdigit():
            label = _ENGINES_AGGREGATED.search(line, max(0, at - 40), at)
            engine = f"{label.group(1)} engines aggregated" if label else ""
    fast = _LOAD_FAST.match(line, at)
    if fast:  # the common V1 shape, without building the field dict
        prompt, generation, running, waiting = fast.groups()
        return engine, float(running), float(waiting), float(generation), float(prompt), "vllm-v1-log"
    f = fields(line[at:])
    if "running" not in f:
        raise RowFault("Running", "a load line without 'Running: N reqs'")
    waiting = "waiting" if "waiting" in f else "pending" if "pending" in f else None
    return (engine, requests("Running", f["running"]),
            requests(waiting.capitalize(), f[waiting]) if waiting else None,
            throughput("Avg generation throughput", f.get("avg generation throughput")),
            throughput("Avg prompt throughput", f["avg prompt throughput"]) if "avg prompt throughput" in f else None,
            "vllm-v0-log" if "swapped" in f or "pending" in f else "vllm-v1-log")


def sglang_load(w: EngineWindow, f: dict[str, str]) -> None:
    """SGLang's #running-req, gen throughput (token/s) and #queue-req, where the Decode batch line prints them."""
    if "#running-req" in f:
        w.running_requests = requests("#running-req", f["#running-req"])
    if "gen throughput (token/s)" in f:
        w.generation_throughput = throughput("gen throughput (token/s)", f["gen throughput (token/s)"])
    if "#queue-req" in f:
        w.waiting_requests = requests("#queue-req", f["#queue-req"])


class _Timestamps:
    """Times in log lines. vLLM prints month-day without a year: the year is the latest one at or before the
    ingest's in which that date exists and is not in the future (Feb 29 goes to the last leap year)."""

    def __init__(self, now: datetime):
        self.now = now

    def parse(self, line: str) -> datetime | None:
        m = _ISO_TS.search(line)
        if m:
            try:
                year, month, day, hour, minute, second = (int(g) for g in m.groups())
                return datetime(year, month, day, hour, minute, second)
            except ValueError:
                raise RowFault("time", f"{m.group(0)!r} is not a date and time") from None
        m = _VLLM_TS.search(line)
        if not m:
            return None
        month, day, hh, mm, ss = (int(g) for g in m.groups())
        for year in range(self.now.year, self.now.year - 9, -1):
            if month == 2 and day == 29 and not calendar.isleap(year):
                continue
            try:
                ts = datetime(year, month, day, hh, mm, ss)
            except ValueError:
                raise RowFault("time", f"{m.group(0).strip()!r} is not a date and time") from None
            if ts <= self.now:
                return ts
        raise RowFault("time", f"{m.group(0).strip()!r} is not a date and time")


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts else None


def _from_iso(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _window_state(w: EngineWindow) -> dict:
    return {**w.__dict__, "end_ts": _iso(w.end_ts), "start_ts": _iso(w.start_ts)}


def _window_from_state(d: dict) -> EngineWindow:
    return EngineWindow(**{**d, "end_ts": _from_iso(d["end_ts"]), "start_ts": _from_iso(d["start_ts"])})


# ---- lines ----------------------------------------------------------------------------------------------------

def _drafts_from_rates(accepted: int, per_pos: list[float] | None, mean_len: float | None) -> float | None:
    """Verification steps from accepted tokens and the per-position rates (3 decimals) or the mean acceptance
    length (2 decimals): a count, so rounded."""
    per_step = sum(per_pos) if per_pos else (mean_len - 1 if mean_len is not None else None)
    if not accepted or not per_step or per_step <= 0:
        return None
    return float(round(accepted / per_step))


def _vllm_v1(f: dict[str, str], no: int, ts: datetime | None) -> EngineWindow | None:
    accepted = count("Accepted", f.get("accepted"), "tokens")
    drafted = count("Drafted", f.get("drafted"), "tokens")
    if accepted > drafted:
        raise RowFault("Accepted", f"{accepted} accepted of {drafted} drafted tokens")
    if drafted == 0:
        return None  # an interval with nothing drafted
    mean_len = number("Mean acceptance length", f.get("mean acceptance length")) \
        if "mean acceptance length" in f else None
    per_pos = rates("Per-position acceptance rate", f["per-position acceptance rate"]) \
        if "per-position acceptance rate" in f else None
    current = depth("Current speculative depth", count("Current speculative depth",
                                                       f["current speculative depth"])) \
        if "current speculative depth" in f else None
    rate_key = next((k for k in ("avg draft acceptance rate", "draft acceptance rate") if k in f), None)
    rate = number(rate_key, f[rate_key], percent=True) if rate_key else None
    k = len(per_pos) if per_pos else current
    per_draft = current or k
    drafts = drafted / per_draft if per_draft else None
    if drafts is not None and mean_len is not None and abs(1 + accepted / drafts - mean_len) > 0.0051:
        drafts = _drafts_from_rates(accepted, per_pos, mean_len)  # the depth changed within the interval
    elif drafts is None:
        drafts = _drafts_from_rates(accepted, per_pos, mean_len)
    used = {"accepted", "drafted", "mean acceptance length", "per-position acceptance rate",
            "current speculative depth", "avg draft acceptance rate", "draft acceptance rate"}
    labels: dict[str, str | int] = {key: value for key, value in f.items() if key not in used}
    if current is not None:
        labels["current speculative depth"] = current
    shape = "vllm-v1-log" if per_pos is not None else "vllm-v1-early-log"
    return EngineWindow("vllm", shape, no, ts, None, drafts, float(drafted), float(accepted),
                        _counts(per_pos, drafts), k, mean_len, rate, labels)


def _vllm_v0(f: dict[str, str]) -> tuple[int, int, int, int | None]:
    """(k, draft tokens, emitted tokens, V0's accepted count or None): running totals."""
    k = depth("Number of speculative tokens", count("Number of speculative tokens",
                                                    f.get("number of speculative tokens")))
    drafted = count("Number of draft tokens", f.get("number of draft tokens"))
    emitted = count("Number of emitted tokens", f.get("number of emitted tokens"))
    accepted = count("Number of accepted tokens", f["number of accepted tokens"]) \
        if "number of accepted tokens" in f else None
    if drafted % k:
        raise RowFault("Number of draft tokens", f"{drafted} is not a multiple of k = {k}")
    if not drafted // k <= emitted <= drafted // k * (k + 1):
        raise RowFault("Number of emitted tokens", f"{emitted} emitted in {drafted // k} steps of k = {k}: each "
                                                   f"step emits 1 to k + 1 tokens")
    return k, drafted, emitted, accepted


def _v0_fields(text: str) -> dict[str, str]:
    """A V0 line's fields; vLLM 0.5 printed 'Number of draft tokens tokens' and 'Number of emitted tokens
    tokens'."""
    f = fields(text)
    for key in ("number of draft tokens", "number of emitted tokens"):
        if key not in f and f"{key} tokens" in f:
            f[key] = f.pop(f"{key} tokens")
    return f


def _is_v1_interval(f: dict[str, str]) -> bool:
    """vLLM's first V1 releases (0.8) printed per-interval counts under V0's 'Speculative metrics:' phrase, with no
    k or no emitted count, or with 'System efficiency: nan'; V0's running totals always carry all three."""
    return "number of speculative tokens" not in f or "number of emitted tokens" not in f \
        or f.get("system efficiency", "").lower() == "nan"


def _vllm_v1_interval(f: dict[str, str], no: int, ts: datetime | None) -> EngineWindow | None:
    accepted = count("Number of accepted tokens", f.get("number of accepted tokens"))
    drafted = count("Number of draft tokens", f.get("number of draft tokens"))
    if accepted > drafted:
        raise RowFault("Number of accepted tokens", f"{accepted} accepted of {drafted} drafted tokens")
    if drafted == 0:
        return None
    k = depth("Number of speculative tokens",
              count("Number of speculative tokens", f["number of speculative tokens"])) \
        if "number of speculative tokens" in f else None
    drafts = drafted / k if k else None
    rate = number("Draft acceptance rate", f["draft acceptance rate"]) if "draft acceptance rate" in f else None
    return EngineWindow("vllm", "vllm-v1-0.8-log", no, ts, None, drafts, float(drafted), float(accepted), None, k,
                        1 + accepted / drafts if drafts else None, rate)


def _llama_server(line: str, no: int, ts: datetime | None) -> EngineWindow:
    m = _LLAMA_COUNTS.search(line)
    if not m:
        raise RowFault("accepted / generated", "no '(N accepted / M generated)' in the line")
    accepted, generated = count("accepted", m.group(1)), count("generated", m.group(2))
    if accepted > generated:
        raise RowFault("accepted", f"{accepted} accepted of {generated} generated draft tokens")
    rate = _LLAMA_RATE.search(line)
    mean = _LLAMA_MEAN.search(line)
    pp = _LLAMA_PER_POS.search(line)
    mean_len = number("mean acceptance length", mean.group(1)) if mean else None
    per_pos = rates("acceptance rate per position", pp.group(1)) if pp else None
    drafts = _drafts_from_rates(accepted, per_pos, mean_len)
    w = EngineWindow("llama.cpp", "llama-server", no, ts, None, drafts, float(generated), float(accepted), None,
                     None, mean_len, number("draft acceptance", rate.group(1)) if rate else None)
    _attach_per_position(w, per_pos)
    return w


def _counts(per_pos: list[float] | None, drafts: float | None) -> list[float] | None:
    """Per-position counts from rates printed to 3 decimals: rate x drafts, rounded to the integer a count is where
    drafts is one (the rounding error, under 0.5, is below the printed rates' own 0.0005 x drafts beyond 1000)."""
    if not per_pos or not drafts:
        return None
    exact = float(drafts).is_integer()
    return [float(round(r * drafts)) if exact else r * drafts for r in per_pos]


def _attach_per_position(w: EngineWindow, per_pos: list[float] | None) -> None:
    if per_pos and w.drafts is not None:
        w.accepted_per_position = _counts(per_pos, w.drafts)
        w.k = len(per_pos)


def _sglang(f: dict[str, str], no: int, ts: datetime | None) -> EngineWindow:
    mean_len = number("accept len", f.get("accept len"))
    if mean_len is None or mean_len < 1:
        raise RowFault("accept len", f"expected tokens per step >= 1, got {f.get('accept len')!r}")
    rate = number("accept rate", f["accept rate"]) if "accept rate" in f else None
    labels = {}
    if rate is not None:
        labels["accept rate definition"] = sglang_rate_definition(mean_len, rate)
    return EngineWindow("sglang", "sglang-log", no, ts, mean_acceptance_length=mean_len, reported_rate=rate,
                        labels=labels)


def sglang_rate_definition(accept_len: float, rate: float) -> str:
    """Which of SGLang's accept-rate definitions fits a line: 'accept len / n' (older) or '(accept len - 1) / n'
    (newer), n being the draft tokens per round (an integer >= 1); 'unknown' where both or neither fit the two
    printed decimals."""
    def fits(numerator: float) -> bool:
        lo_num, hi_num = numerator - 0.005, numerator + 0.005
        lo_r, hi_r = max(rate - 0.005, 1e-9), rate + 0.005
        lo, hi = lo_num / hi_r, hi_num / lo_r
        return rate > 0 and math.floor(hi) >= max(1, math.ceil(lo))

    old, new = fits(accept_len), fits(accept_len - 1)
    return "accept len / draft tokens" if old and not new else \
        "(accept len - 1) / draft tokens" if new and not old else "unknown"


def _kind(line: str) -> str:
    """Which engine line this is, in words, for faults."""
    for phrase, what in ((ACC_PER_POS, "llama-server 'acc per pos' line"),
                         (V1, "vLLM 'SpecDecoding metrics' line"), (V0, "vLLM V0 'Speculative metrics' line"),
                         (LLAMA_SERVER, "llama-server 'draft acceptance' line"),
                         (SGLANG, "SGLang 'Decode batch' line")):
        if phrase in line:
            return what
    if LOAD in line:
        return "vLLM load line ('Avg generation throughput')"
    return "llama.cpp speculative example summary"


# ---- the reader -----------------------------------------------------------------------------------------------

class EngineLogReader:
    """Reads an engine's text log one complete line at a time; can stop after any line and resume later.

    What must survive between reads is in state(): vLLM V0's last running totals per process, the time of each
    vLLM engine's last line (the next window's start), each process's load line still waiting for its speculative
    line, the llama.cpp example's n_* fields seen so far, and a llama-server window that may still get its "acc
    per pos" line. A window waiting for that line is released by the next line of any other kind, a load line by
    the next load line of its process; finish() releases both at the end of a file.
    """

    def __init__(self, name: str, now: datetime, state: dict | None = None) -> None:
        self.name = name
        self._stamps = _Timestamps(now)
        state = state or {}
        self._v0: dict[str, list] = {p: list(v) for p, v in state.get("v0", {}).items()}
        self._v1_last: dict[str, str] = dict(state.get("v1_last", {}))
        # per process: (line number, line, engine, running, waiting, generation, prompt, source) of its last load
        # line, until the speculative line of the same interval (or the next load line) comes
        self._load: dict[str, tuple] = {p: tuple(v) for p, v in state.get("load", {}).items()}
        self._example: dict[str, str] = dict(state.get("example", {}))
        pending = state.get("pending")
        self._pending: EngineWindow | None = _window_from_state(pending) if pending else None
        self._slot: str = state.get("slot", "")  # the llama-server slot of the last print_timing line
        self._stats: dict[str, list[int]] = {k: list(v) for k, v in state.get("stats", {}).items()}
        self._pending_stats: list[list[int] | None] = [None if x is None else list(x)
                                                       for x in state.get("pending_stats", [])]
        self._windows: list[EngineWindow] = []
        self._faults: list[Fault] = []

    def state(self) -> dict:
        """A JSON-serialisable carry-over: EngineLogReader(name, now, state=r.state()) continues where r stopped."""
        return {"v0": {p: list(v) for p, v in self._v0.items()}, "v1_last": dict(self._v1_last),
                "load": {p: list(v) for p, v in self._load.items()}, "example": dict(self._example),
                "pending": _window_state(self._pending) if self._pending else None, "slot": self._slot,
                "stats": {k: list(v) for k, v in self._stats.items()},
                "pending_stats": [None if x is None else list(x) for x in self._pending_stats]}

    def take(self) -> tuple[list[EngineWindow], list[Fault]]:
        """The windows and faults found since the last take (a window still waiting for a line is kept back)."""
        windows, faults = self._windows, self._faults
        self._windows, self._faults = [], []
        return windows, faults

    def finish(self) -> None:
        """The file ends here: release the windows that were waiting for a following line."""
        self._release()
        for process in list(self._load):
            self._load_alone(process, self._load.pop(process))

    def _load_alone(self, process: str, load: tuple) -> None:
        """A load line that no speculative line followed: a window with the load and no speculative figures."""
        no, line, engine, running, waiting, generation, prompt, source = load
        try:
            ts = self._stamps.parse(line)
        except RowFault as exc:
            self._faults.append(Fault(self.name, no, exc.field, f"{_kind(line)}: {exc.reason}"))
            return
        w = EngineWindow("vllm", source, no, ts, labels={"engine": engine} if engine else {})
        self._with_load(w, process, load)
        self._windows.append(w)

    def _with_load(self, w: EngineWindow, process: str, load: tuple | None) -> None:
        """Put the load of its interval on a vLLM window, and its start: the previous line of its engine. Engine
        0 keeps the process's clock (a single engine prints `Engine 000` in some releases and nothing in others);
        a data-parallel engine has its own."""
        clock = process
        if load is not None:
            w.running_requests, w.waiting_requests, w.generation_throughput, w.prompt_throughput = load[3:7]
            engine = load[2]
            if engine:
                w.labels["engine"] = engine
                if engine.strip("0"):
                    clock = f"{process} engine {engine}"
        if w.source != "vllm-v0-log" or w.load_only:  # V0's speculative windows start at their previous totals
            w.start_ts = _from_iso(self._v1_last.get(clock))
        if w.end_ts:
            self._v1_last[clock] = w.end_ts.isoformat()

    def _release(self) -> None:
        if self._pending is None:  # every line of a log comes here: no work when nothing waits
            return
        w, stats = self._pending, self._pending_stats
        self._pending, self._pending_stats = None, []
        known = [x for x in stats if x is not None]
        if w.drafts is None and stats and len(known) == len(stats) and sum(x[1] for x in known) == w.draft_tokens \
                and sum(x[2] for x in known) == w.accepted_tokens and sum(x[0] for x in known) > 0:
            w.drafts = float(sum(x[0] for x in known))
            w.mean_acceptance_length = 1 + w.accepted_tokens / w.drafts
            w.labels["drafts from"] = "llama.cpp statistics lines"
        self._windows.append(w)

    def _statistics(self, line: str) -> bool:
        """A llama-server `statistics <drafter>:` line: running totals of the slot's drafter. Returns whether the
        line was one; its increment since that drafter's previous line goes with the window waiting for it."""
        m = _LLAMA_STATS.search(line)
        if not m:
            return False
        rest = m.group(2)
        calls = _LLAMA_CALLS.search(rest)
        searched = [re.search(re.escape(key) + r"\s*=\s*(\d+)", rest) for key in
                    ("#gen drafts", "#gen tokens", "#acc tokens")]
        found = [f for f in searched if f is not None]
        if calls is None or len(found) < len(searched):
            return True  # an older statistics line without the request count: nothing to learn from it
        begins = count("#calls(b,g,a)", calls.group(1))
        totals = [count(key, f.group(1))
                  for key, f in zip(("#gen drafts", "#gen tokens", "#acc tokens"), found, strict=True)]
        key = f"{self._slot}/{m.group(1)}"
        prev = self._stats.get(key)
        self._stats[key] = [begins] + totals
        if begins == 1:
            increment = totals
        elif prev is not None and begins == prev[0] + 1 and all(t >= p for t, p in zip(totals, prev[1:], strict=True)):
            increment = [t - p for t, p in zip(totals, prev[1:], strict=True)]
        else:
            increment = None  # requests of this drafter were not all in this log
        if self._pending is not None:
            self._pending_stats.append(increment)
        return True

    def feed(self, line_no: int, line: str, *, cut: bool = False) -> None:
        """Read one complete line (with or without its newline). cut: the line was longer than the bound and this
        is its beginning (a reader that bounds its reads says so; a longer line given whole is cut here)."""
        if cut or len(line) > MAX_ENGINE_LINE_BYTES:
            head = line[:MAX_ENGINE_LINE_BYTES]
            if any(p in head for p in KEY_PHRASES) or SGLANG in head:
                self._release()
                self._faults.append(Fault(self.name, line_no, "", f"line longer than {MAX_ENGINE_LINE_BYTES} "
                                                                  "bytes; engine lines are far shorter"))
            return
        try:
            self._line(line_no, line)
        except RowFault as exc:
            self._faults.append(Fault(self.name, line_no, exc.field, f"{_kind(line)}: {exc.reason}"))

    def _line(self, no: int, line: str) -> None:
        slot = _LLAMA_SLOT.search(line) if "print_timing" in line else None
        if slot:
            self._slot = slot.group(1)
        if "statistics" in line and self._statistics(line):
            return
        if ACC_PER_POS in line:
            w, self._pending = self._pending, None
            if w is None or w.drafts is None or w.accepted_per_position is not None:
                if w is not None:
                    self._windows.append(w)
                raise RowFault("acc per pos", "no llama-server 'draft acceptance' line with a mean length before it")
            m = _LLAMA_PER_POS.search(line)
            try:
                _attach_per_position(w, rates("acc per pos", m.group(1) if m else ""))
            finally:
                self._windows.append(w)
            return
        self._release()
        if V1 in line:
            self._v1_line(no, line)
        elif V0 in line:
            self._v0_line(no, line)
        elif LOAD in line:
            self._load_line(no, line)
        elif LLAMA_SERVER in line:
            self._pending = _llama_server(line, no, self._stamps.parse(line))
        elif SGLANG in line:
            self._sglang_line(no, line)
        else:
            example = _LLAMA_EXAMPLE.match(line)
            if example:
                self._example_line(no, example)

    def _v1_line(self, no: int, line: str) -> None:
        process = self._process(line)
        # taken before the line is read: a speculative line that is a fault takes its load line with it, which
        # would otherwise pass for an interval without speculation
        load = self._load.pop(process, None)
        w = _vllm_v1(fields(line.split(V1, 1)[1]), no, self._stamps.parse(line))
        if w is None:
            if load is not None:
                self._load_alone(process, load)
            return
        self._with_load(w, process, load)
        self._windows.append(w)

    def _load_line(self, no: int, line: str) -> None:
        """A vLLM load line waits for the speculative line of its interval; the process's previous one, if still
        waiting, had none."""
        load = (no, line, *vllm_load(line))
        process = self._process(line)
        earlier = self._load.get(process)
        if earlier is not None:
            self._load_alone(process, earlier)
        self._load[process] = load

    def _sglang_line(self, no: int, line: str) -> None:
        """A Decode batch line: with accept len a speculative window, without it (speculation off) the load
        alone; both carry #running-req, gen throughput and #queue-req."""
        f = fields(line.split(SGLANG, 1)[1].lstrip(".,"))
        if "accept len" in f:
            w = _sglang(f, no, self._stamps.parse(line))
        elif all(key in f for key in SGLANG_LOAD):
            w = EngineWindow("sglang", "sglang-log", no, self._stamps.parse(line))
        else:
            return
        sglang_load(w, f)
        rank = _SGLANG_RANK.search(line)
        if rank:
            w.labels["engine"] = rank.group(1)  # one line per data-parallel rank
        self._windows.append(w)

    @staticmethod
    def _process(line: str) -> str:
        m = _PROCESS_AT_START.match(line) or _PROCESS.search(line)
        return m.group(1) if m else ""  # no prefix: the whole file is one process

    def _v0_line(self, no: int, line: str) -> None:
        process = self._process(line)
        load = self._load.pop(process, None)  # before the line is read, as for V1
        ts = self._stamps.parse(line)
        f = _v0_fields(line.split(V0, 1)[1])
        if _is_v1_interval(f):
            w = _vllm_v1_interval(f, no, ts)
            if w is not None:
                self._with_load(w, process, load)
                self._windows.append(w)
            elif load is not None:
                self._load_alone(process, load)
            return
        k, drafted, emitted, accepted = _vllm_v0(f)
        prev = self._v0.get(process)
        self._v0[process] = [drafted, emitted, accepted, _iso(ts)]
        if prev is None or drafted < prev[0] or emitted < prev[1] or (accepted or 0) < (prev[2] or 0):
            start, d_draft, d_emit = None, drafted, emitted  # first line or a restart: totals since the start
            d_acc = accepted
        else:
            start, d_draft, d_emit = _from_iso(prev[3]), drafted - prev[0], emitted - prev[1]
            d_acc = accepted - prev[2] if accepted is not None and prev[2] is not None else None
        if d_draft == 0:
            if load is not None:
                self._load_alone(process, load)
            return
        drafts = d_draft / k
        if not drafts <= d_emit <= drafts * (k + 1):
            raise RowFault("Number of emitted tokens", f"{d_emit} emitted in {drafts:g} steps since the previous "
                                                       f"line: each step emits 1 to k + 1 tokens")
        labels = {"v0 accepted tokens (any position)": d_acc} if d_acc is not None else {}
        w = EngineWindow("vllm", "vllm-v0-log", no, ts, start, drafts, float(d_draft), d_emit - drafts, None, k,
                         d_emit / drafts, d_acc / d_draft if d_acc is not None else None, labels)
        self._with_load(w, process, load)
        self._windows.append(w)

    def _example_line(self, no: int, m: re.Match) -> None:
        self._example[m.group(1)] = m.group(2)
        if m.group(1) != "accept":
            return
        example, self._example = self._example, {}
        if "n_drafted" not in example or "n_accept" not in example:
            raise RowFault("n_drafted" if "n_drafted" not in example else "n_accept",
                           "llama.cpp summary 'accept' line without n_drafted and n_accept before it")
        drafted, accepted = count("n_drafted", example["n_drafted"]), count("n_accept", example["n_accept"])
        if accepted > drafted:
            raise RowFault("n_accept", f"{accepted} accepted of {drafted} drafted tokens")
        labels = {key: count(key, example[key]) for key in ("n_draft", "n_predict") if key in example}
        self._windows.append(EngineWindow("llama.cpp", "llama-example", no, None, draft_tokens=float(drafted),
                                          accepted_tokens=float(accepted),
                                          reported_rate=number("accept", example["accept"], percent=True),
                                          labels=labels))


def read(path: str, name: str, now: datetime | None = None) -> tuple[list[EngineWindow], list[Fault]]:
    """Every speculative-decoding and load figure in an engine's text log (plain or gzip; other lines are
    skipped)."""
    windows: list[EngineWindow] = []
    faults: list[Fault] = []
    for batch, batch_faults, _ in read_batches(path, name, now):
        if batch_faults and batch_faults[-1].line == 0:  # unreadable (a corrupt gzip stream): nothing of it
            return [], batch_faults[-1:]
        windows += batch
        faults += batch_faults
    return windows, faults


BATCH_LINES = 100_000  # lines read between two takes of the windows found: a batch's memory, whatever the log's


def read_batches(path: str, name: str, now: datetime | None = None) -> Iterator[Batch]:
    """read's windows and faults, in file order, a batch every BATCH_LINES lines, with the bytes read so far;
    where the file turns unreadable, a last batch of its fault alone (line 0), after the windows of the lines
    before."""
    reader = EngineLogReader(name, now or datetime.now(timezone.utc).replace(tzinfo=None))
    done = 0
    try:
        for no, raw, too_long in textio.lines(path, MAX_ENGINE_LINE_BYTES):
            done += len(raw)
            reader.feed(no, raw.decode("utf-8", "replace"), cut=too_long)
            if no % BATCH_LINES == 0:
                yield *reader.take(), done
    except textio.Unreadable as exc:
        yield [], [Fault(name, 0, "", str(exc))], done
        return
    reader.finish()
    yield *reader.take(), done


def sniff(head: bytes) -> str | None:
    """An engine's speculative-decoding or load line in the first bytes."""
    text = head.decode("utf-8", "replace")
    found = any(p in text for p in KEY_PHRASES) \
        or (SGLANG in text and ("accept len" in text or "gen throughput" in text)) \
        or _EXAMPLE_SNIFF.search(text) is not None
    return FORMATS[0] if found else None


class Reader(WindowReader):
    NOTHING = "no speculative-decoding lines or load lines of vLLM, llama.cpp or SGLang in this log"

    def read(self) -> tuple[list[EngineWindow], list[Fault]]:
        return read(self.job.path, self.job.name, self.job.ingest_time)

    def batches(self) -> Iterator[Batch]:
        return read_batches(self.job.path, self.job.name, self.job.ingest_time)
