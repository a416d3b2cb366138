"""Bounds on every size that input controls, checked before anything is allocated (one place for all readers).

Each bound is far above what real engines and step logs use and low enough that no file can make specmon
allocate without limit: a count that sizes a list is checked against its bound before the list is built.
"""
from __future__ import annotations

# Draft positions of one step: the store keeps a position as SMALLINT.
MAX_DRAFT_LEN = 32767
# Token ids are INTEGER in the store (vocabularies are far smaller).
MAX_TOKEN_ID = 2 ** 31 - 1
# Draft length (k) an engine may report; per-position lists of engine windows are at most this long. Real
# configurations draft at most a few dozen tokens (EAGLE trees up to 64); 512 leaves room without letting a
# 200-byte response claim millions of positions.
MAX_ENGINE_K = 512
# A count read from a file must be exact in a DOUBLE column (2^53) and in BIGINT.
MAX_COUNT = 2 ** 53
# One line of an engine's text log (a vLLM line with 512 positions is under 4 KiB).
MAX_ENGINE_LINE_BYTES = 1 << 16
# One line of a step log or of an engine's JSON responses (a step with dense distributions belongs in Parquet).
MAX_JSON_LINE_BYTES = 1 << 25
