"""What an integer and a boolean are, in every input format: one rule, for Python values (JSON, decoded) and as SQL
(the flat form's CSV and Parquet columns and the step log's fast path, read by DuckDB).

An integer is written as decimal digits with an optional sign, spaces or tabs around them ignored ("12", "-3",
"+7"): never 12.7, 12.0, 1e2, 0x10 or 1_000, whatever the value's type. A value is judged by the way the file
writes it: in JSON a number written so (a JSON 2.0 or 1e2 is a float, refused; a string is refused, since JSON has
numbers); in CSV a cell so written; in Parquet an integer column, or a column of another type whose values' text is
so written (a DOUBLE column's 12.0 is refused, a DECIMAL(9, 0) column's 12 is not). It must fit in 64 bits (a
BIGINT; more than 19 digits are refused before anything is converted).

A boolean is true or false in any case, or 1 or 0 (a CSV cell, the text of a Parquet column, a Parquet integer
column); 2, yes, t or an empty cell are not.
"""
from __future__ import annotations

import re

from specmon.core.faults import RowFault

MAX_DIGITS = 19
_LEAST, _GREATEST = -(2 ** 63), 2 ** 63 - 1
INTEGER_EXPECTED = "an integer (decimal digits, with an optional sign)"
BOOLEAN_EXPECTED = "true or false (or 1 or 0)"
_BLANKS = " \t"
_INTEGER_TEXT = f"[{_BLANKS}]*[+-]?[0-9]{{1,{MAX_DIGITS}}}[{_BLANKS}]*"  # the same pattern in Python's re and RE2
_INTEGER = re.compile(_INTEGER_TEXT)
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def is_integer(value: object) -> bool:
    """A decoded JSON value that is an integer: an int (not a bool, not a float, however integral)."""
    return type(value) is int


def integer(value: object, field: str) -> int:
    """An integer from a decoded value (JSON's int) or a text cell; RowFault naming the field otherwise."""
    if is_integer(value):
        return value  # type: ignore[return-value]
    if isinstance(value, str) and _INTEGER.fullmatch(value) and _LEAST <= (n := int(value.strip(_BLANKS))) <= _GREATEST:
        return n
    raise RowFault(field, f"expected {INTEGER_EXPECTED}, got {_shown(value)}")


def boolean(value: object, field: str) -> bool:
    """A boolean from a decoded value (JSON's true or false, an integer 0 or 1) or a text cell; RowFault naming the
    field otherwise."""
    if type(value) is bool:
        return value
    if is_integer(value) and value in (0, 1):
        return value == 1
    if isinstance(value, str) and (found := _BOOLEANS.get(value.strip(_BLANKS).lower())) is not None:
        return found
    raise RowFault(field, f"expected {BOOLEAN_EXPECTED}, got {_shown(value)}")


def _shown(value: object) -> str:
    return repr(value)[:40]


def integer_sql(expr: str) -> str:
    """DuckDB SQL: the BIGINT the value of `expr` (any type) is by the rule above, else NULL."""
    text = f"CAST({expr} AS VARCHAR)"
    return (f"CASE WHEN regexp_full_match({text}, '{_INTEGER_TEXT}') "
            f"THEN TRY_CAST(trim({text}, '{_BLANKS}') AS BIGINT) END")  # NULL beyond 64 bits


def boolean_sql(expr: str) -> str:
    """DuckDB SQL: the BOOLEAN the value of `expr` (any type) is by the rule above, else NULL."""
    cases = " ".join(f"WHEN '{text}' THEN {str(value).lower()}" for text, value in _BOOLEANS.items())
    return f"CASE lower(trim(CAST({expr} AS VARCHAR), '{_BLANKS}')) {cases} END"
