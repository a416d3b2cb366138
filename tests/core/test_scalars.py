"""One rule of what an integer and a boolean are, and its SQL form agreeing with it value for value."""
import duckdb
import pytest

from specmon.core import scalars
from specmon.core.faults import RowFault

INTEGERS = {"12": 12, "-3": -3, "+7": 7, " 42\t": 42, "007": 7, "0": 0, "-0": 0, "9" * 18: int("9" * 18),
            str(2 ** 63 - 1): 2 ** 63 - 1, str(-2 ** 63): -2 ** 63, "0" * 25 + "1": 1, "-" + "0" * 30: 0}
NOT_INTEGERS = ["12.7", "12.0", "1e2", "0x10", "1_000", "", " ", "+", "1 2", "٣", "9" * 19, str(2 ** 63),
                str(-2 ** 63 - 1), "1" * 20, "true", "nan", "1.", ".5", "--1", "+-1", "1-", " + 5",
                "1\t2", "\t", "\n4", "0b101", "12\n"]
BOOLEANS = {"true": True, "FALSE": False, " True ": True, "1": True, "0": False}
NOT_BOOLEANS = ["2", "yes", "t", "", "-1", "1.0", "truee", "01"]


@pytest.mark.parametrize("text,value", INTEGERS.items())
def test_integers_are_decimal_digits_with_an_optional_sign(text, value):
    assert scalars.integer(text, "step") == value


@pytest.mark.parametrize("text", NOT_INTEGERS)
def test_anything_else_is_a_fault_naming_the_field(text):
    with pytest.raises(RowFault) as caught:
        scalars.integer(text, "draft_token")
    assert caught.value.field == "draft_token" and scalars.INTEGER_EXPECTED in caught.value.reason


@pytest.mark.parametrize("value", [2.0, 1e2, True, None, [1]])
def test_decoded_values_other_than_int_are_not_integers(value):
    assert not scalars.is_integer(value)
    with pytest.raises(RowFault):
        scalars.integer(value, "accepted")


@pytest.mark.parametrize("text,value", BOOLEANS.items())
def test_booleans(text, value):
    assert scalars.boolean(text, "accepted") is value


@pytest.mark.parametrize("text", [*NOT_BOOLEANS, 2, 1.0, None])
def test_not_booleans(text):
    with pytest.raises(RowFault):
        scalars.boolean(text, "accepted")


def test_the_sql_form_agrees_with_the_python_one_on_every_value():
    texts = [*INTEGERS, *NOT_INTEGERS, *BOOLEANS, *NOT_BOOLEANS]
    rows = duckdb.connect().execute(
        f"SELECT t, {scalars.integer_sql('t')}, {scalars.boolean_sql('t')} FROM unnest(?::VARCHAR[]) u(t)",
        [texts]).fetchall()
    for text, as_integer, as_boolean in rows:
        assert as_integer == _or_none(scalars.integer, text), text
        assert as_boolean == _or_none(scalars.boolean, text), text


def test_the_sql_form_reads_typed_columns_by_their_text():
    con = duckdb.connect()
    assert con.execute(f"SELECT {scalars.integer_sql('12.0::DOUBLE')}, {scalars.integer_sql('12::DECIMAL(9, 0)')}, "
                       f"{scalars.integer_sql('12::HUGEINT')}").fetchall() == [(None, 12, 12)]
    assert con.execute(f"SELECT {scalars.boolean_sql('1::INTEGER')}, {scalars.boolean_sql('2::INTEGER')}, "
                       f"{scalars.boolean_sql('false')}").fetchall() == [(True, None, False)]


def _or_none(parse, text):
    try:
        return parse(text, "x")
    except RowFault:
        return None
