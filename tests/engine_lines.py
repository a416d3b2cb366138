"""Engine log lines: vLLM V1's own format string (vllm/v1/spec_decode/metrics.py) with a line builder, and lines as
real users pasted them in public vLLM, llama.cpp and SGLang issues (copied verbatim; their sources are in
tests/data/engines/index.json, where the same lines sit in their files)."""

VLLM_V1 = ("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, Drafted "
           "throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: %s, "
           "Avg Draft acceptance rate: %.1f%%")
VLLM_V1_DEPTH = VLLM_V1.replace("Mean acceptance", "Current speculative depth: %d, Mean acceptance")
PREFIX = "(APIServer pid=4242) INFO 11-29 10:%02d:%02d [metrics.py:86] "


def v1_line(minute: int, second: int, drafts: int, per_pos: list[int], depth: int | None = None) -> str:
    """A V1 line at 10:minute:second for `drafts` drafts whose accepted prefix reached position j per_pos[j] times."""
    k = len(per_pos)
    acc = sum(per_pos)
    rates = ", ".join(f"{a / drafts:.3f}" for a in per_pos)
    args = (1 + acc / drafts, acc / 10, drafts * k / 10, acc, drafts * k, rates, 100 * acc / (drafts * k))
    body = VLLM_V1_DEPTH % ((depth,) + args) if depth else VLLM_V1 % args
    return PREFIX % (minute, second) + body


# Lines as real users pasted them in public vLLM, llama.cpp and SGLang issues (copied verbatim; their sources are
# in tests/data/engines/index.json, where the same lines sit in their files).
REAL_V1_DEPTH_AFTER_MEAN = (
    "(APIServer pid=1) INFO 09-04 11:01:16 [metrics.py:125] SpecDecoding metrics: Mean acceptance length: 6.82, "
    "Current speculative depth: 7, Accepted throughput: 6.46 tokens/s, Drafted throughput: 7.77 tokens/s, Accepted: "
    "256 tokens, Drafted: 308 tokens, Per-position acceptance rate: 1.000, 1.000, 1.000, 1.000, 0.795, 0.614, 0.409, "
    "Avg Draft acceptance rate: 83.1%")

REAL_V1_010 = (
    "(APIServer pid=2236552) INFO 09-09 11:51:35 [metrics.py:96] SpecDecoding metrics: Draft acceptance rate: 88.8%, "
    "Mean acceptance length: 5.44, Accepted throughput: 4.37 tokens/s, Drafted throughput: 4.92 tokens/s, Accepted: "
    "262 tokens, Drafted: 295 tokens, Per-position acceptance rate: 0.983, 0.949, 0.915, 0.881, 0.712")

REAL_V1_09 = (
    "INFO 06-06 14:20:34 [metrics.py:86] SpecDecoding metrics: Draft acceptance rate: 38.8%, Mean acceptance length: "
    "2.16, Accepted: 150 tokens, Drafted: 387 tokens, Per-position acceptance rate: 0.543, 0.357, 0.264")

REAL_V1_08 = ("Speculative metrics: Draft acceptance rate: 1.000, Number of accepted tokens: 66, Number of draft "
              "tokens: 66, ")

REAL_V0 = (
    "INFO 10-16 19:05:47 metrics.py:367] Speculative metrics: Draft acceptance rate: 0.642, System efficiency: 0.598, "
    "Number of speculative tokens: 3, Number of accepted tokens: 8547, Number of draft tokens: 13311, Number of "
    "emitted tokens: 10616.")

REAL_LLAMA_SERVER_3 = [
    "0.06.896.015 I slot print_timing: id  1 | task 0 | draft acceptance = 0.64479 (  167 accepted /   259 generated), "
    "mean acceptance length =  2.92, acceptance rate per position = (0.805, 0.632, 0.483)",
    "0.06.896.057 I statistics     draft-eagle3: #calls(b,g,a) =    1     87     87, #gen drafts =     87, #acc drafts "
    "=    70, #gen tokens =    259, #acc tokens =   167, #mean acc len = 2.92, #acc rate/pos = (0.805, 0.632, 0.483), "
    "dur(b,g,a) = 0.005, 325.555, 0.114 ms"]

REAL_SGLANG_OLD = ("[2025-10-22 10:27:57 TP0] Decode batch. #running-req: 1, #token: 108, token usage: 0.00, "
                   "accept len: 2.17, accept rate: 0.54, cuda graph: True, gen throughput (token/s): 0.39, "
                   "#queue-req: 0, ")

