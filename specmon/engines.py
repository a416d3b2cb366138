"""Readers for what serving engines already print: vLLM, llama.cpp and SGLang log lines and per-request JSON
(formats verbatim in shared/spec/formats.md §2).

Each reader turns the engine's figures into EngineWindow records of counts, converted with care:
- vLLM V1 prints, per interval, accepted and drafted tokens and the per-position rate accepted_at_i / drafts
  (cumulative). drafts = drafted / k with k = the length of that list; the per-position counts are rate * drafts.
- vLLM V0 prints running totals since start: windows are differences of consecutive lines (a fall is a restart).
- llama.cpp's "accept" and vLLM's "Avg Draft acceptance rate" are accepted / drafted (unchecked tokens count as
  failures); they are kept as reported_rate, never taken for per-token acceptance.
- SGLang's accept len includes the bonus token (it is tokens per step, L) and its accept rate divides by the
  number of draft tokens including the bonus; both are gauges, kept as reported.
A line that carries one of these key phrases but does not parse is a fault with its line number; other lines
(the rest of a server log) are skipped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone


from specmon import jsonlines
from specmon.faults import Fault

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan)"
_VLLM_TS = re.compile(r"(?:^|\s)[A-Z]+ (\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
_ISO_TS = re.compile(r"\[?(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})")
_VLLM_V1 = re.compile(
    r"SpecDecoding metrics: (?:Current speculative depth: (\d+), )?Mean acceptance length: " + _NUM
    + r", Accepted throughput: " + _NUM + r" tokens/s, Drafted throughput: " + _NUM + r" tokens/s, Accepted: (\d+) "
    r"tokens, Drafted: (\d+) tokens, Per-position acceptance rate: (.*?), Avg Draft acceptance rate: " + _NUM + "%")
_VLLM_V1_EARLY = re.compile(r"SpecDecoding metrics: Draft acceptance rate: " + _NUM + r"%, Accepted: (\d+) tokens, "
                            r"Drafted: (\d+) tokens")
_VLLM_V0 = re.compile(
    r"Speculative metrics: Draft acceptance rate: " + _NUM + r", System efficiency: " + _NUM + r", Number of "
    r"speculative tokens: (\d+), Number of accepted tokens: (\d+), Number of draft tokens: (\d+), Number of "
    r"emitted tokens: (\d+)")
_LLAMA_SERVER = re.compile(
    r"draft acceptance(?: rate)? = " + _NUM + r" \(\s*(\d+) accepted /\s*(\d+) generated\)"
    r"(?:, mean acceptance length =\s*" + _NUM + r", acceptance rate per position = \((.*?)\)"
    r"|, mean len =\s*" + _NUM + r")?")
_LLAMA_PER_POS = re.compile(r"acc per pos = \((.*?)\)")
_LLAMA_EXAMPLE = re.compile(r"^\s*(n_draft|n_predict|n_drafted|n_accept|accept)\s*=\s*" + _NUM + r"%?\s*$")
_SGLANG = re.compile(r"Decode batch[.,].*?accept len: " + _NUM + r"(?:, accept rate: " + _NUM + r")?")
_KEY_PHRASES = ("SpecDecoding metrics", "Speculative metrics:", "draft acceptance", "acc per pos")


@dataclass
class EngineWindow:
    engine: str  # vllm, llama.cpp or sglang
    source: str  # which of the engine's outputs
    line: int
    end_ts: datetime | None  # None: the log gave no time (the ingest time is used)
    start_ts: datetime | None = None
    drafts: float | None = None  # verification steps that drafted
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    accepted_per_position: list[float] | None = None  # drafts whose accepted prefix reached position i (1..k)
    k: int | None = None
    mean_acceptance_length: float | None = None  # as reported (tokens per step, bonus included)
    reported_rate: float | None = None  # the engine's own rate, as a fraction, in its own definition
    labels: dict = field(default_factory=dict)


def _floats(text: str) -> list[float]:
    return [float(x) for x in re.findall(_NUM, text)]


def _f(x: str | None) -> float | None:
    return None if x is None or x == "nan" else float(x)


class _Timestamps:
    """vLLM prints month-day without a year: the year is the ingest's, one less where that lands in the future."""

    def __init__(self, now: datetime):
        self.now = now

    def parse(self, line: str) -> datetime | None:
        m = _ISO_TS.search(line)
        if m:
            return datetime.fromisoformat(m.group(1).replace("T", " "))
        m = _VLLM_TS.search(line)
        if not m:
            return None
        ts = datetime.strptime(f"{self.now.year}-{m.group(1)}", "%Y-%m-%d %H:%M:%S")
        return ts.replace(year=ts.year - 1) if ts > self.now else ts