REAL_SGLANG_NEW = ("[2026-09-11 23:47:28 TP0 EP0] Decode batch, #running-req: 1, #full token: 0, "
                   "full token usage: 0.00, #swa token: 0, swa token usage: 0.00, accept len: 3.08, accept rate: 0.41, "
                   "cuda graph: True, gen throughput (token/s): 3.12, #queue-req: 0")

# Load lines as vLLM and SGLang print them, with the speculative lines of the same interval (the same lines sit in
# tests/data/engines/vllm-v1-dp-1.log, vllm-v1-load-1.log, vllm-v0-load-1.log and sglang-load-1.log).
REAL_V1_DP = [
    "(APIServer pid=3617069) INFO 09-01 14:28:09 [loggers.py:123] Engine 000: Avg prompt throughput: 0.4 tokens/s, "
    "Avg generation throughput: 16.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix "
    "cache hit rate: 0.0%",
    "(APIServer pid=3617069) INFO 09-01 14:28:09 [metrics.py:87] SpecDecoding metrics: Draft acceptance rate: 15.5%, "
    "Mean acceptance length: 1.77, Accepted: 17 tokens, Drafted: 110 tokens, Per-position acceptance rate: 0.318, "
    "0.182, 0.091, 0.091, 0.091",
    "(APIServer pid=3617069) INFO 09-01 14:28:09 [loggers.py:123] Engine 001: Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: 15.9 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix "
    "cache hit rate: 0.0%",
    "(APIServer pid=3617069) INFO 09-01 14:28:09 [metrics.py:87] SpecDecoding metrics: Draft acceptance rate: 36.0%, "
    "Mean acceptance length: 2.80, Accepted: 27 tokens, Drafted: 75 tokens, Per-position acceptance rate: 0.533, "
    "0.333, 0.333, 0.333, 0.267"]

REAL_V1_LOAD_ALONE = (
    "(APIServer pid=1) INFO 07-21 12:32:37 [loggers.py:273] Engine 000: Avg prompt throughput: 6400.2 tokens/s, Avg "
    "generation throughput: 0.1 tokens/s, Running: 2 reqs, Waiting: 8 reqs, GPU KV cache usage: 17.2%, Prefix cache "
    "hit rate: 0.0%")

REAL_V0_LOAD = [
    "INFO 07-24 04:00:31 metrics.py:295] Avg prompt throughput: 558.7 tokens/s, Avg generation throughput: 127.4 "
    "tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.8%, CPU KV cache usage: 0.0%.",
    "INFO 07-24 04:00:31 metrics.py:316] Speculative metrics: Draft acceptance rate: 0.000, System efficiency: 0.059, "
    "Number of speculative tokens: 16, Number of accepted tokens: 0, Number of draft tokens tokens: 42272, Number of "
    "emitted tokens tokens: 2642."]

REAL_SGLANG_LOAD = ("[2025-02-27 04:46:39 TP0] Decode batch. #running-req: 8, #token: 62531, token usage: 0.12, "
                    "gen throughput (token/s): 186.64, #queue-req: 0")


# The shape of a real vLLM V1 line (tests/data/engines/vllm-v1-current-1.log), with figures filled in.
WATCHED_V1_LINE = (
    "(APIServer pid=1) INFO 05-21 {h:02d}:{m:02d}:{s:02d} [metrics.py:101] SpecDecoding metrics: Mean acceptance "
    "length: {mean:.2f}, Accepted throughput: 3.87 tokens/s, Drafted throughput: 5.72 tokens/s, Accepted: "
    "{acc} tokens, Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, Avg Draft acceptance "
    "rate: {pct:.1f}%\n")


def watched_v1_line(i: int, drafts: int, per_pos: list[int]) -> tuple[str, int, int]:
    """The i-th V1 line of a log that vLLM writes every 10 seconds from 10:00 (its default interval), for `drafts`
    drafts of k = len(per_pos) whose accepted prefix reached position j per_pos[j] times; returns the line, the
    accepted and the drafted tokens."""
    k = len(per_pos)
    acc, drafted = sum(per_pos), drafts * k
    rates = ", ".join(f"{n / drafts:.3f}" for n in per_pos)
    t = 10 * i
    line = WATCHED_V1_LINE.format(h=10 + t // 3600, m=t // 60 % 60, s=t % 60, mean=1 + acc / drafts, acc=acc,
                                  drafted=drafted, rates=rates, pct=100 * acc / drafted)
    return line, acc, drafted