_PROCESS = re.compile(r"\(([^()]*\bpid=\d+)\)")  # vLLM's "(APIServer pid=N) " / "(EngineCore_0 pid=N) " prefix


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts else None


def _from_iso(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _window_state(w: EngineWindow) -> dict:
    d = dict(w.__dict__)
    d["end_ts"], d["start_ts"] = _iso(w.end_ts), _iso(w.start_ts)
    return d


def _window_from_state(d: dict) -> EngineWindow:
    return EngineWindow(**{**d, "end_ts": _from_iso(d["end_ts"]), "start_ts": _from_iso(d["start_ts"])})


class EngineLogReader:
    """Reads an engine's text log one complete line at a time; can stop after any line and resume later.

    What must survive between reads is in state(): vLLM V0's last running totals per process, the time of each
    process's last V1 line (the next window's start), the llama.cpp example's n_* fields seen so far, and a
    llama-server window that may still get its "acc per pos" line. A window waiting for that line is released by
    the next line of any other kind, or by finish() at the end of a file.
    """

    def __init__(self, name: str, now: datetime, state: dict | None = None) -> None:
        self.name = name
        self._stamps = _Timestamps(now)
        state = state or {}
        self._v0: dict[str, list] = {p: list(v) for p, v in state.get("v0", {}).items()}
        self._v1_last: dict[str, str] = dict(state.get("v1_last", {}))
        self._example: dict[str, float] = dict(state.get("example", {}))
        pending = state.get("pending")
        self._pending: EngineWindow | None = _window_from_state(pending) if pending else None
        self._windows: list[EngineWindow] = []
        self._faults: list[Fault] = []

    def state(self) -> dict:
        """A JSON-serialisable carry-over: EngineLogReader(name, now, state=r.state()) continues where r stopped."""
        return {"v0": {p: list(v) for p, v in self._v0.items()}, "v1_last": dict(self._v1_last),
                "example": dict(self._example),
                "pending": _window_state(self._pending) if self._pending else None}

    def take(self) -> tuple[list[EngineWindow], list[Fault]]:
        """The windows and faults found since the last take (a window still waiting for a line is kept back)."""
        windows, faults = self._windows, self._faults
        self._windows, self._faults = [], []
        return windows, faults

    def finish(self) -> None:
        """The file ends here: release a window that was waiting for a following line."""
        self._release()

    def _release(self) -> None:
        if self._pending is not None:
            self._windows.append(self._pending)
            self._pending = None

    def _fault(self, no: int, reason: str) -> None:
        self._faults.append(Fault(self.name, no, "", reason))

    def feed(self, line_no: int, line: str) -> None:
        """Read one complete line (with or without its newline)."""
        no = line_no
        if "acc per pos" in line:
            m = _LLAMA_PER_POS.search(line)
            w = self._pending
            self._pending = None
            if not m or w is None or w.drafts is None:
                if w is not None:
                    self._windows.append(w)
                self._fault(no, "'acc per pos' line without a llama-server line before it")
                return
            w.accepted_per_position = [r * w.drafts for r in _floats(m.group(1))]
            w.k = len(w.accepted_per_position)
            self._windows.append(w)
            return
        self._release()
        ts = self._stamps.parse(line)
        m = _PROCESS.search(line)
        process = m.group(1) if m else ""
        if "SpecDecoding metrics:" in line:
            w = _vllm_v1(line, no, ts)
            if w is None:
                self._fault(no, "looks like a vLLM 'SpecDecoding metrics' line but does not parse")
                return
            w.start_ts = _from_iso(self._v1_last.get(process))
            if ts:
                self._v1_last[process] = ts.isoformat()
            self._windows.append(w)
        elif "Speculative metrics:" in line:
            m = _VLLM_V0.search(line)
            if not m:
                self._fault(no, "looks like a vLLM V0 'Speculative metrics' line but does not parse")
                return
            k, acc, drafted, emitted = (int(m.group(i)) for i in (3, 4, 5, 6))
            prev = self._v0.get(process)
            self._v0[process] = [acc, drafted, emitted, _iso(ts)]
            if prev is None or drafted < prev[1] or acc < prev[0]:
                continue_from = None  # first line, or the server restarted: these totals count from its start
                d_acc, d_draft, d_emit = acc, drafted, emitted
            else:
                continue_from = _from_iso(prev[3])
                d_acc, d_draft, d_emit = acc - prev[0], drafted - prev[1], emitted - prev[2]
            if d_draft == 0 or k == 0:
                return
            drafts = d_draft / k
            self._windows.append(EngineWindow("vllm", "vllm-v0-log", no, ts, continue_from, drafts, d_draft, d_acc,
                                              None, k, d_emit / drafts, d_acc / d_draft))
        elif "draft acceptance" in line:
            m = _LLAMA_SERVER.search(line)
            if not m:
                self._fault(no, "looks like a llama-server 'draft acceptance' line but does not parse")
                return
            self._pending = _llama_server(m, no, ts)
        elif "Decode batch" in line and "accept len" in line:
            m = _SGLANG.search(line)
            if not m:
                self._fault(no, "looks like an SGLang 'Decode batch' line but does not parse")
                return
            self._windows.append(EngineWindow("sglang", "sglang-log", no, ts, mean_acceptance_length=_f(m.group(1)),
                                              reported_rate=_f(m.group(2))))
        else:
            m = _LLAMA_EXAMPLE.match(line)
            if not m:
                return
            self._example[m.group(1)] = float(m.group(2))
            if m.group(1) != "accept":
                return
            example, self._example = self._example, {}
            if "n_drafted" not in example or "n_accept" not in example:
                self._fault(no, "llama.cpp summary 'accept' line without n_drafted and n_accept before it")
                return
            self._windows.append(EngineWindow(
                "llama.cpp", "llama-example", no, ts, draft_tokens=example["n_drafted"],
                accepted_tokens=example["n_accept"], k=int(example.get("n_draft", 0)) or None,
                reported_rate=example["accept"] / 100))


def read_log(path: str, name: str, now: datetime | None = None) -> tuple[list[EngineWindow], list[Fault]]:
    """Every speculative-decoding figure in an engine's text log (other lines are skipped)."""
    reader = EngineLogReader(name, now or datetime.now(timezone.utc).replace(tzinfo=None))
    with open(path, encoding="utf-8", errors="replace") as fh:
        for no, line in enumerate(fh, start=1):
            reader.feed(no, line)
    reader.finish()
    return reader.take()


def _vllm_v1(line: str, no: int, ts: datetime | None) -> EngineWindow | None:
    m = _VLLM_V1.search(line)
    if m:
        depth, mean_len, _, _, acc, drafted, per_pos, rate = m.groups()
        rates = _floats(per_pos)
        k = len(rates) or (int(depth) if depth else None)
        drafts = int(drafted) / k if k else None
        return EngineWindow("vllm", "vllm-v1-log", no, ts, None, drafts, int(drafted), int(acc),
                            [r * drafts for r in rates] if drafts else None, k, _f(mean_len),
                            (_f(rate) or 0) / 100 if rate != "nan" else None)
    m = _VLLM_V1_EARLY.search(line)
    if m:
        rate, acc, drafted = m.groups()
        return EngineWindow("vllm", "vllm-v1-early-log", no, ts, draft_tokens=int(drafted), accepted_tokens=int(acc),
                            reported_rate=_f(rate) / 100 if _f(rate) is not None else None)
    return None


def _llama_server(m: re.Match, no: int, ts: datetime | None) -> EngineWindow:
    rate, acc, generated, mean_len, per_pos, mean_len_short = m.groups()
    length = _f(mean_len) if mean_len is not None else _f(mean_len_short)
    acc_i = int(acc)
    drafts = acc_i / (length - 1) if length and length > 1 else None
    w = EngineWindow("llama.cpp", "llama-server", no, ts, None, drafts, int(generated), acc_i, None, None, length,
                     _f(rate))
    if per_pos is not None and drafts is not None:
        w.accepted_per_position = [r * drafts for r in _floats(per_pos)]
        w.k = len(w.accepted_per_position)
    return w


def read_json_responses(path: str, name: str) -> tuple[list[EngineWindow], list[Fault]]:
    """vLLM responses with metrics.speculative_decoding, or llama-server responses with timings, one per line."""
    windows, faults = [], []
    for no, obj, fault in jsonlines.objects(path, name):
        if fault:
            faults.append(fault)
            continue
        ts = None
        if isinstance(obj.get("created"), (int, float)):
            ts = datetime.fromtimestamp(obj["created"], tz=timezone.utc).replace(tzinfo=None)
        labels = {"request_id": str(obj["id"])} if "id" in obj else {}
        if "model" in obj:
            labels["model"] = str(obj["model"])
        spec = (obj.get("metrics") or {}).get("speculative_decoding") if isinstance(obj.get("metrics"), dict) \
            else obj.get("speculative_decoding")
        try:
            if spec is not None:
                windows.append(_vllm_request(spec, no, ts, labels))
            elif isinstance(obj.get("timings"), dict):
                t = obj["timings"]
                if "draft_n" in t:  # absent, not 0, when nothing was drafted
                    windows.append(EngineWindow("llama.cpp", "llama-timings", no, ts,
                                                draft_tokens=int(t["draft_n"]),
                                                accepted_tokens=int(t.get("draft_n_accepted", 0)), labels=labels))
            else:
                faults.append(Fault(name, no, "", "neither metrics.speculative_decoding (vLLM) nor timings "
                                                  "(llama-server) in this response"))
        except (KeyError, TypeError, ValueError) as exc:
            faults.append(Fault(name, no, "speculative_decoding" if spec is not None else "timings",
                                f"unexpected content ({exc!r})"))
    return windows, faults


def _vllm_request(spec: dict, no: int, ts: datetime | None, labels: dict) -> EngineWindow:
    steps = int(spec["num_spec_steps"])
    k = int(spec["num_spec_tokens"]) if spec.get("num_spec_tokens") is not None else None
    per_pos = None
    if spec.get("per_step_accepted") is not None:
        accepted = [int(x) for x in spec["per_step_accepted"]]
        per_pos = [float(sum(a >= i for a in accepted)) for i in range(1, (k or max(accepted, default=0)) + 1)]
    elif spec.get("acceptance_histogram") is not None:
        hist = [float(x) for x in spec["acceptance_histogram"]]  # hist[n]: steps that accepted exactly n
        per_pos = [sum(hist[i:]) for i in range(1, len(hist))]
    return EngineWindow("vllm", "vllm-request", no, ts, None, steps, float(spec["num_draft_tokens"]),
                        float(spec["num_accepted_draft_tokens"]), per_pos, k or (len(per_pos) if per_pos else None),
                        float(spec["mean_acceptance_length"]) if spec.get("mean_acceptance_length") is not None
                        else None, spec.get("draft_acceptance_rate"), labels)


def sniff(head: bytes) -> str | None:
    """'engine-log' or 'engine-json' when the first bytes look like an engine's output, else None."""
    text = head.decode("utf-8", "replace")
    first = text.lstrip()[:1]
    if first == "{":
        line = text.lstrip().split("\n", 1)[0]
        return "engine-json" if ("speculative_decoding" in line or '"timings"' in line) else None
    if any(p in text for p in _KEY_PHRASES) or ("Decode batch" in text and "accept len" in text) \
            or re.search(r"^\s*n_drafted\s*=", text, re.M):
        return "engine-log"
    return None
